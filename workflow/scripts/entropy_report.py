"""Rule entropy_report: histogram with the split threshold + highest/lowest-entropy captions."""

from pathlib import Path

from distinctcap.core import logs
from distinctcap.core.io import atomic_path
from distinctcap.features.subsets import extremes_markdown, plot_histogram, read_split

logs.setup(snakemake.log[0])
table = read_split(snakemake.input.table)
plot_histogram(table, snakemake.output.histogram)
text = extremes_markdown(table, snakemake.input.captions, snakemake.params.top)
with atomic_path(snakemake.output.extremes) as tmp:
    Path(tmp).write_text(text)
