"""Rule summarize: results/metrics/summary.csv, one row per (run, seed, split, decoding),
summary_seeds.csv (each run's mean and sd over its seeds) and the headline table (the README's)
as csv, markdown and LaTeX."""

from pathlib import Path

from distinctcap.core import logs
from distinctcap.report.summary import read_metrics, write_headline, write_summary

logs.setup(snakemake.log[0])
out = snakemake.output
summary = write_summary(
    read_metrics(list(snakemake.input.metrics)), out.summary, snakemake.params.seed_of, out.seeds
)
write_headline(
    summary, snakemake.params.runs, Path(out.headline_csv), Path(out.headline_md),
    Path(out.headline_tex),
)
