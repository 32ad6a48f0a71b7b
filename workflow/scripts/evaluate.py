"""Rule evaluate: every metric of one run's captions under each decoding setting and split, on
the job's CPU cores; the torch part comes from the run's evaluate_gpu job where there is one,
else it is computed here first."""

from distinctcap.core.jobs import start_job
from distinctcap.evaluate.stage import evaluate_stage

device = start_job(snakemake, threads="all-on-cuda")
inputs = dict(snakemake.input.items())


def outputs_of(output, name: str) -> str | list[str]:
    """A named output: its list of paths, or the one path (work.json)."""
    value = getattr(output, name)
    return value if isinstance(value, str) else list(value)


for name in ("generated", "device", "per_image"):
    if name in inputs:
        inputs[name] = list(getattr(snakemake.input, name))
evaluate_stage(
    inputs,
    {name: outputs_of(snakemake.output, name) for name in snakemake.output.keys()},
    evaluations=snakemake.params.evaluations,
    block=snakemake.params.settings,
    seed=snakemake.params.seed,
    device=device,
    workers=snakemake.threads,
    cache_dir=snakemake.params.cache,
)
