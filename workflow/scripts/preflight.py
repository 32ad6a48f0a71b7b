"""Rule preflight: every check that applies on this node (distinctcap.runs.preflight)."""

from distinctcap.config.check import load_schema, validate
from distinctcap.core import logs
from distinctcap.runs.preflight import run_preflight

logs.setup(snakemake.log[0])
run_preflight(
    validate(snakemake.config, load_schema()),
    snakemake.output.report,
    gpus=int(snakemake.resources.get("gpu", 0) or 0),
    cpus=int(snakemake.resources.get("cpus_per_task", 0) or snakemake.threads),
)
