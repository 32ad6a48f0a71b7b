"""Rule report_gallery: test images with every run's captions side by side (HTML cards)."""

from distinctcap.core import logs
from distinctcap.core.io import read_table
from distinctcap.report.gallery import write_gallery

logs.setup(snakemake.log[0])
write_gallery(
    read_table(snakemake.input.images),
    read_table(snakemake.input.captions),
    list(snakemake.input.generated),
    snakemake.params.split,
    snakemake.output.html,
    count=snakemake.params.images,
    runs=snakemake.params.runs,
)
