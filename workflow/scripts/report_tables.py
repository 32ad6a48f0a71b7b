"""Rule report_tables: our rows in the papers' table layouts beside their published numbers."""

from distinctcap.core import logs
from distinctcap.report.summary import pooled_metrics, read_metrics
from distinctcap.report.tables import write_tables

logs.setup(snakemake.log[0])
write_tables(
    pooled_metrics(read_metrics(list(snakemake.input.metrics)), snakemake.params.seed_of),
    snakemake.params.source,
    snakemake.output.markdown,
    snakemake.output.html,
    reference=snakemake.params.reference,
    tex_path=snakemake.output.latex,
    csv_path=snakemake.output.csv,
)
