"""A step's numbers, kept on the device until a log, validation or checkpoint step reads them all
at once (one host sync), and the non-finite loss check.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from distinctcap.core.errors import DistinctcapError

log = logging.getLogger(__name__)


class NonFiniteLossError(DistinctcapError):
    """A NaN/inf loss or gradient: names the step and the captions of the batch."""

    def __init__(self, what: str, value: float, step: int, total: int, caption_ids: list[int]):
        self.step, self.caption_ids = step, caption_ids
        super().__init__(
            f"{what} is {value} at step {step} of {total}; batch caption ids: {caption_ids}. "
            "Training stopped without writing a checkpoint from this state; lower train.lr or "
            "check these captions and their images' features."
        )


@dataclass
class StepStats:
    """One optimiser step's numbers, left on the device until `DeferredStats.resolve` reads them
    all with one host-device sync (values as 0-dim tensors, or floats an objective gave)."""

    step: int  # 1-based, as errors name it
    losses: list[torch.Tensor]  # each micro-batch's (weighted) loss, detached
    caption_ids: list[torch.Tensor]  # each micro-batch's captions (CPU)
    norm: torch.Tensor  # gradient norm before clipping
    tokens: int
    extras: list[dict]  # each micro-batch's objective extras
    reduced: torch.Tensor | None = None  # DDP: [loss, tokens] summed over the ranks (float64)


@dataclass
class StepNumbers:
    """One optimiser step's numbers read back: the loss (the micro-batches' losses / grad_accum,
    summed; with DDP over every process), the gradient norm, tokens and the objective's extras
    (summed / grad_accum)."""

    loss: float
    norm: float
    tokens: int
    extras: dict[str, float]


class DeferredStats:
    """The optimiser steps' numbers, kept on the device as the steps give them (`add`) until
    `resolve` reads them all with one host-device sync and checks them in step order: the first
    non-finite loss, or gradient norm if `check_norm` (not under fp16's GradScaler, which skips
    non-finite steps itself), raises NonFiniteLossError naming its step and captions."""

    def __init__(self, total_steps: int, grad_accum: int, check_norm: bool):
        self.total_steps, self.grad_accum, self.check_norm = total_steps, grad_accum, check_norm
        self.pending: list[StepStats] = []

    def add(self, stats: StepStats) -> None:
        self.pending.append(stats)

    def check(self, what: str, value: float, step: int, caption_ids: torch.Tensor) -> None:
        if not math.isfinite(value):
            raise NonFiniteLossError(what, value, step, self.total_steps, caption_ids.tolist())

    def resolve(self) -> list[StepNumbers]:
        """The pending steps' numbers, in step order; none are pending afterwards."""
        pending, self.pending = self.pending, []
        if not pending:
            return []
        tensors = []
        for p in pending:
            tensors += [*p.losses, p.norm]
            tensors += [] if p.reduced is None else [p.reduced[0], p.reduced[1]]
            tensors += [v for e in p.extras for v in e.values() if torch.is_tensor(v)]
        # float32 -> float64 is exact: the same Python floats as float(t) of each tensor
        values = iter(torch.stack([v.detach().reshape(()).double() for v in tensors]).tolist())
        ga, numbers = self.grad_accum, []
        for p in pending:
            losses = [next(values) for _ in p.losses]
            for value, ids in zip(losses, p.caption_ids, strict=True):
                self.check("loss", value, p.step, ids)
            norm = next(values)
            if self.check_norm:
                self.check("gradient norm", norm, p.step, p.caption_ids[-1])
            loss_sum, tokens = 0.0, p.tokens
            for value in losses:
                loss_sum += value / ga
            if p.reduced is not None:
                loss_sum, tokens = next(values), int(next(values))
            extras: dict[str, float] = {}
            for extra in p.extras:
                for k, v in extra.items():
                    value = next(values) if torch.is_tensor(v) else float(v)
                    # this process's micro-batches (all grad_accum of them on one process)
                    extras[k] = extras.get(k, 0.0) + value / len(p.extras)
            numbers.append(StepNumbers(loss_sum, norm, tokens, extras))
        return numbers
