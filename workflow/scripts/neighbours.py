"""Neighbours stage: each training image's top-pct most similar training images by CLIP image
embedding, the contrastive images of the specificity method (specificity paper §3.2)."""

from distinctcap.core import logs
from distinctcap.core.devices import job_device
from distinctcap.features.neighbours import build_table

logs.setup(snakemake.log[0])
device = str(job_device(snakemake.params.device, snakemake.resources.get("gpu", 0)))
build_table(
    snakemake.input.features,
    snakemake.input.images,
    snakemake.output.table,
    pct=float(snakemake.wildcards.pct),
    device=device,
)
