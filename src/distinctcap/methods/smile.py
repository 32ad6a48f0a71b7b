"""Semipermeable MLE (SMILE, Yue et al. 2023): further training of an MLE captioner with the
softmax of every position restricted to the words of its own caption (§2.2, eq. 2-3, App. A).

Options (the run's block in `runs:`):

- `subset`: smile (V_D, the caption's own words; default), random (|V_D| random words) or
  reverse (V \\ V_D plus the label): the ablations of §3.4 / Fig. 4a;
- `first_token_mle` (default true): the first position uses the full vocabulary, the paper's
  default "initial context restriction" (§3.3, Table 4). Its other variant, first-token
  shifting, swaps the first label for a rare sub-word form ("a" -> "##a" in BERT's vocabulary);
  it depends on the vocabulary and is not implemented;
- `mle_weight` lambda in [0, 1] (default 0, pure SMILE): eq. 4,
  L = lambda L_MLE + (1 - lambda) L_SMILE; Table 5 tries 1, 0.5, 0.1, 0.05, 0.01 and 0 and finds
  0.01 best for self-retrieval.

Checkpoints are selected as §3.3 selects them, on CLIP self-retrieval R@1 of the greedy
captions of the validation images (`train.select_metric: clip_self_retrieval`,
distinctcap.methods.clipval; the run's CLIP is loaded at the first validation).

The loss is computed from one teacher-forced forward; the random subset is drawn from a
generator seeded by (seed, step, batch), so a resumed run draws the same subsets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import Tensor

from distinctcap.clip.text import ClipTextEncoder
from distinctcap.core.errors import DistinctcapError
from distinctcap.features.batches import encode_batch
from distinctcap.methods import facts
from distinctcap.methods.cl import step_generator
from distinctcap.methods.clipval import CLIP_VAL, load_clip_model
from distinctcap.methods.losses import SMILE_SUBSETS, mle_loss, smile_loss, smile_objective

if TYPE_CHECKING:
    from distinctcap.captioner.model import Captioner
    from distinctcap.core.run import RunConfig
    from distinctcap.features.batches import Batch, CaptionData
    from distinctcap.methods.base import TrainContext

class SMILE(facts.SMILE):
    """L = lambda L_MLE + (1 - lambda) L_SMILE (eq. 4), token means over non-pad labels."""

    def __init__(self, run: RunConfig, ctx: TrainContext):
        opts = {key: run.options.get(key, default) for key, default in self.options.items()}
        where = f"runs.{run.name}"
        if opts["subset"] not in SMILE_SUBSETS:
            raise DistinctcapError(
                f"{where}.subset = {opts['subset']!r}: choose one of {SMILE_SUBSETS}"
            )
        if not 0.0 <= float(opts["mle_weight"]) <= 1.0:
            raise DistinctcapError(
                f"{where}.mle_weight = {opts['mle_weight']}: allowed 0 <= mle_weight <= 1"
            )
        self.subset = opts["subset"]
        self.first_token_mle = bool(opts["first_token_mle"])
        self.lam = float(opts["mle_weight"])
        self.seed = int(run.seed)
        self.pad_id = ctx.pad_id
        self.ctx, self.paths, self.encoder = ctx, ctx.paths, None

    def loss(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]:
        logits = model.decode(encode_batch(model, batch), batch.inputs)  # (B, N, V)
        gen = None
        if self.subset == "random":
            gen = step_generator(self.seed, step, batch.caption_ids, logits.device)
        smile = smile_loss(
            logits, batch.labels, self.pad_id, self.first_token_mle, self.subset, gen
        )
        extras = {"smile": smile.detach()}
        if self.lam == 0.0:  # pure SMILE: no second softmax over the vocabulary
            return smile, extras
        mle = mle_loss(logits, batch.labels, self.pad_id)
        extras["mle"] = mle.detach()
        return smile_objective(smile, mle, self.lam), extras

    def val_metric(
        self,
        name: str,
        model: Captioner,
        val: CaptionData,
        batches: list | None = None,
        autocast: Callable | None = None,
    ) -> float:
        """CLIP self-retrieval R@1 on every validation image (§3.3)."""
        if name not in self.val_metrics:
            raise DistinctcapError(f"method smile computes {list(self.val_metrics)}, not {name!r}")
        if self.encoder is None:
            clip = getattr(self.ctx, "clip", None) or load_clip_model(self.paths, "smile")
            if self.ctx.tokenizer is None:
                raise DistinctcapError("smile selection needs the caption tokenizer (clip_ids)")
            self.encoder = ClipTextEncoder(clip, self.ctx.tokenizer.clip_ids).to(self.ctx.device)
        return CLIP_VAL[name](model, val, self.encoder, autocast=autocast)
