"""Rule report_plots: training curves, metric bars per run and the CIDEr-vs-n curve."""

from pathlib import Path

from distinctcap.core import logs
from distinctcap.report.plots import plot_cider_vs_n, plot_metric_bars, plot_training_curves
from distinctcap.report.summary import read_metrics

logs.setup(snakemake.log[0])
curves = {Path(p).parent.name: p for p in snakemake.input.training}
plot_training_curves(curves, snakemake.output.training)
plot_metric_bars(read_metrics(list(snakemake.input.metrics)), snakemake.output.bars)
plot_cider_vs_n(list(snakemake.input.cider), snakemake.output.cider)
