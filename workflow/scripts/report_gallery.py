"""Rule report_gallery: test images with every run's captions side by side (HTML cards), and the
README's showcase, each run's best scene-scored caption (distinctcap.report.gallery)."""

from distinctcap.core import logs
from distinctcap.core.io import read_table
from distinctcap.report.gallery import write_gallery, write_showcase

logs.setup(snakemake.log[0])
images = read_table(snakemake.input.images)
write_gallery(
    images,
    read_table(snakemake.input.captions),
    list(snakemake.input.generated),
    snakemake.params.split,
    snakemake.output.html,
    count=snakemake.params.images,
    runs=snakemake.params.runs,
    decoding=snakemake.params.decoding,
)
write_showcase(
    images,
    list(snakemake.input.generated),
    snakemake.output.showcase,
    runs=snakemake.params.runs,
    decoding=snakemake.params.decoding,
)
