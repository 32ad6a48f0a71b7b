"""Maximum likelihood: the token cross-entropy of the reference captions (UNKT eq. 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from distinctcap.features.batches import encode_batch
from distinctcap.methods import facts
from distinctcap.methods.losses import mle_loss

if TYPE_CHECKING:
    from distinctcap.captioner.model import Captioner
    from distinctcap.core.run import RunConfig
    from distinctcap.features.batches import Batch
    from distinctcap.methods.base import TrainContext


class MLE(facts.MLE):
    """L = -1/|y| sum_i log p(y_i | y_<i, I), mean over the batch's non-pad tokens (eq. 1)."""

    def __init__(self, run: RunConfig, ctx: TrainContext):
        self.pad_id = ctx.pad_id

    def loss(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]:
        logits = model.decode(encode_batch(model, batch), batch.inputs)  # (B, N, V)
        return mle_loss(logits, batch.labels, self.pad_id), {}
