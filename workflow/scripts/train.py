"""Train one run: the rule's inputs become the trainer's paths (distinctcap.train.launch, which
calls distinctcap.train.trainer.train here or in torchrun processes)."""

from pathlib import Path

from distinctcap.core.jobs import start_job
from distinctcap.core.run import RunConfig, RunPaths
from distinctcap.train.launch import train_with_gpus

device = start_job(snakemake, threads="all")
run = RunConfig.from_effective(snakemake.params.run)
inputs = {k: (v if isinstance(v, str) else list(v)) for k, v in snakemake.input.items()}
paths = RunPaths({**inputs, **snakemake.params.paths}, Path(snakemake.output.model).parent)
# gpu > 1 (the profile's train_run resource): torchrun, one process per GPU (data parallel)
train_with_gpus(run, paths, device, int(snakemake.resources.get("gpu", 0)), snakemake.log[0])
