"""Neighbours stage: each training image's top-pct most similar training images by CLIP image
embedding, the contrastive images of the specificity method (specificity paper §3.2)."""

from distinctcap.core.jobs import start_job
from distinctcap.features.neighbours import build_table

device = start_job(snakemake, threads="unchanged")
build_table(
    snakemake.input.features,
    snakemake.input.images,
    snakemake.output.table,
    pct=float(snakemake.wildcards.pct),
    device=device,
)
