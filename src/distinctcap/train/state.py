"""What continues a captioner run: the loop's state (with the curve and the window of steps
since its last row), the work done so far, and a checkpoint's contents built from them and
restored into them.

A checkpoint (`distinctcap.train.checkpoints.Checkpoints` owns the file and its fingerprint)
holds the model, optimiser, scheduler, scaler, RNG states (torch, CUDA, numpy, python), the
data position, the best weights so far, the curve and its open window, the objective's own
state (its state_dict) and the work record. A run restored from it ends with the weights of an
uninterrupted run (ARCHITECTURE.md, Invariants). Parameters are checked finite before any
checkpoint is written, so a broken state is never saved.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from distinctcap.core.errors import DistinctcapError
from distinctcap.train.checkpoints import rng_state, set_rng_state
from distinctcap.train.stats import StepNumbers


@dataclass
class LoopState:
    step: int = 0  # optimiser steps done
    best_metric: float | None = None
    best_step: int | None = None
    best_state: dict | None = None  # CPU copy of the selected weights
    bad_evals: int = 0
    stopped_early: bool = False
    curve: list[dict] = field(default_factory=list)
    window: dict = field(default_factory=lambda: new_window())  # sums since the last row

    def add_validation(self, value: float, mode: str, model: torch.nn.Module, patience: int):
        """A selectable validation's `value` of the selection metric (`mode` min or max): the
        new best, whose weights are kept on the CPU, or one more validation without
        improvement; `patience` of them in a row stop the run (0: never)."""
        better = mode == "min"
        improved = self.best_metric is None or (
            value < self.best_metric if better else value > self.best_metric
        )
        if improved:
            self.best_metric, self.best_step, self.bad_evals = value, self.step, 0
            self.best_state = {k: v.detach().to("cpu", copy=True)
                               for k, v in model.state_dict().items()}  # fmt: skip
        else:
            self.bad_evals += 1
            if patience and self.bad_evals >= patience:
                self.stopped_early = True


def new_window() -> dict:
    """Sums since the last curve row; extras as [sum, count] since not every step reports
    every extra (e.g. a validation-only number)."""
    return {"loss": 0.0, "norm": 0.0, "n": 0, "tokens": 0, "seconds": 0.0, "extras": {}}


def add_steps(window: dict, steps: list[StepNumbers], seconds: float) -> None:
    """Add the steps' numbers, read back in step order, and their `seconds` to `window`."""
    for n in steps:
        window["loss"] += n.loss
        window["norm"] += n.norm
        window["n"] += 1
        window["tokens"] += n.tokens
        for k, v in n.extras.items():
            total, count = window["extras"].get(k, (0.0, 0))
            window["extras"][k] = [total + v, count + 1]
    window["seconds"] += seconds


def curve_row(window: dict, step: int, epoch: int, lr: float) -> dict:
    """The curve row of `window` (means over its steps, tokens per second) after `step`."""
    n = max(window["n"], 1)
    row = {
        "step": step,
        "epoch": epoch,
        "lr": lr,
        "loss": window["loss"] / n,
        "grad_norm": window["norm"] / n,
        "tokens_per_s": window["tokens"] / max(window["seconds"], 1e-9),
    }
    row.update({k: total / count for k, (total, count) in window["extras"].items()})
    return row


def sorted_counts(counts: Counter) -> dict[str, int]:
    return {k: int(counts[k]) for k in sorted(counts)}


@dataclass
class WorkDone:
    """The run's work as its sources count it (distinctcap.core.work): optimiser steps,
    training examples (captions) and tokens (non-pad target tokens) of this process, captions
    decoded during the steps (UNKT's teacher, specificity's own captions), CL's negatives
    scored (`counts`), and per validation pass its step, metric names and the captions it
    decoded and scored (`validations`)."""

    counts: Counter = field(default_factory=Counter)
    validations: list[dict] = field(default_factory=list)

    def record(self) -> dict:
        """summary.json's `work`."""
        return {**sorted_counts(self.counts), "validations": self.validations}


class Resumable(NamedTuple):
    """The training objects whose state a checkpoint holds beside the loop's."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    objective: object  # the method's Objective: state_dict / load_state_dict


def check_finite_params(model: torch.nn.Module, step: int) -> None:
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise DistinctcapError(
            f"parameters {bad[:5]} are not finite after step {step}; no checkpoint written. "
            "Lower train.lr or enable train.grad_clip."
        )


def checkpoint_contents(s: LoopState, grad_accum: int, parts: Resumable, done: WorkDone) -> dict:
    """The checkpoint dict of a run after `s.step` optimiser steps of `grad_accum`
    micro-batches (its fingerprint is stamped on by Checkpoints.save)."""
    check_finite_params(parts.model, s.step)
    return {
        "step": s.step,
        "micro_batch": s.step * grad_accum,  # data position (BatchOrder index)
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": parts.scheduler.state_dict(),
        "scaler": parts.scaler.state_dict(),
        "rng": rng_state(),
        "best": {
            "metric": s.best_metric,
            "step": s.best_step,
            "state": s.best_state,
            "bad_evals": s.bad_evals,
        },
        "curve": s.curve,
        "window": s.window,
        # an objective's state beyond the model (e.g. CL's replaced reference), {} if none
        "objective": parts.objective.state_dict(),
        "work": {"counts": dict(done.counts), "validations": done.validations},
    }


def restore(ckpt: dict, parts: Resumable) -> tuple[LoopState, WorkDone]:
    """Put `parts` and the RNGs back to checkpoint `ckpt`; the loop's state and the work done
    up to it."""
    parts.model.load_state_dict(ckpt["model"])
    parts.optimizer.load_state_dict(ckpt["optimizer"])
    parts.scheduler.load_state_dict(ckpt["scheduler"])
    parts.scaler.load_state_dict(ckpt["scaler"])
    set_rng_state(ckpt["rng"])
    if ckpt.get("objective") is not None:
        parts.objective.load_state_dict(ckpt["objective"])
    work = ckpt.get("work") or {"counts": {}, "validations": []}  # none before issue 46
    best = ckpt["best"]
    state = LoopState(
        ckpt["step"],
        best["metric"],
        best["step"],
        best["state"],
        best["bad_evals"],
        False,
        ckpt["curve"],
        ckpt["window"],
    )
    return state, WorkDone(Counter(work["counts"]), list(work["validations"]))
