"""Decode a split's images with a run's model under one decoding setting (distinctcap.decode)."""

import torch

from distinctcap import logs
from distinctcap.decode import decode_run
from distinctcap.devices import job_device

logs.setup(snakemake.log[0])
device = str(job_device(snakemake.params.device, snakemake.resources.get("gpu", 0)))
torch.set_num_threads(snakemake.threads)
decode_run(
    snakemake.input.model,
    snakemake.input.features,
    snakemake.input.images,
    snakemake.input.vocab,
    snakemake.output.generated,
    run=snakemake.wildcards.run,
    split=snakemake.wildcards.split,
    setting=snakemake.params.setting,
    seed=snakemake.params.seed,
    device=device,
)
