"""Self-critical sequence training (SCST; Rennie et al. 2017) of a captioner started from a run
(`init`), with CIDEr-D, retrieval (Luo et al. 2018) and CLIPScore (Hessel et al. 2021) rewards.

Per micro-batch:

1. The batch's distinct images (a batch holds about B / 5 of them, features.batches) each get K
   captions drawn from the model's own distribution (`search.sample_ids`: eval mode, no
   gradient, the decoding loop's max_len and eos rule), from a generator seeded by (seed,
   step, the batch's caption ids), so a resumed run draws the same captions.
2. Each caption's reward r = sum_j w_j r_j (config `rewards`), on the token ids in this process:
   CIDEr-D against the image's training captions with document frequencies of the training
   captions (scores.cider.TokenCiderD, the evaluation's CIDEr-D on token ids; by default,
   `cider_end_token`, with the end token counted as the last word of captions and
   references, as ruotianluo's rewards.py and prepro_ngrams.py count it, so a caption cut
   before its end scores lower: docs/methods.md), Luo et al.'s -L_CON through the run's
   CLIP and CLIPScore (methods.rewards).
3. The baseline b: "new SCST" (default), the mean reward of the image's other K - 1 captions
   (ruotianluo/ImageCaptioning.pytorch `new_self_critical`), or Rennie et al.'s greedy caption's
   reward (eq. 9, `baseline: greedy`).
4. REINFORCE (Rennie et al. eq. 9): L = -sum (r - b) log p(w_t | w_<t, I) over the sampled
   tokens up to and including eos, divided by their number (ruotianluo's RewardCriterion); the
   log-probabilities come from a teacher-forced pass in train mode, with gradient, under the
   distribution the captions were drawn from (pad and bos excluded, `search.ban_specials`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from distinctcap.captioner.search import ban_specials, decode_ids, sample_ids
from distinctcap.clip.text import ClipTextEncoder
from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import BOS, CLIPSCORE_PREFIX, EOS, PAD, clip_bpe_ids
from distinctcap.features.batches import distinct_images
from distinctcap.methods import facts
from distinctcap.methods.cl import step_generator
from distinctcap.methods.clipval import load_clip_model
from distinctcap.methods.rewards import (
    clipscore_reward,
    greedy_advantages,
    new_scst_advantages,
    reinforce_loss,
    retrieval_reward,
)
from distinctcap.scores.cider import TokenCiderD, token_lengths

if TYPE_CHECKING:
    from torch import nn

    from distinctcap.captioner.model import Captioner
    from distinctcap.core.run import RunConfig
    from distinctcap.features.batches import Batch
    from distinctcap.methods.base import TrainContext


STOPS = (PAD, EOS)  # a caption's words end before its first eos or pad


def scst_options(run: RunConfig) -> dict:
    """The run's options over their defaults (facts.SCST.settings, the one merge), refused as
    the config check refuses them (facts.SCST.option_conflicts: baseline new needs k >= 2)
    and with at least one weight > 0. Each option's type and range are the schema's
    (workflow/schemas/methods/scst.yaml), which the config was validated against."""
    opts = facts.SCST.settings(run.options)
    facts.SCST.refuse_conflicts(run.name, opts)
    if not any(opts["rewards"].values()):
        raise DistinctcapError(f"runs.{run.name}.rewards: every weight is 0; give at least one > 0")
    return opts


class SCST(facts.SCST):
    """L = -mean over sampled tokens of (r(w^s) - b) log p(w^s_t | w^s_<t, I) (Rennie et al.
    2017 eq. 9), K samples per image (module doc)."""

    def __init__(self, run: RunConfig, ctx: TrainContext, clip: nn.Module | None = None):
        opts = scst_options(run)
        self.k, self.baseline = int(opts["k"]), opts["baseline"]
        self.weights = {name: float(w) for name, w in opts["rewards"].items()}
        self.margin = float(opts["retrieval_margin"])
        self.end = EOS if opts["cider_end_token"] else None  # counted as a word by CIDEr-D
        self.seed, self.data = int(run.seed), ctx.train_data
        self.features = ctx.train_data.features
        self._cider: TokenCiderD | None = None
        self.encoder = self.prefixed = None
        if self.weights["retrieval"] or self.weights["clipscore"]:
            if ctx.tokenizer is None:
                raise DistinctcapError(
                    f"runs.{run.name}.rewards: the retrieval and clipscore rewards need the "
                    "native captioner's tokenizer (CLIP ids)"
                )
            clip = clip if clip is not None else getattr(ctx, "clip", None)
            clip = clip if clip is not None else load_clip_model(ctx.paths, "scst")
            ids = ctx.tokenizer.clip_ids
            self.encoder = ClipTextEncoder(clip, ids).to(ctx.device)
            prefix = clip_bpe_ids(CLIPSCORE_PREFIX)
            self.prefixed = ClipTextEncoder(clip, ids, prefix).to(ctx.device)

    def cider(self, model: Captioner) -> TokenCiderD:
        """The CIDEr-D reward over the run's training captions, built at the first step (its
        n-gram keys need the model's vocabulary size); with `cider_end_token` the eos that
        ends a caption is its last word, in the references' document frequencies too."""
        if self._cider is None:
            refs, groups = self.data.labels.cpu().numpy(), self.data.image_rows.cpu().numpy()
            self._cider = TokenCiderD(refs, groups, model.cfg.vocab_size, STOPS, self.end)
        return self._cider

    @torch.no_grad()
    def rewards(
        self, model: Captioner, seqs: Tensor, rows: Tensor, image_of: Tensor
    ) -> dict[str, Tensor]:
        """Each weighted reward of captions seqs (N, T) of images rows[image_of] (feature rows;
        image_of (N,) on the CPU) and their weighted sum "reward": float64 (N,) on the CPU."""
        out: dict[str, Tensor] = {}
        total = torch.zeros(len(seqs), dtype=torch.float64)
        if self.weights["cider"]:
            images = rows[image_of].cpu().numpy()
            out["cider"] = torch.from_numpy(self.cider(model).score(seqs.cpu().numpy(), images))
        if self.encoder is not None:
            images = F.normalize(self.features.pooled_at(rows).float(), dim=-1).to(seqs.device)
            at = image_of.to(seqs.device)
            if self.weights["retrieval"]:
                text = self.encoder(seqs).float()
                out["retrieval"] = retrieval_reward(text, images, at, self.margin).double().cpu()
            if self.weights["clipscore"]:
                out["clipscore"] = clipscore_reward(self.prefixed(seqs).float(), images, at)
                out["clipscore"] = out["clipscore"].double().cpu()
        for name, value in out.items():
            total += self.weights[name] * value
        out["reward"] = total
        return out

    def loss(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]:
        first, _ = distinct_images(batch)
        device = batch.grid.device
        at = first.to(device, non_blocking=True)
        grid, pooled, rows = batch.grid[at], batch.pooled[at], batch.image_rows[first]
        gen = step_generator(self.seed, step, batch.caption_ids, device)
        seqs, _ = sample_ids(model, grid, pooled, self.k, gen)  # (U*K, T)
        image_of = torch.arange(len(first)).repeat_interleave(self.k)
        parts = self.rewards(model, seqs, rows, image_of)
        reward = parts["reward"].view(-1, self.k)  # (U, K)
        # the rewards are on the CPU already: floats, not tensors, so the trainer's deferred
        # stack of a step's device tensors never meets a CPU one
        extras = {name: float(value.mean()) for name, value in parts.items()}
        if self.baseline == "new":
            advantages = new_scst_advantages(reward)
        else:
            greedy, _ = decode_ids(model, grid, pooled, lambda logp: logp.argmax(dim=-1))
            base = self.rewards(model, greedy, rows, torch.arange(len(first)))["reward"]
            advantages = greedy_advantages(reward, base)
            extras["greedy_reward"] = float(base.mean())
        logp, mask = sample_logprobs(model, grid, pooled, seqs)
        loss = reinforce_loss(logp, mask, advantages.view(-1).to(device, torch.float32))
        lengths = torch.from_numpy(token_lengths(seqs.cpu().numpy(), STOPS))
        extras["gen_len"] = float(lengths.float().mean())
        return loss, extras


def sample_logprobs(
    model: Captioner, grid: Tensor, pooled: Tensor, seqs: Tensor
) -> tuple[Tensor, Tensor]:
    """log pi(w_t | w_<t, I) of the K = len(seqs) / len(grid) sampled captions of each image,
    with gradient (teacher-forced, the model in its current mode), under the sampling law (pad
    and bos excluded): (N, T), 0 after eos, and the mask of the tokens up to and including
    eos (N, T)."""
    k = len(seqs) // len(grid)
    memory = model.encode(grid, pooled).repeat_interleave(k, dim=0)
    inputs = torch.cat([torch.full_like(seqs[:, :1], BOS), seqs[:, :-1]], dim=1)
    logits = model.decode(memory, inputs)
    mask = seqs != PAD
    labels = seqs.masked_fill(~mask, EOS)  # any allowed id: masked below
    logp = ban_specials(logits.float()).log_softmax(dim=-1).gather(-1, labels[..., None])
    return logp.squeeze(-1).masked_fill(~mask, 0.0), mask
