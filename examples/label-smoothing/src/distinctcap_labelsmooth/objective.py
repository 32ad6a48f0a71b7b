"""The objective of `method: label_smoothing`: MLE's step (distinctcap.methods.mle) with the
smoothed loss of distinctcap_labelsmooth.losses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from distinctcap.features.batches import encode_batch
from distinctcap_labelsmooth import facts
from distinctcap_labelsmooth.losses import label_smoothing_loss

if TYPE_CHECKING:
    from distinctcap.captioner.model import Captioner
    from distinctcap.core.run import RunConfig
    from distinctcap.features.batches import Batch
    from distinctcap.methods.base import TrainContext


class LabelSmoothing(facts.LabelSmoothing):
    """MLE with smoothed targets; `epsilon` from the run's options."""

    def __init__(self, run: RunConfig, ctx: TrainContext):
        self.pad_id = ctx.pad_id
        self.epsilon = float(run.options.get("epsilon", self.options["epsilon"]))

    def loss(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]:
        logits = model.decode(encode_batch(model, batch), batch.inputs)  # (B, N, V)
        return label_smoothing_loss(logits, batch.labels, self.pad_id, self.epsilon), {}
