"""Rule evaluate: every metric of one run's captions under each decoding setting and split, on
the job's CPU cores; the torch part comes from the run's evaluate_gpu job."""

from distinctcap.core import logs
from distinctcap.evaluate.stage import evaluate_stage

logs.setup(snakemake.log[0])
inputs = dict(snakemake.input.items())
for name in ("generated", "device", "per_image"):
    inputs[name] = list(getattr(snakemake.input, name))
evaluate_stage(
    inputs,
    {name: list(getattr(snakemake.output, name)) for name in ("metrics", "curve")},
    evaluations=snakemake.params.evaluations,
    block=snakemake.params.settings,
    seed=snakemake.params.seed,
    workers=snakemake.threads,
    cache_dir=snakemake.params.cache,
)
