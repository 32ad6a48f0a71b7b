"""Rule summarize: results/metrics/summary.csv, one row per (run, split, decoding)."""

from distinctcap import logs
from distinctcap.evaluate import read_metrics
from distinctcap.report.summary import write_summary

logs.setup(snakemake.log[0])
write_summary(read_metrics(list(snakemake.input.metrics)), snakemake.output.summary)
