"""Training objectives, one per run `method`, looked up by name in `METHODS`.

The trainer (distinctcap.train) owns the loop: data order, optimiser, schedule, precision,
accumulation, validation, checkpoints. An objective only turns a batch into a loss, so a new
method (UNKT, CL, SMILE, specificity) is one module here and one entry in `METHODS`:

    class Objective:
        needs: tuple[str, ...] = ()       # frozen runs it wants, among "teacher", "reference"

        def __init__(self, run_cfg: dict, ctx: TrainContext): ...

        def loss(self, model, batch, step, total_steps) -> tuple[Tensor, dict[str, float]]:
            '''Scalar loss of one micro-batch (the trainer scales it for accumulation and
            runs backward) and extra numbers for the training curve (e.g. {"lambda": 0.3}).
            `step` counts optimiser steps from 0 to total_steps - 1.'''

- `run_cfg` is the run's effective config (distinctcap.train.effective_run_config): its block
  from `runs:` (method, data, init/teacher/reference, method options) with `train` merged over
  the top-level defaults and `captioner`, `seed` added.
- `ctx.frozen[edge]` is the final model of the run named by `run_cfg[edge]` for each edge in
  `needs`, loaded by the trainer, in eval mode, with requires_grad False, on `ctx.device`.
- Optional, for checkpoint selection on a metric only the objective can compute (e.g. the
  specificity run's validation mean rank through its CLIP): `val_metrics = {name: "min" |
  "max"}` and `val_metric(name, model, val_data, val_batches, autocast) -> float`; then
  `train.select_metric: <name>` selects on it.
- Optional, for exact resume of an objective with state beyond the model (e.g. CL's
  replaced reference): `state_dict() -> dict` and `load_state_dict(dict)`; the trainer keeps it
  in its checkpoints (tensors, numbers, strings, lists and dicts only).
- `batch` is a distinctcap.data.batches.Batch already on the device; the objective runs the
  model itself (under the trainer's autocast), so it can ask for internals (UNKT eq. 7-8) or
  score other captions (CL). `ctx.train_data` gives access to every training pair, e.g. to
  draw mismatched images for CL's negatives.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Protocol

import torch
from torch import Tensor

from distinctcap.data.batches import Batch, CaptionData
from distinctcap.methods import cl, smile, specificity
from distinctcap.methods.cl import ContrastiveLearning
from distinctcap.methods.mle import MLE
from distinctcap.methods.smile import SMILE
from distinctcap.methods.specificity import Specificity
from distinctcap.methods.unkt import UNKT, UNKTConfig
from distinctcap.model import Captioner


@dataclass
class TrainContext:
    device: torch.device
    train_data: CaptionData
    frozen: dict[str, Captioner] = field(default_factory=dict)  # "teacher"/"reference" -> model
    tokenizer: object | None = None  # distinctcap.data.tokenizer.CaptionTokenizer when known
    pad_id: int = 0


class Objective(Protocol):
    needs: tuple[str, ...]

    def __init__(self, run_cfg: dict, ctx: TrainContext) -> None: ...

    def loss(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]: ...


METHODS: dict[str, type[Objective]] = {
    "mle": MLE,
    "unkt": UNKT,
    "cl": ContrastiveLearning,
    "smile": SMILE,
    "specificity": Specificity,
}

# Keys every run block may carry; the schema (sections/runs.yaml) fills every method's
# options into every block, so a run keeps only these and its own method's options.
RUN_KEYS = frozenset({"method", "data", "init", "teacher", "reference", "train"})
OPTIONS: dict[str, frozenset[str]] = {
    "mle": frozenset(),
    "unkt": frozenset(f.name for f in fields(UNKTConfig)),
    "cl": frozenset(cl.DEFAULTS),
    "smile": frozenset(smile.DEFAULTS),
    "specificity": frozenset({*specificity.DEFAULTS, "contrastive_top_pct"}),
}
