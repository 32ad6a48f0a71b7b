"""Rule evaluate: every metric of one run's captions under one decoding setting of a split."""

import torch

from distinctcap import logs
from distinctcap.devices import job_device
from distinctcap.evaluate import evaluate_stage

logs.setup(snakemake.log[0])
device = str(job_device(snakemake.params.device, snakemake.resources.get("gpu", 0)))
torch.set_num_threads(snakemake.threads)
evaluate_stage(
    dict(snakemake.input.items()),
    dict(snakemake.output.items()),
    split=snakemake.wildcards.split,
    decoding=snakemake.wildcards.decoding,
    block=snakemake.params.settings,
    seed=snakemake.params.seed,
    device=device,
)
