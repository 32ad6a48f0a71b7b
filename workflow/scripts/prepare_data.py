from distinctcap.core import logs
from distinctcap.data.prepare import prepare

logs.setup(snakemake.log[0])
prepare(snakemake.params.data, snakemake.params.on_bad_input, dict(snakemake.output))
