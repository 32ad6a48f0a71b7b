"""Rule retrieval_entropy: UNKT eq. 3 for every train caption over every train image."""

from distinctcap.core.io import read_table, write_table
from distinctcap.core.jobs import start_job
from distinctcap.features.entropy import score_captions

device = start_job(snakemake, threads="all")
scores = score_captions(
    snakemake.input.index,
    read_table(snakemake.input.captions, "captions", ["caption_id", "image_id", "split"]),
    logit_scale=snakemake.params.logit_scale,
    chunk=snakemake.params.chunk,
    text_chunk=snakemake.params.text_chunk,
    device=device,
)
write_table(scores, snakemake.output.scores)
