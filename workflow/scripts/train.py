"""Train one run: the rule's inputs become the trainer's paths (distinctcap.train.launch, which
calls distinctcap.train.trainer.train here or in torchrun processes)."""

from pathlib import Path

from distinctcap.core.jobs import start_job
from distinctcap.train.launch import train_with_gpus

device = start_job(snakemake, threads="all")
cfg = dict(snakemake.params.run)
cfg["device"] = str(device)
paths = {k: (v if isinstance(v, str) else list(v)) for k, v in snakemake.input.items()}
cfg["paths"] = {**paths, **snakemake.params.paths,
                "out_dir": str(Path(snakemake.output.model).parent)}
# gpu > 1 (the profile's train_run resource): torchrun, one process per GPU (data parallel)
train_with_gpus(cfg, int(snakemake.resources.get("gpu", 0)), snakemake.log[0])
