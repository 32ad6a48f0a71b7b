"""Rule retrieval_entropy: UNKT eq. 3 for every train caption over every train image."""

import torch

from distinctcap.core import logs
from distinctcap.core.devices import job_device
from distinctcap.core.io import read_table, write_table
from distinctcap.features.entropy import score_captions

logs.setup(snakemake.log[0])
device = str(job_device(snakemake.params.device, snakemake.resources.get("gpu", 0)))
torch.set_num_threads(snakemake.threads)
scores = score_captions(
    snakemake.input.index,
    read_table(snakemake.input.captions, "captions"),
    logit_scale=snakemake.params.logit_scale,
    chunk=snakemake.params.chunk,
    text_chunk=snakemake.params.text_chunk,
    device=device,
)
write_table(scores, snakemake.output.scores)
