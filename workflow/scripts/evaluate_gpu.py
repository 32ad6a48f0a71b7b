"""Rule evaluate_gpu: the torch part of one run's evaluation (CLIP retrieval and CLIPScore,
model self-retrieval, GPT-2 perplexity), on the job's GPU, for the CPU evaluate job."""

from distinctcap.core.jobs import start_job
from distinctcap.evaluate.device import evaluate_device_stage

device = start_job(snakemake, threads="all-on-cuda")
evaluate_device_stage(
    {**dict(snakemake.input.items()), "generated": list(snakemake.input.generated)},
    {name: list(getattr(snakemake.output, name)) for name in ("device", "per_image")},
    evaluations=snakemake.params.evaluations,
    block=snakemake.params.settings,
    seed=snakemake.params.seed,
    device=device,
)
