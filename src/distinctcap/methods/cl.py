"""Contrastive Learning (CL, Dai & Lin 2017, §4.2): fine-tune a target captioner against a
frozen reference so that it raises p(c | I) of true pairs and lowers p(c/ | I) of mismatched
pairs, both relative to the reference.

Per micro-batch (B caption rows, each with its image):

- positives X: the batch's own (caption, image) pairs;
- negatives Y_1..Y_K: for each row, K captions of OTHER images (never a caption of the row's own
  image, by image id: C/I_t of §4.2), drawn uniformly from every training caption, afresh at
  each step. The draw is a pure function of (seed, step, the batch's caption ids), so a resumed
  run and an uninterrupted one see the same negatives;
- G = ln p_m(c|I) - ln p_n(c|I) (eq. 7) from one encoder pass over the batch's distinct images
  and one decoder pass over the B * (1 + K) captions (cross-attention keys/values once per
  batch row), for the target and (under no_grad) the reference;
- loss = -J (eq. 8-10), `distinctcap.methods.losses.contrastive_loss`.

The target runs in training mode (dropout on, as the trainer sets it) and the reference in eval
mode, as in the authors' code, so G is not exactly 0 at the first step even though the target
starts as a copy of the reference.

Options (the run's block in `runs:`):

- `negatives` K (default 5, "K = 5 is sufficient", §4.2);
- `nu` (default 1, "we choose nu = 1", §4.2) and `nu_in_sigmoid`: with true (default) h =
  r_nu(G) = 1 / (1 + nu exp(-G)) as in eq. 3 and 8; with false h = sigmoid(G), which is what the
  authors' released Lua code does (its criterion is built with log nu = 0, and nu, `-vu 5`, is
  only the number of negative draws);
- `constraints`: both (CL), positive (CL(P)) or negative (CL(N)), Table 4;
- `replace_reference_every` N > 0: before optimiser step N, 2N, ... the reference's weights are
  replaced by the target's current weights (§4.3, Table 6). The paper replaces the reference by
  the *best* target on validation after the target saturates and then reruns the learning; the
  objective cannot see validation, so this in-run variant copies the current target. The paper's
  protocol is a second run: `{method: cl, init: cl, reference: cl}` (the trainer's `model.pt`
  is the checkpoint selected on validation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from distinctcap.core import work
from distinctcap.core.errors import DistinctcapError
from distinctcap.features.batches import encode_batch
from distinctcap.methods import facts
from distinctcap.methods.losses import contrastive_loss

if TYPE_CHECKING:
    from distinctcap.captioner.model import Captioner
    from distinctcap.core.run import RunConfig
    from distinctcap.features.batches import Batch
    from distinctcap.methods.base import TrainContext

CONSTRAINTS = ("both", "positive", "negative")


def step_generator(
    seed: int, step: int, caption_ids: Tensor, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A torch.Generator seeded from (seed, step, the batch's caption ids).

    A pure function of its inputs, so random draws survive a resume; including the caption ids
    makes the micro-batches of one optimiser step (gradient accumulation) draw differently.
    """
    entropy = [abs(int(seed)), int(step), *(abs(int(c)) for c in caption_ids.tolist())]
    hi, lo = np.random.SeedSequence(entropy).generate_state(2, np.uint32)
    return torch.Generator(device).manual_seed(int(hi) << 32 | int(lo))


def sample_negatives(
    image_ids: Tensor, own_images: Tensor, k: int, generator: torch.Generator
) -> Tensor:
    """(B, K) positions into `image_ids` (C,), every one a caption of another image than
    `own_images[b]` (B,): uniform over the C/I_t of CL §4.2, with replacement."""
    c = len(image_ids)
    idx = torch.randint(c, (len(own_images), k), generator=generator)
    clash = image_ids[idx] == own_images[:, None]
    for _ in range(8):  # rejection: each round keeps a clash with prob. ~ (own captions) / C
        if not clash.any():
            return idx
        idx[clash] = torch.randint(c, (int(clash.sum()),), generator=generator)
        clash = image_ids[idx] == own_images[:, None]
    for b, j in clash.nonzero().tolist():  # an image owning most captions: draw exactly
        others = (image_ids != own_images[b]).nonzero().squeeze(1)
        if len(others) == 0:
            raise DistinctcapError("CL negatives need captions of at least two images")
        idx[b, j] = others[torch.randint(len(others), (1,), generator=generator)]
    return idx


def pair_logprobs(
    model: Captioner, batch: Batch, inputs: Tensor, labels: Tensor, pad_id: int
) -> Tensor:
    """ln p(c_r | I) for the B*g captions inputs/labels (B*g, N), rows b*g .. b*g+g-1 paired with
    the image of batch row b -> (B*g,), a sum over the non-pad labels (CL eq. 7 compares
    whole-caption probabilities). Each distinct image is encoded once (`encode_batch`) and the
    decoder's cross-attention keys/values are computed once per batch row, shared by its g
    captions (distinctcap.captioner.model.Attention); one decoder pass over all rows.
    Differentiable;
    the caller decides no_grad."""
    logits = model.decode(encode_batch(model, batch), inputs)  # (B*g, N, V)
    nll = F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=pad_id, reduction="none"
    )
    return -nll.view(labels.shape).sum(dim=1)


def _pad_to(x: Tensor, width: int, pad_id: int) -> Tensor:
    return F.pad(x, (0, width - x.shape[-1]), value=pad_id)


class ContrastiveLearning(facts.CL):
    """CL objective, loss = -J(theta) of eq. 10 (see the module doc; options and their
    defaults: facts.CL)."""

    def __init__(self, run: RunConfig, ctx: TrainContext):
        opts = {key: run.options.get(key, default) for key, default in self.options.items()}
        where = f"runs.{run.name}"
        if opts["constraints"] not in CONSTRAINTS:
            raise DistinctcapError(
                f"{where}.constraints = {opts['constraints']!r}: choose one of {CONSTRAINTS}"
            )
        if int(opts["negatives"]) < 1:
            raise DistinctcapError(f"{where}.negatives = {opts['negatives']}: allowed >= 1")
        if not float(opts["nu"]) > 0:
            raise DistinctcapError(f"{where}.nu = {opts['nu']}: allowed > 0")
        if int(opts["replace_reference_every"]) < 0:
            raise DistinctcapError(
                f"{where}.replace_reference_every = {opts['replace_reference_every']}: "
                "allowed >= 0 (0 = never)"
            )
        if "reference" not in ctx.frozen:
            raise DistinctcapError(f"{where}: method cl needs the frozen reference model")
        self.k = int(opts["negatives"])
        self.nu = float(opts["nu"]) if opts["nu_in_sigmoid"] else 1.0
        self.use_pos = opts["constraints"] in ("both", "positive")
        self.use_neg = opts["constraints"] in ("both", "negative")
        self.replace_every = int(opts["replace_reference_every"])
        self.replaced_at = 0  # step of the last reference replacement (0 = the original)
        self.seed = int(run.seed)
        self.reference = ctx.frozen["reference"]
        self.data = ctx.train_data
        self.pad_id = ctx.pad_id
        if self.use_neg and len(torch.unique(self.data.image_ids)) < 2:
            raise DistinctcapError(f"{where}: CL negatives need captions of at least two images")

    # -- negatives and rows --------------------------------------------------------------------

    def negatives(self, batch: Batch, step: int) -> Tensor:
        """(B, K) positions in ctx.train_data of the batch's negative captions at `step`."""
        gen = step_generator(self.seed, step, batch.caption_ids)
        return sample_negatives(self.data.image_ids, batch.image_ids, self.k, gen)

    @property
    def group(self) -> int:
        """Scored captions per batch row: its positive (if used) and its K negatives (if used)."""
        return int(self.use_pos) + self.k * int(self.use_neg)

    def rows(self, batch: Batch, step: int) -> tuple[Tensor, Tensor]:
        """Every scored caption of the micro-batch, inputs and labels (B*g, N): for each batch
        row b its own caption (if positives are used), then its K negatives (if used)."""
        device = batch.inputs.device
        inputs, labels = [], []
        if self.use_pos:
            inputs.append(batch.inputs[:, None])  # (B, 1, N)
            labels.append(batch.labels[:, None])
        if self.use_neg:
            neg = self.negatives(batch, step)  # (B, K)
            work.count("cl_negatives", neg.numel())
            n = max(int(self.data.lengths[neg].max()), 1)
            inputs.append(self.data.inputs[neg, :n].long().to(device, non_blocking=True))
            labels.append(self.data.labels[neg, :n].long().to(device, non_blocking=True))
        width = max(x.shape[-1] for x in inputs)

        def flat(parts: list[Tensor]) -> Tensor:  # (B, g, width) -> (B*g, width)
            return torch.cat([_pad_to(x, width, self.pad_id) for x in parts], dim=1).flatten(0, 1)

        return flat(inputs), flat(labels)

    # -- reference replacement (§4.3, Table 6) -------------------------------------------------

    def maybe_replace_reference(self, model: Captioner, step: int) -> bool:
        """Copy the target's weights into the frozen reference before steps N, 2N, ..."""
        every = self.replace_every
        if not every or step <= 0 or step % every or self.replaced_at >= step:
            return False
        try:
            self.reference.load_state_dict(model.state_dict())
        except RuntimeError as error:
            raise DistinctcapError(
                "replace_reference_every needs the reference and the target to share one "
                f"captioner architecture: {str(error)[:200]}"
            ) from error
        self.replaced_at = step
        return True

    def state_dict(self) -> dict:
        """What a resume needs beyond the target: the replaced reference, if any."""
        replaced = self.replaced_at > 0
        return {
            "replaced_at": self.replaced_at,
            "reference": self.reference.state_dict() if replaced else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.replaced_at = int(state["replaced_at"])
        if state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])

    # -- the objective -------------------------------------------------------------------------

    def loss(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]:
        self.maybe_replace_reference(model, step)
        inputs, labels = self.rows(batch, step)
        logp_target = pair_logprobs(model, batch, inputs, labels, self.pad_id)
        with torch.no_grad():
            logp_ref = pair_logprobs(self.reference, batch, inputs, labels, self.pad_id)
        b, g = len(batch), self.group
        logp_target, logp_ref = logp_target.view(b, g), logp_ref.view(b, g)
        pos_t = pos_r = neg_t = neg_r = None
        if self.use_pos:
            pos_t, pos_r = logp_target[:, 0], logp_ref[:, 0]
        if self.use_neg:
            first = int(self.use_pos)
            neg_t, neg_r = logp_target[:, first:], logp_ref[:, first:]
        loss = contrastive_loss(pos_t, pos_r, neg_t, neg_r, nu=self.nu)
        extras = {}
        if self.use_pos:
            extras["g_pos"] = (pos_t - pos_r).detach().mean()
        if self.use_neg:
            extras["g_neg"] = (neg_t - neg_r).detach().mean()
        return loss, extras
