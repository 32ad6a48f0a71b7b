"""The tests write a training job as one dict, as a rule has it: a run's effective config plus
`paths` (input files by name, and out_dir) and `device`; `fit` splits it into the trainer's
arguments (RunConfig, RunPaths, torch.device)."""

from __future__ import annotations

from pathlib import Path

import torch

from distinctcap.core.run import RunConfig, RunPaths
from distinctcap.train.data import RunData
from distinctcap.train.outputs import TrainResult
from distinctcap.train.trainer import Trainer, train


def job_parts(job: dict) -> tuple[RunConfig, RunPaths, torch.device]:
    config = {k: v for k, v in job.items() if k not in ("paths", "device")}
    inputs = dict(job.get("paths") or {})
    out_dir = inputs.pop("out_dir", None)
    paths = RunPaths(inputs, Path(out_dir) if out_dir else None)
    return RunConfig.from_effective(config), paths, torch.device(job.get("device", "cpu"))


def fit(job: dict, data: RunData | None = None) -> TrainResult:
    """train() the job (see the module doc)."""
    return train(*job_parts(job), data)


def kill_after(job: dict, data: RunData, steps: int) -> Path:
    """What a kill after `steps` optimiser steps and a checkpoint leaves behind (real steps,
    then the real checkpoint): the checkpoint's path. `fit` of the same job then resumes."""
    trainer = Trainer(*job_parts(job), data)
    for _ in range(steps):
        trainer.train_step()
    trainer.save_checkpoint()
    return trainer.checkpoints.path


def run_of(config: dict) -> RunConfig:
    """An objective's run from a test's config dict (name, seed, method options, ...)."""
    return RunConfig.from_effective(config)
