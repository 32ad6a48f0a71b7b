"""Rule retrieval_entropy: UNKT eq. 3 for every train caption over every train image."""

import torch

from distinctcap import logs
from distinctcap.devices import job_device
from distinctcap.entropy import score_captions
from distinctcap.io import read_table, write_table

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
