"""Rule summarize: results/metrics/summary.csv, one row per (run, split, decoding), and the
headline table (the README's) as csv, markdown and LaTeX."""

from pathlib import Path

from distinctcap.core import logs
from distinctcap.report.summary import read_metrics, write_headline, write_summary

logs.setup(snakemake.log[0])
summary = write_summary(read_metrics(list(snakemake.input.metrics)), snakemake.output.summary)
out = snakemake.output
write_headline(
    summary, snakemake.params.runs, Path(out.headline_csv), Path(out.headline_md),
    Path(out.headline_tex),
)
