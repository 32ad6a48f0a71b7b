"""Rule export_hf: a transformers run's model.pt as a folder transformers loads."""

from distinctcap import logs
from distinctcap.hf_captioner import export_run

logs.setup(snakemake.log[0])
export_run(snakemake.input.model, snakemake.output[0])
