"""Retrieval-guided specificity training (specificity paper §3.2-3.3, eq. 2-5, §4).

Per micro-batch:

1. The captioner generates a caption for each image, left to right without gradient and
   without dropout (argmax by default, as `search.greedy`; `sampling: gumbel` draws
   Gumbel-max samples, i.e. exact samples of p(y_t | ...), and keeps the noise for step 3).
   Images repeated in a batch (several captions of one image) are decoded once when sampling
   is argmax: their captions would be identical.
2. A teacher-forced pass of the captioner on its own tokens gives differentiable output
   probabilities p_t (B, T, V) at the generated positions (the same numbers the generator saw,
   up to dropout).
3. Straight-through (§3.3, Bengio et al. 2013): the CLIP text encoder reads the hard one-hot
   tokens, and the gradient w.r.t. the one-hot is used as the gradient w.r.t. p_t:
   onehot + p - p.detach(). For Gumbel, p_t = softmax((log p_t + g_t) / tau) (Jang et al.
   2017) with the noise g_t of step 1, so the hard token is argmax of the same perturbed scores.
4. The frozen CLIP text encoder embeds the caption (`distinctcap.clip.text.ClipTextEncoder`, the
   project's one CLIP text encoding, run from token embeddings), and `specificity_loss`
   (eq. 2-5) compares it with the true image's and, for cdp/ccos, a contrastive image's CLIP
   embedding: dp and cdp on CLIP's unnormalised projections (text: the tower's output before
   normalising; image: the stored pooled embedding times its stored norm), cos and ccos on
   unit vectors, as the paper defines them. The contrastive image is drawn uniformly from the
   image's top-1% most similar training images (`distinctcap.features.neighbours`), reproducibly per
   (seed, step, micro-batch).

The paper replaces MLE by this loss (§4: mle_weight 0, the default); `mle_weight` = lambda
in (0, 1] mixes in the MLE loss of the batch's reference captions as SMILE's eq. 4 does,
L = lambda L_MLE + (1 - lambda) L_spec (not in the specificity paper). Checkpoints are selected on
the validation mean rank (§4, "early stopping ... lowest mean rank"): `val_mean_rank`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distinctcap.captioner.model import Captioner
from distinctcap.captioner.search import ban_specials, decode_ids
from distinctcap.clip.text import ClipTextEncoder
from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import BOS, PAD
from distinctcap.features.batches import encode_batch
from distinctcap.features.neighbours import NeighbourTable
from distinctcap.methods import facts
from distinctcap.methods.clipval import (  # noqa: F401  (caption_ids_tensor: re-export)
    caption_ids_tensor,
    load_clip_model,
    val_mean_rank,
)
from distinctcap.methods.losses import SPECIFICITY_KINDS, mle_loss, specificity_loss

if TYPE_CHECKING:
    from distinctcap.core.run import RunConfig
    from distinctcap.features.batches import Batch, CaptionData
    from distinctcap.methods.base import TrainContext

SAMPLINGS = ("argmax", "gumbel")



def generate_ids(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    sampling: str = "argmax",
    generator: torch.Generator | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Captions of B images through the decoding loop of `search` (key/value cache, without
    gradient, in eval mode): ids (B, T) incl. eos, pad after it, and for Gumbel the noise g
    (B, T, V) added to the log-probabilities at each step (hard token = argmax(log p + g), an
    exact sample of p). Argmax decoding equals `search.greedy`. The soft one-hots of the
    straight-through estimator come later, from `output_probs` with gradient."""
    noise: list[Tensor] = []

    def gumbel_max(logp: Tensor) -> Tensor:
        u = torch.rand(logp.shape, generator=generator, device=logp.device)
        noise.append(-(-u.clamp_min(1e-20).log()).clamp_min(1e-20).log())  # Gumbel(0, 1)
        return (logp + noise[-1]).argmax(dim=-1)

    choose = gumbel_max if sampling == "gumbel" else (lambda logp: logp.argmax(dim=-1))
    seqs, _ = decode_ids(model, grid, pooled, choose, max_len)
    noise = noise[: seqs.shape[1]]  # steps after the last eos (decode_ids) are dropped
    return seqs, torch.stack(noise, dim=1) if noise else None


def output_probs(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    seqs: Tensor,
    noise: Tensor | None = None,
    temperature: float = 1.0,
) -> Tensor:
    """Teacher-forced probabilities of the generated positions, with gradient: (B, T, V).
    Without noise p(y_t | y_<t, I); with Gumbel noise softmax((log p + g) / temperature)."""
    inputs = torch.cat([torch.full_like(seqs[:, :1], BOS), seqs[:, :-1]], dim=1)
    logits, _ = model(grid, pooled, inputs)
    logp = logits.float().log_softmax(dim=-1)
    if noise is None:
        return logp.exp()
    return ((ban_specials(logp) + noise) / temperature).softmax(dim=-1)


def _step_generator(seed: int, step: int, micro: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + step) * 1_009 + micro)


class Specificity(facts.Specificity):
    """Specificity loss of the captioner's own captions through frozen CLIP (eq. 2-5).

    Run options (config `runs.<name>`; defaults, mean_over, val_metrics: facts.Specificity):
    loss dp|cos|cdp|ccos (default ccos), sampling argmax|gumbel, gumbel_temperature (> 0),
    mle_weight (lambda in [0, 1], 0 = the paper), rank_images (validation images for the mean
    rank, 0 = all)."""

    def __init__(
        self,
        run: RunConfig,
        ctx: TrainContext,
        clip: nn.Module | None = None,
        neighbours: NeighbourTable | str | os.PathLike | None = None,
    ):
        opts = {k: run.options.get(k, v) for k, v in self.options.items()}
        name = run.name
        if opts["loss"] not in SPECIFICITY_KINDS:
            raise DistinctcapError(
                f"runs.{name}.loss = {opts['loss']!r}: choose one of {list(SPECIFICITY_KINDS)}"
            )
        if opts["sampling"] not in SAMPLINGS:
            raise DistinctcapError(
                f"runs.{name}.sampling = {opts['sampling']!r}: choose one of {list(SAMPLINGS)}"
            )
        if (
            opts["gumbel_temperature"] <= 0
            or not 0 <= opts["mle_weight"] <= 1
            or opts["rank_images"] < 0
        ):
            raise DistinctcapError(
                f"runs.{name}: allowed gumbel_temperature > 0, 0 <= mle_weight <= 1, "
                "rank_images >= 0"
            )
        if ctx.tokenizer is None:
            raise DistinctcapError("method specificity needs the caption tokenizer (clip_ids)")
        self.kind, self.sampling = opts["loss"], opts["sampling"]
        self.temperature, self.mle_weight = opts["gumbel_temperature"], opts["mle_weight"]
        self.rank_images = int(opts["rank_images"])
        self.seed, self.pad_id, self.device = int(run.seed), ctx.pad_id, ctx.device
        paths = ctx.paths
        if clip is None:
            clip = getattr(ctx, "clip", None)
        if clip is None:
            clip = load_clip_model(paths, "specificity")
        self.encoder = ClipTextEncoder(clip, ctx.tokenizer.clip_ids).to(ctx.device)
        self.features = ctx.train_data.features
        self.neighbours = None
        if self.kind in ("cdp", "ccos"):
            table = next(
                (
                    t
                    for t in (neighbours, getattr(ctx, "neighbours", None), paths.get("neighbours"))
                    if t is not None
                ),
                None,
            )
            if table is None:
                raise DistinctcapError(
                    f"loss {self.kind} needs the contrastive-image table "
                    "(paths.neighbours, results/neighbours/...)"
                )
            if not isinstance(table, NeighbourTable):
                table = NeighbourTable.load(table, self.features.image_ids)
            self.neighbours = table
        self._micro = (-1, 0)  # (step, micro-batches seen in it)

    def _next_micro(self, step: int) -> int:
        last, count = self._micro
        count = count + 1 if step == last else 0
        self._micro = (step, count)
        return count

    @property
    def cosine(self) -> bool:
        return self.kind in ("cos", "ccos")

    def _images(self, rows: Tensor) -> Tensor:
        """CLIP image embeddings of training-feature rows: L2-normalised for cos/ccos, the
        unnormalised projections for dp/cdp. (B, D) float32 on the CPU."""
        if self.cosine:
            return self.features.pooled_at(rows).float()
        return self.features.unnormalised(rows)

    def loss(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]:
        micro = self._next_micro(step)
        gen = _step_generator(self.seed, step, micro, batch.grid.device)
        if self.sampling == "argmax":  # one caption per distinct image
            uniq, inverse = torch.unique(batch.image_rows, return_inverse=True)
            first = (
                torch.full((len(uniq),), len(inverse), dtype=torch.long)
                .scatter_reduce(0, inverse, torch.arange(len(inverse)), "amin")
                .to(batch.grid.device, non_blocking=True)
            )
        else:
            inverse = torch.arange(len(batch))
            first = inverse.to(batch.grid.device, non_blocking=True)
        grid, pooled = batch.grid[first], batch.pooled[first]
        seqs, noise = generate_ids(model, grid, pooled, self.sampling, gen)
        probs = output_probs(model, grid, pooled, seqs, noise, self.temperature)
        # dp/cdp compare CLIP's unnormalised projections (eq. 2, 4); cos/ccos normalise (eq. 3, 5)
        at = batch.grid.device
        text = self.encoder(seqs, probs, normalize=self.cosine)[inverse.to(at, non_blocking=True)]
        image = self._images(batch.image_rows).to(text.device, non_blocking=True)
        contrast = None
        if self.neighbours is not None:
            cpu_gen = _step_generator(self.seed, step, micro, torch.device("cpu"))
            contrast = self._images(self.neighbours.draw(batch.image_rows, cpu_gen))
            contrast = contrast.to(text.device, non_blocking=True)
        spec = specificity_loss(text, image, contrast, self.kind)
        text = text.detach()
        extras = {
            "specificity": spec.detach(),
            "cos_true": F.cosine_similarity(text, image).mean(),
            "gen_len": (seqs != PAD).sum(1).float().mean(),
        }
        if contrast is not None:
            extras["cos_contrast"] = F.cosine_similarity(text, contrast).mean()
        loss = spec
        if self.mle_weight > 0:
            logits = model.decode(encode_batch(model, batch), batch.inputs)  # (B, N, V)
            mle = mle_loss(logits, batch.labels, self.pad_id)
            loss = self.mle_weight * mle + (1 - self.mle_weight) * spec
            extras["mle"] = mle.detach()
        return loss, extras

    def val_metric(
        self,
        name: str,
        model: Captioner,
        val: CaptionData,
        batches: list | None = None,
        autocast: Callable | None = None,
    ) -> float:
        """`val_mean_rank` with this run's CLIP text encoder and `rank_images` (§4: early
        stopping on the lowest validation mean rank). `batches` is unused: ranks are per
        image, not per caption."""
        if name not in self.val_metrics:
            raise DistinctcapError(
                f"method specificity computes {list(self.val_metrics)}, not {name!r}"
            )
        return val_mean_rank(model, val, self.encoder, self.rank_images, autocast=autocast)
