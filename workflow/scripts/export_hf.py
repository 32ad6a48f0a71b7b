"""Rule export_hf: a transformers run's model.pt as a folder transformers loads."""

from distinctcap.captioner.load import export_run
from distinctcap.core import logs

logs.setup(snakemake.log[0])
export_run(snakemake.input.model, snakemake.output[0])
