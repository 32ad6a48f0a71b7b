"""Rule report_times: the per-rule table of the benchmark files (distinctcap.report.times)."""

from distinctcap.core import logs
from distinctcap.report.times import write_times

logs.setup(snakemake.log[0])
write_times(snakemake.params.benchmarks, snakemake.output.markdown, snakemake.output.csv)
