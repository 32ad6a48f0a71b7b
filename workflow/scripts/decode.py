"""Decode a split's images with a run's model under each decoding setting
(distinctcap.evaluate.decode):
one job per run, one output per (split, decoding) in the rule's order."""

import torch

from distinctcap.core import logs
from distinctcap.core.devices import job_device
from distinctcap.evaluate.decode import decode_run

logs.setup(snakemake.log[0])
device = str(job_device(snakemake.params.device, snakemake.resources.get("gpu", 0)))
torch.set_num_threads(snakemake.threads)
outputs = snakemake.output.generated
for (split, _, setting), out in zip(snakemake.params.decodes, outputs, strict=True):
    decode_run(
        snakemake.input.model,
        snakemake.input.features,
        snakemake.input.images,
        snakemake.input.vocab,
        out,
        run=snakemake.wildcards.run,
        split=split,
        setting=setting,
        seed=snakemake.params.seed,
        device=device,
    )
