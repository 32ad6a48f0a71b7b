"""UNKT: unlikely negative knowledge transfer from a frozen negative teacher (UNKT §3.2-3.3).

The student (the run's model) trains on all of D with eq. 9,

    L = (1 - lam) L_mle + lam (w_pred L_pred + w_hid sum_l L_hid^l + w_att sum_l L_att^l),

against the negative teacher p_n: the frozen run named by the run's `teacher` (an MLE model on
the high-entropy subset D-, Algorithm 1 lines 1-7). Both models read the same batch (the same
grid/pooled features and caption prefix, each distinct image encoded once as in the MLE
objective); the teacher runs without gradients.

- Which captions the negative terms read (`negative_captions`; the paper's equations do not
  say): `gold`, the batch's own captions, so the teacher's distributions are taken along the
  gold caption's prefix; or `teacher`, the negative teacher's own captions of the batch's
  distinct images (Fig. 1: "the negative teacher's output sequence ... is used to create a
  contrast"; §3.3: MLE "with corresponding positive image-text pairs"), teacher and student
  both teacher-forced on them, L_mle still on the gold captions. They are its greedy captions
  (`negative_decoding: greedy`, decoded once an image and kept, GreedyCaptions) or
  `negative_samples` samples an image drawn afresh each step (`sample`, global torch RNG).
  Where a teacher caption shares a prefix with a gold caption, L_pred meets L_mle there; after
  the first token they differ in, the student's gold-prefix predictions see L_mle alone.
- L_pred (eq. 5): soft unlikelihood of the teacher's softened predictions, `targets: soft`.
  The Table 6 ablations swap the target, keeping the rest of eq. 9: `hard` uses the teacher's
  greedy caption of the image as one negative token per position (token unlikelihood, eq. 2;
  decoded once per image and kept, see GreedyCaptions), `random` the tokens of a D- caption,
  drawn afresh per step with the global torch RNG (which the trainer's checkpoints restore).
  Under `gold` they are aligned by position with the gold caption (a reading of ours: after
  the first differing token the alignment is arbitrary); under `teacher` each is read along
  its own prefix, as the paper defines them (§4.4), and a random caption is one of another
  image.
- L_hid^l (eq. 7): each decoder layer's hidden state (the residual stream after block l) is
  turned into a distribution by a softmax over the feature dimension, one per caption position
  (the paper applies a KL to hidden states without saying how they become distributions; see
  distinctcap.methods.losses.hidden_distribution), then reverse_kl_repulsion (eq. 6).
- L_att^l (eq. 8): reverse_kl_repulsion of the attention rows softmax(QK^T / sqrt(d_k)) of
  decoder layer l, averaged over heads and positions; `attention: self | cross | both`. With
  `both`, a layer contributes its self- and its cross-attention term (the paper's "attention
  matrices of the l-th decoder layer"; our decoder layer has both kinds).
- Every term is a mean over non-pad caption positions: rows of pad query positions are
  excluded (they compute garbage under right padding, see distinctcap.captioner.model).
  `token_reduction: sum` instead sums each caption's token terms of L_mle and L_pred, as eq. 4,
  5 and 9 are printed, and takes the mean over captions (distinctcap.methods.losses.reduce_tokens);
  L_hid and L_att stay means.
- `top_k: k` (not in UNKT) makes L_pred the unlikelihood of the teacher's k most probable
  tokens at each position, renormalised (soft targets only); None is eq. 5 as printed.
- lam (§3.3): `lambda_schedule: progressive` rises linearly to 1 over the warm-up and then
  follows eq. 10 (distinctcap.methods.losses.progressive_lambda); `fixed` keeps `lambda_value`
  (Table 8). The paper warms up over 5 epochs: `warmup_epochs` is converted to optimiser steps
  with the trainer's epoch length, len(train captions) // batch_size micro-batches divided by
  grad_accum (features/batches.py BatchOrder); `warmup_steps`, when set, is used as is. The warm-up
  is capped at the run's total steps.
- With every weight 0 (Table 3 "w/o L_neg") there is no negative term and eq. 9 is the MLE
  loss: lam is taken as 0 (else the (1 - lam) factor would switch MLE off at lam = 1).

Random targets draw from the D- captions that are also training captions of this run: the
caption ids in `paths.d_minus` (the D- parquet shards, or one parquet file, with a
caption_id column), looked up in the run's training data (so a run on all of D has them all).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import Tensor

from distinctcap.captioner.search import greedy, sample
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.settings import steps_per_epoch
from distinctcap.data.tokenizer import BOS, EOS
from distinctcap.features.batches import distinct_images, encode_batch
from distinctcap.methods import facts
from distinctcap.methods.losses import (
    TOKEN_REDUCTIONS,
    hidden_distribution,
    mle_loss,
    progressive_lambda,
    reverse_kl_repulsion,
    soft_unlikelihood_loss,
    token_unlikelihood_loss,
    unkt_objective,
)

if TYPE_CHECKING:
    from distinctcap.captioner.model import Captioner
    from distinctcap.captioner.search import Caption
    from distinctcap.core.run import RunConfig
    from distinctcap.features.batches import Batch, CaptionData
    from distinctcap.features.read import ImageFeatures
    from distinctcap.methods.base import TrainContext

TARGETS = ("soft", "hard", "random")
ATTENTION = ("self", "cross", "both")
LAMBDA_SCHEDULES = ("progressive", "fixed")
NEGATIVE_CAPTIONS = ("gold", "teacher")
NEGATIVE_DECODINGS = ("greedy", "sample")


@dataclass
class UNKTConfig:
    """The unkt options of a run block, checked; their meaning and defaults: facts.UNKT."""

    w_pred: float
    w_hid: float
    w_att: float
    attention: str
    targets: str
    lambda_schedule: str
    lambda_value: float
    warmup_epochs: float
    warmup_steps: int | None
    temperature: float
    exclude_gold: bool
    token_reduction: str
    top_k: int | None
    negative_captions: str
    negative_decoding: str
    negative_samples: int

    def __post_init__(self) -> None:
        for key, allowed in (
            ("attention", ATTENTION),
            ("targets", TARGETS),
            ("lambda_schedule", LAMBDA_SCHEDULES),
            ("token_reduction", TOKEN_REDUCTIONS),
            ("negative_captions", NEGATIVE_CAPTIONS),
            ("negative_decoding", NEGATIVE_DECODINGS),
        ):
            if getattr(self, key) not in allowed:
                raise DistinctcapError(
                    f"unkt {key} = {getattr(self, key)!r}: choose one of {list(allowed)}"
                )
        for key in ("w_pred", "w_hid", "w_att", "warmup_epochs"):
            if getattr(self, key) < 0:
                raise DistinctcapError(f"unkt {key} = {getattr(self, key)}: allowed >= 0")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise DistinctcapError(f"unkt warmup_steps = {self.warmup_steps}: allowed >= 0")
        if not 0 <= self.lambda_value <= 1:
            raise DistinctcapError(f"unkt lambda_value = {self.lambda_value}: allowed 0..1")
        if self.temperature <= 0:
            raise DistinctcapError(f"unkt temperature = {self.temperature}: allowed > 0")
        if not (type(self.negative_samples) is int and self.negative_samples >= 1):
            raise DistinctcapError(
                f"unkt negative_samples = {self.negative_samples!r}: allowed an integer >= 1"
            )
        if self.top_k is not None and not (type(self.top_k) is int and self.top_k >= 1):
            raise DistinctcapError(f"unkt top_k = {self.top_k!r}: allowed an integer >= 1 or null")
        for key, why in facts.UNKT.option_conflicts(vars(self)).items():
            raise DistinctcapError(f"unkt {key} = {getattr(self, key)!r}: {why}")

    @classmethod
    def from_run(cls, options: dict) -> UNKTConfig:
        """The unkt options of a run (RunConfig.options; their defaults where missing)."""
        defaults = facts.UNKT.options
        return cls(**{f.name: options.get(f.name, defaults[f.name]) for f in fields(cls)})

    @property
    def any_negative(self) -> bool:
        return self.w_pred > 0 or self.w_hid > 0 or self.w_att > 0

    @property
    def intermediate(self) -> bool:
        """Whether eq. 7-8 need the decoder internals of both models."""
        return self.w_hid > 0 or self.w_att > 0


def read_caption_ids(path: str | Path) -> np.ndarray:
    """caption_id column of a parquet file or of every *.parquet in a folder (subset shards)."""
    path = Path(path)
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files or not files[0].exists():
        raise DistinctcapError(f"unkt targets = 'random': no parquet shards at {path}")
    return np.concatenate(
        [pq.read_table(f, columns=["caption_id"]).column(0).to_numpy() for f in files]
    )


def negative_pool(train_data: CaptionData, caption_ids: np.ndarray) -> tuple[Tensor, Tensor]:
    """Labels (P, max_len) of the training captions whose id is in `caption_ids` (D-), and the
    feature row of each one's image (P,)."""
    keep = torch.isin(train_data.caption_ids, torch.as_tensor(caption_ids, dtype=torch.long))
    if not keep.any():
        raise DistinctcapError(
            "unkt targets = 'random': none of the D- captions (paths.d_minus) is a training "
            "caption of this run; train the student on data: all"
        )
    return train_data.labels[keep].long(), train_data.image_rows[keep]


def captions_of_other_images(pool_rows: Tensor, image_rows: Tensor) -> Tensor:
    """For each image row (U,), the index of a pool caption of another image, drawn uniformly
    with the global torch RNG (which checkpoints restore). -> (U,) on the CPU."""
    if len(torch.unique(pool_rows)) < 2:
        raise DistinctcapError("unkt targets = 'random': the D- captions describe one image only")
    pick = torch.randint(len(pool_rows), (len(image_rows),))
    clash = pool_rows[pick] == image_rows
    while clash.any():  # redraw only the clashes: uniform over the other images' captions
        pick[clash] = torch.randint(len(pool_rows), (int(clash.sum()),))
        clash = pool_rows[pick] == image_rows
    return pick


def caption_labels(captions: list[Caption], max_len: int, pad_id: int) -> Tensor:
    """Generated captions -> labels (R, max_len): tokens + [eos], cut at max_len, right-padded."""
    labels = torch.full((len(captions), max_len), pad_id, dtype=torch.long)
    for row, cap in enumerate(captions):
        seq = [*cap.tokens, EOS][:max_len]
        labels[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return labels


def teacher_forcing(labels: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-padded labels (R, L) (tokens + [eos]) -> (inputs, labels) (R, N) for teacher
    forcing, trimmed to the longest caption: inputs = [bos] + labels shifted right, pad where
    the label is pad (as make_batch builds the gold captions)."""
    n = max(int((labels != pad_id).sum(dim=1).max()), 1)
    labels = labels[:, :n]
    bos = torch.full_like(labels[:, :1], BOS)
    inputs = torch.cat([bos, labels[:, :-1]], dim=1).masked_fill(labels == pad_id, pad_id)
    return inputs, labels


def align_negatives(negatives: Tensor, labels: Tensor, pad_id: int) -> Tensor:
    """Negative captions (B, K) aligned by position with labels (B, N): cut or right-padded to
    N, and pad where the reference is pad, so pad query positions are excluded. -> (B, N)."""
    n = labels.shape[1]
    out = torch.full_like(labels, pad_id)
    k = min(n, negatives.shape[1])
    out[:, :k] = negatives[:, :k].to(labels.device)
    return out.masked_fill(labels == pad_id, pad_id)


class GreedyCaptions:
    """The frozen teacher's greedy caption of each image as labels (tokens + [eos]): the hard
    targets of Table 6, and the captions of negative_captions: teacher. An image is decoded
    (distinctcap.captioner.search.greedy, no grad) the first time a batch holds it and then
    kept: greedy decoding of a frozen model in eval mode is deterministic, so later batches
    would decode the same caption again (one pass per image, not per step)."""

    def __init__(self, teacher: Captioner, features: ImageFeatures, pad_id: int):
        self.teacher, self.features, self.pad_id = teacher, features, pad_id
        n, self.max_len = len(features.image_ids), teacher.cfg.max_len
        self.labels = torch.full((n, self.max_len), pad_id, dtype=torch.long)  # by feature row
        self.done = torch.zeros(n, dtype=torch.bool)

    def __call__(self, image_rows: Tensor) -> Tensor:
        """Feature rows (B,) -> the teacher's greedy labels (B, max_len) on the CPU."""
        todo = torch.unique(image_rows[~self.done[image_rows]])
        if len(todo):
            dev = next(self.teacher.parameters()).device
            f = self.features
            grid, pooled = f.grid_at(todo).to(dev), f.pooled_at(todo).to(dev)
            caps = greedy(self.teacher, grid, pooled)
            self.labels[todo] = caption_labels(caps, self.max_len, self.pad_id)
            self.done[todo] = True
        return self.labels[image_rows]


def attention_maps(internals: dict[str, list[Tensor]], which: str) -> list[Tensor]:
    """Decoder attention probabilities (B, H, N, S) used by L_att, layer by layer."""
    kinds = ("self_attn", "cross_attn") if which == "both" else (f"{which}_attn",)
    return [internals[k][layer] for layer in range(len(internals["hidden"])) for k in kinds]


def run_decoder(
    model: Captioner, batch: Batch, internals: bool
) -> tuple[Tensor, dict[str, list[Tensor]] | None]:
    """Teacher-forced logits (B, N, V) of the batch's captions and, if asked, the decoder
    internals; each distinct image is encoded once (encode_batch), as the MLE objective does."""
    out = model.decode(encode_batch(model, batch), batch.inputs, return_internals=internals)
    return out if internals else (out, None)


class UNKT(facts.UNKT):
    """UNKT eq. 9 against the frozen negative teacher `ctx.frozen["teacher"]` (module doc)."""

    def __init__(self, run: RunConfig, ctx: TrainContext):
        self.cfg = UNKTConfig.from_run(run.options)
        self.pad_id = ctx.pad_id
        self.teacher = ctx.frozen["teacher"]
        c = self.cfg
        if c.token_reduction == "sum":
            # L_mle and L_pred are then means over captions, so multi-GPU shards weigh by
            # caption count (L_hid and L_att stay token means: for them a close approximation)
            self.mean_over = "captions"
        if c.warmup_steps is not None:
            self.warmup = c.warmup_steps
        else:
            per_epoch = steps_per_epoch(
                len(ctx.train_data), run.train.batch_size, run.train.grad_accum
            )
            self.warmup = round(c.warmup_epochs * per_epoch)
        self.pool = self.pool_rows = self.greedy = None
        # under `teacher` every negative term reads the negative captions; under `gold` only
        # L_pred's hard and random targets need them
        reads = c.any_negative if c.negative_captions == "teacher" else c.w_pred > 0
        if reads and (c.targets == "hard" or self.teacher_greedy):
            self.greedy = GreedyCaptions(self.teacher, ctx.train_data.features, self.pad_id)
        if reads and c.targets == "random":
            path = ctx.paths.get("d_minus")
            if not path:
                raise DistinctcapError(
                    f"run {run.name}: unkt targets = 'random' needs the D- shards "
                    "as paths.d_minus"
                )
            pool, self.pool_rows = negative_pool(ctx.train_data, read_caption_ids(path))
            self.pool = pool.to(ctx.device)

    @property
    def teacher_greedy(self) -> bool:
        """Whether the negative captions are the teacher's greedy ones (soft targets)."""
        c = self.cfg
        return c.negative_captions == "teacher" and c.targets == "soft" and (
            c.negative_decoding == "greedy"
        )

    def lam(self, step: int, total_steps: int) -> float:
        """lam of eq. 9 before optimiser step `step` (0-based) of `total_steps`."""
        if not self.cfg.any_negative:
            return 0.0
        if self.cfg.lambda_schedule == "fixed":
            return self.cfg.lambda_value
        return progressive_lambda(step, min(self.warmup, total_steps), total_steps)

    def selectable(self, step: int, total_steps: int) -> bool:
        """Only weights trained with the whole objective: after the progressive warm-up has
        taken lam to 1 (eq. 10's start). Before it the student is a briefly trained MLE model,
        whose diverse samples win on oracle CIDEr-D (measured on the shapes default: step 250 of
        1,500 selected, greedy CIDEr 0.75 and R@1 0.05 against the final weights' 1.12 / 0.43)."""
        progressive = self.cfg.any_negative and self.cfg.lambda_schedule == "progressive"
        return not progressive or step >= min(self.warmup, total_steps)

    def loss(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]:
        if self.cfg.negative_captions == "teacher":
            return self.loss_on_teacher_captions(model, batch, step, total_steps)
        c, pad = self.cfg, self.pad_id
        lam = self.lam(step, total_steps)
        internal = lam > 0 and c.intermediate
        logits, student = run_decoder(model, batch, internal)
        mle = mle_loss(logits, batch.labels, pad, c.token_reduction)
        if lam == 0:  # eq. 9 is exactly L_mle; the teacher is not needed
            return mle, {"lambda": 0.0, "mle": mle.detach()}

        teacher_logits, teacher = self.teacher_forward(batch, internal)
        pred = self.pred_loss(logits, teacher_logits, batch) if c.w_pred > 0 else None
        return self.objective(mle, pred, teacher, student, batch.labels != pad, lam)

    def loss_on_teacher_captions(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]:
        """eq. 9 with L_pred, L_hid and L_att on the negative captions (NegativeCaptions: the
        teacher's own for soft and hard targets, D- captions for random ones), teacher and
        student both teacher-forced on them; L_mle on the gold captions. Each distinct image
        is encoded once for both readings."""
        c, pad = self.cfg, self.pad_id
        lam = self.lam(step, total_steps)
        first, inverse = distinct_images(batch)
        dev = batch.grid.device
        grid, pooled = batch.grid[first.to(dev)], batch.pooled[first.to(dev)]
        memory = model.encode(grid, pooled)  # (U, M, W)
        logits = model.decode(memory[inverse.to(dev)], batch.inputs)
        mle = mle_loss(logits, batch.labels, pad, c.token_reduction)
        if lam == 0:
            return mle, {"lambda": 0.0, "mle": mle.detach()}

        internal = c.intermediate
        image, inputs, labels = self.negative_captions(batch.image_rows[first], grid, pooled)
        image, inputs, labels = image.to(dev), inputs.to(dev), labels.to(dev)
        out = model.decode(memory[image], inputs, return_internals=internal)
        neg_logits, student = out if internal else (out, None)
        teacher_logits, teacher = None, None
        if (c.targets == "soft" and c.w_pred > 0) or internal:
            with torch.no_grad():
                t_memory = self.teacher.encode(grid, pooled)[image]
                out = self.teacher.decode(t_memory, inputs, return_internals=internal)
                teacher_logits, teacher = out if internal else (out, None)
        pred = None
        if c.w_pred > 0:
            pred = self.pred_on(neg_logits, teacher_logits, labels, labels)
        return self.objective(mle, pred, teacher, student, labels != pad, lam)

    def negative_captions(
        self, image_rows: Tensor, grid: Tensor, pooled: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The captions the negative terms read for the batch's distinct images (feature rows
        (U,), their features): the teacher's greedy caption (soft targets with greedy decoding,
        hard targets; cached), negative_samples samples of it drawn afresh (sampled decoding),
        or a D- caption of another image (random targets). -> (image (R,) index into the U
        images, inputs (R, N), labels (R, N)), on the CPU."""
        c = self.cfg
        rows = image_rows.cpu()
        image = torch.arange(len(rows))
        if c.targets == "random":
            labels = self.pool[captions_of_other_images(self.pool_rows, rows)].cpu()
        elif self.greedy is not None:
            labels = self.greedy(rows)
        else:  # soft targets, sampled decoding: the global torch RNG, restored on resume
            caps = sample(self.teacher, grid, pooled, c.negative_samples)
            labels = caption_labels(
                [cap for group in caps for cap in group], self.teacher.cfg.max_len, self.pad_id
            )
            image = image.repeat_interleave(c.negative_samples)
        return (image, *teacher_forcing(labels, self.pad_id))

    def objective(
        self,
        mle: Tensor,
        pred: Tensor | None,
        teacher: dict[str, list[Tensor]] | None,
        student: dict[str, list[Tensor]] | None,
        mask: Tensor,
        lam: float,
    ) -> tuple[Tensor, dict[str, float]]:
        """eq. 9 from L_mle, L_pred and the two models' internals on the captions the negative
        terms read; `mask` (R, N) their non-pad positions (rows of pad query positions are
        excluded)."""
        c = self.cfg
        hid, att = [], []
        if c.w_hid > 0:
            hid = [
                reverse_kl_repulsion(
                    hidden_distribution(h_n.float()), hidden_distribution(h_s.float()), mask
                )
                for h_n, h_s in zip(teacher["hidden"], student["hidden"], strict=True)
            ]
        if c.w_att > 0:
            head_mask = mask[:, None, :]  # (B, 1, N) against rows (B, H, N)
            att = [
                reverse_kl_repulsion(a_n.float(), a_s.float(), head_mask)
                for a_n, a_s in zip(
                    attention_maps(teacher, c.attention),
                    attention_maps(student, c.attention),
                    strict=True,
                )
            ]
        loss = unkt_objective(mle, pred, hid, att, lam, c.w_pred, c.w_hid, c.w_att)
        extras = {"lambda": lam, "mle": mle.detach()}
        if pred is not None:
            extras["pred"] = pred.detach()
        if hid:
            extras["hid"] = torch.stack(hid).sum().detach()
        if att:
            extras["att"] = torch.stack(att).sum().detach()
        return loss, extras

    def teacher_forward(
        self, batch: Batch, internal: bool
    ) -> tuple[Tensor | None, dict[str, list[Tensor]] | None]:
        """Teacher logits (only for soft targets) and internals (only for eq. 7-8), no grad."""
        soft = self.cfg.targets == "soft" and self.cfg.w_pred > 0
        if not (soft or internal):
            return None, None
        with torch.no_grad():
            return run_decoder(self.teacher, batch, internal)

    def pred_loss(self, logits: Tensor, teacher_logits: Tensor | None, batch: Batch) -> Tensor:
        """L_pred on the gold captions: eq. 5 with the teacher's soft targets (its top_k tokens
        when set), or eq. 2 with one negative token per position (hard: the teacher's greedy
        caption; random: a random D- caption), aligned by position with the gold caption."""
        c, pad = self.cfg, self.pad_id
        negatives = None
        if c.targets == "hard":
            negatives = align_negatives(self.greedy(batch.image_rows), batch.labels, pad)
        elif c.targets == "random":
            pick = torch.randint(len(self.pool), (len(batch),)).to(self.pool.device)
            negatives = align_negatives(self.pool[pick], batch.labels, pad)
        return self.pred_on(logits, teacher_logits, batch.labels, negatives)

    def pred_on(
        self, logits: Tensor, teacher_logits: Tensor | None, labels: Tensor,
        negatives: Tensor | None,
    ) -> Tensor:
        """L_pred of the student's logits (R, N, V) on the captions `labels` (R, N) read:
        eq. 5 against the teacher's logits (soft), or eq. 2 of the tokens `negatives` (R, N)
        (hard, random); token_reduction as in eq. 9."""
        c, pad = self.cfg, self.pad_id
        if c.targets == "soft":
            return soft_unlikelihood_loss(
                logits.float(), teacher_logits.float(), labels, pad, c.temperature,
                c.exclude_gold, c.top_k, c.token_reduction,
            )
        return token_unlikelihood_loss(
            logits.float() / c.temperature, negatives, pad, c.token_reduction
        )
