"""Rule report_plots: training curves, metric bars per run and the CIDEr-vs-n curve."""

from pathlib import Path

import pandas as pd

from distinctcap.core import logs
from distinctcap.report.plots import plot_cider_vs_n, plot_metric_bars, plot_training_curves
from distinctcap.report.summary import read_metrics
from distinctcap.report.verdicts import methods_first

logs.setup(snakemake.log[0])
curves = {Path(p).parent.name: p for p in snakemake.input.training}
plot_training_curves(curves, snakemake.output.training)
versus = pd.read_csv(snakemake.input.versus[0]) if snakemake.input.versus else None
plot_metric_bars(read_metrics(list(snakemake.input.metrics)), snakemake.output.bars,
                 order=methods_first(snakemake.params.runs), versus=versus,
                 seed_of=snakemake.params.seed_of)
plot_cider_vs_n(list(snakemake.input.cider), snakemake.output.cider)
