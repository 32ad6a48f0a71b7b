"""What a finished run gives: its `TrainResult`, and the run folder's outputs in `<out_dir>`:
model.pt (the selected weights, `Captioner.load`-able), curve.csv (one row per log/validation
step: step, epoch, lr, loss, grad_norm, tokens_per_s, val_* and the objective's own numbers)
and summary.json (steps, selection, timing, the fingerprint and its parts, `inputs`, the
effective config and the work record).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from distinctcap.captioner.model import Captioner
from distinctcap.core.io import atomic_path, write_json
from distinctcap.core.run import RunConfig
from distinctcap.train.checkpoints import Fingerprint


@dataclass
class TrainResult:
    model: Captioner  # with the selected weights, on the training device
    steps: int  # optimiser steps done
    metric: str
    best_metric: float | None
    best_step: int | None
    stopped_early: bool
    resumed_from: int | None  # step of the checkpoint this process started from
    curve: pd.DataFrame
    train_seconds: float  # time in training steps in this process (no setup, val, checkpoints)
    tokens_per_s: float
    work: dict = field(default_factory=dict)  # train.state.WorkDone.record, summary.json's


def write_outputs(
    out: Path, result: TrainResult, run: RunConfig, fingerprint: Fingerprint, processes: int
) -> None:
    """model.pt, curve.csv and summary.json of `result` in run folder `out`, each written
    atomically; `processes`: how many processes trained it."""
    result.model.save(out / "model.pt")
    with atomic_path(out / "curve.csv") as tmp:
        result.curve.to_csv(tmp, index=False)
    write_json(
        {
            "run": run.name,
            "method": run.method,
            "steps": result.steps,
            "metric": result.metric,
            "best_metric": result.best_metric,
            "best_step": result.best_step,
            "stopped_early": result.stopped_early,
            "resumed_from": result.resumed_from,
            "tokens_per_s": result.tokens_per_s,
            "train_seconds": result.train_seconds,
            "parameters": result.model.num_params(),
            "processes": processes,
            "fingerprint": fingerprint.hash,
            "inputs": fingerprint.parts,
            "config": run.effective(),
            "work": result.work,
        },
        out / "summary.json",
    )
