"""Rule evaluate: every metric of one run's captions under each decoding setting and split."""

import torch

from distinctcap.core import logs
from distinctcap.core.devices import job_device
from distinctcap.evaluate.stage import evaluate_stage

logs.setup(snakemake.log[0])
device = str(job_device(snakemake.params.device, snakemake.resources.get("gpu", 0)))
torch.set_num_threads(snakemake.threads)
evaluate_stage(
    {**dict(snakemake.input.items()), "generated": list(snakemake.input.generated)},
    {name: list(getattr(snakemake.output, name)) for name in ("metrics", "curve", "per_image")},
    evaluations=snakemake.params.evaluations,
    block=snakemake.params.settings,
    seed=snakemake.params.seed,
    device=device,
)
