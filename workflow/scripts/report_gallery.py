"""Rule report_gallery: test images with every run's captions side by side (HTML cards), and the
README's showcase, each run's best scene-scored caption (distinctcap.report.gallery)."""

from distinctcap.core import logs
from distinctcap.report.gallery import gallery_stage

logs.setup(snakemake.log[0])
gallery_stage(
    snakemake.input.images,
    snakemake.input.captions,
    list(snakemake.input.generated),
    snakemake.params.split,
    snakemake.output.html,
    snakemake.output.showcase,
    count=snakemake.params.images,
    runs=snakemake.params.runs,
    decoding=snakemake.params.decoding,
)
