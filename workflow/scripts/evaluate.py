"""Rule evaluate: every metric of one run's captions under each decoding setting and split."""

from distinctcap.core.jobs import start_job
from distinctcap.evaluate.stage import evaluate_stage

device = start_job(snakemake, threads="all")
evaluate_stage(
    {**dict(snakemake.input.items()), "generated": list(snakemake.input.generated)},
    {name: list(getattr(snakemake.output, name)) for name in ("metrics", "curve", "per_image")},
    evaluations=snakemake.params.evaluations,
    block=snakemake.params.settings,
    seed=snakemake.params.seed,
    device=device,
)
