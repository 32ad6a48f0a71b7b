"""Decode a split's images with a run's model under one decoding setting (distinctcap.decode)."""

import torch

from distinctcap import logs
from distinctcap.decode import decode_run

logs.setup(snakemake.log[0])
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
    device=snakemake.params.device,
)
