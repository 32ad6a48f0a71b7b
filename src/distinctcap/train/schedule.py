"""The optimiser, its learning-rate schedule and the autocast precision."""

from __future__ import annotations

import math
from functools import partial

import torch

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.settings import TrainConfig


def lr_at(
    step: int, peak: float, warmup: int, total: int, schedule: str, final_ratio: float
) -> float:
    """The lr before optimiser step `step` (0-based): linear warm-up from peak/warmup to `peak`
    over `warmup` steps, then linear or cosine decay to `final_ratio * peak` at step total - 1,
    or constant. Both trainers use it: the captioner's through LambdaLR with peak 1
    (`lr_factor`), CLIP's per step with its peak lr and final_ratio 0.

    The cosine argument is pi * steps / span, in that order, as CLIP training always computed
    it; captioner runs on the cosine schedule (before: pi * (steps / span)) moved in the last
    bit of some lrs when the two schedules became this one."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant":
        return peak
    span = max(total - 1 - warmup, 1)
    if schedule == "linear":
        decay = 1.0 - min((step - warmup) / span, 1.0)
    else:
        decay = 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, span) / span))
    return (final_ratio + (1.0 - final_ratio) * decay) * peak


def lr_factor(step: int, warmup: int, total: int, schedule: str, final_ratio: float) -> float:
    """The captioner trainer's LambdaLR multiplier of its peak lr: `lr_at` with peak 1."""
    return lr_at(step, 1.0, warmup, total, schedule, final_ratio)


def make_optimizer(
    model: torch.nn.Module, tc: TrainConfig, device: torch.device | None = None
) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices and embeddings, not on biases and norms (as nanoGPT).
    On a GPU the fused implementation (one kernel for all parameters); on the CPU the default,
    so CPU numbers do not change."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": tc.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = {"fused": True} if device is not None and device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=tc.lr, betas=tc.betas, **fused)


def make_scheduler(
    optimizer: torch.optim.Optimizer, tc: TrainConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """The captioner's learning-rate schedule (`lr_factor` of the peak lr), stepped once per
    optimiser step."""
    factor = partial(
        lr_factor,
        warmup=tc.warmup_steps,
        total=tc.steps,
        schedule=tc.schedule,
        final_ratio=tc.final_lr_ratio,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """None = plain fp32."""
    if precision == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision == "fp16" and device.type != "cuda":
        raise DistinctcapError("train.precision = 'fp16' needs a GPU; use fp32 or bf16 on CPU")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
