"""Rule run_card: results/runs/{run}/run.json and its vocabulary copy (distinctcap.core.runcard),
with the familiarity threshold calibrated on the validation images (distinctcap.runs.calibrate)."""

from pathlib import Path

from distinctcap.core import logs
from distinctcap.core.runcard import write_run_card
from distinctcap.runs.calibrate import calibrate

logs.setup(snakemake.log[0])
write_run_card(
    Path(snakemake.output.card).parent,
    snakemake.wildcards.run,
    snakemake.params.run,
    snakemake.params.decoding,
    snakemake.input.vocab,
    snakemake.input.features,
    snakemake.params.clip,
    familiarity=calibrate(snakemake.input.features, snakemake.input.images),
)
