"""Training losses for distinctive captioning: pure functions on tensors.

Shapes: logits (B, N, V), labels (B, N) right-padded with ``pad_id``, sequence log-probs (B,).
Token losses are means over non-pad positions (the papers write sums over the caption; the
mean keeps the scale independent of batch size and caption length) and are 0 when every
position is padding. The token terms of UNKT (L_mle, L_pred) also take reduction="sum": each
caption's token terms summed, as UNKT eq. 4, 5 and 9 are printed, then the mean over captions
(`reduce_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from distinctcap.core.errors import DistinctcapError

SMILE_SUBSETS = ("smile", "random", "reverse")
SPECIFICITY_KINDS = ("dp", "cos", "cdp", "ccos")
TOKEN_REDUCTIONS = ("mean", "sum")


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    kept = torch.where(mask, values, torch.zeros_like(values))
    return kept.sum() / mask.sum().clamp_min(1)


def reduce_tokens(values: Tensor, mask: Tensor, reduction: str = "mean") -> Tensor:
    """Per-position terms (B, N) of B captions -> scalar, over the positions where mask is True.

    "mean": the mean over all the batch's kept positions (each token weighs the same).
    "sum": each caption's terms summed, as UNKT eq. 4, 5 and 9 are printed, then the mean over
    the captions that have a kept position; so the scale grows with caption length. Both are 0
    when nothing is kept.
    """
    if reduction == "mean":
        return _masked_mean(values, mask)
    if reduction != "sum":
        raise DistinctcapError(
            f"token reduction {reduction!r}: choose one of {list(TOKEN_REDUCTIONS)}"
        )
    kept = torch.where(mask, values, torch.zeros_like(values)).flatten(1)
    return kept.sum() / mask.flatten(1).any(1).sum().clamp_min(1)


def _log_one_minus_softmax_at(z: Tensor, index: Tensor) -> Tensor:
    """log(1 - softmax(z)[..., index]) as logsumexp over the other classes minus logsumexp.

    Exact and finite even where softmax saturates to a one-hot. z (..., V), index (...).
    """
    others = z.scatter(-1, index.unsqueeze(-1), float("-inf"))
    return others.logsumexp(-1) - z.logsumexp(-1)


def _log_one_minus_softmax(z: Tensor) -> Tensor:
    """log(1 - softmax(z)) for every class, (..., V) -> (..., V), finite values and gradients."""
    p = z.softmax(-1)
    top = z.argmax(-1, keepdim=True)
    is_top = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, top, True)
    # Only the most likely class can have p > 1/2, where log1p(-p) loses precision; it gets the
    # exact logsumexp form, the rest log1p (with the top class zeroed so no inf enters autograd).
    rest = torch.log1p(-torch.where(is_top, torch.zeros_like(p), p))
    top_value = _log_one_minus_softmax_at(z, top.squeeze(-1)).unsqueeze(-1)
    return torch.where(is_top, top_value, rest)


def mle_loss(logits: Tensor, labels: Tensor, pad_id: int, reduction: str = "mean") -> Tensor:
    """UNKT eq. 1 (SMILE eq. 1): token cross-entropy -log p(y_i | y_<i, X).

    logits (B, N, V), labels (B, N) -> scalar over positions where labels != pad_id: their mean,
    or with reduction="sum" each caption's sum, then the mean over captions (reduce_tokens;
    eq. 4 and 9 of UNKT as printed).
    """
    nll = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # (B, N)
    return reduce_tokens(nll, labels != pad_id, reduction)


def soft_unlikelihood_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    pad_id: int,
    temperature: float = 1.0,
    exclude_gold: bool = False,
    top_k: int | None = None,
    reduction: str = "mean",
) -> Tensor:
    """UNKT eq. 5, L_pred = -sum_k p_n(k) log(1 - p_s(k)) per position.

    p = softmax(logits / temperature) for student and negative teacher (UNKT uses t = 1); the
    teacher is detached. Logits (B, N, V); labels (B, N) give the mask and, with
    `exclude_gold` (not in UNKT), the ground-truth token whose teacher probability is set to 0,
    as unlikelihood training leaves the target out of its negatives (Welleck et al. 2020): as
    printed, where the teacher is sure of the gold token, (1 - lam) L_mle + lam L_pred is least
    at p_s(gold) = 1 - lam. `top_k` (not in UNKT; None = eq. 5 as printed, the whole
    distribution) keeps the teacher's k most probable tokens at each position, their
    probabilities renormalised to sum to 1 (k >= V is the whole distribution); `exclude_gold`
    then removes the gold token from those k. Returns a scalar over non-pad positions: their
    mean, or with reduction="sum" each caption's sum, then the mean over captions (eq. 5 and 9
    as printed; reduce_tokens). log(1 - p_s) is computed without cancellation, so one-hot
    extremes give finite values and gradients.
    """
    p_teacher = (teacher_logits.detach() / temperature).softmax(-1)
    if top_k is not None:
        if top_k < 1:
            raise DistinctcapError(f"soft_unlikelihood_loss: top_k must be >= 1, got {top_k}")
        top, index = p_teacher.topk(min(top_k, p_teacher.shape[-1]), dim=-1)
        top = top / top.sum(-1, keepdim=True)
        p_teacher = torch.zeros_like(p_teacher).scatter(-1, index, top)
    if exclude_gold:
        p_teacher = p_teacher.scatter(-1, labels.clamp_min(0).unsqueeze(-1), 0.0)
    per_position = -(p_teacher * _log_one_minus_softmax(student_logits / temperature)).sum(-1)
    return reduce_tokens(per_position, labels != pad_id, reduction)


def token_unlikelihood_loss(
    logits: Tensor, negative_labels: Tensor, pad_id: int, reduction: str = "mean"
) -> Tensor:
    """UNKT eq. 2 with one negative token per position: -log(1 - p(y-_i)).

    The "hard targets" ablation of UNKT Table 6: negative_labels (B, N) are the tokens of a
    negative caption (e.g. the negative teacher's greedy caption), aligned by position with
    logits (B, N, V). Returns a scalar over positions where negative_labels != pad_id: their
    mean, or with reduction="sum" each caption's sum, then the mean over captions.
    """
    per_position = -_log_one_minus_softmax_at(logits, negative_labels)
    return reduce_tokens(per_position, negative_labels != pad_id, reduction)


def hidden_distribution(hidden: Tensor) -> Tensor:
    """Turn hidden states (..., D) into distributions for UNKT eq. 7: softmax over features.

    The paper applies KL to hidden states without saying how they become distributions; we
    take a softmax over the feature dimension, one distribution per position.
    """
    return hidden.softmax(-1)


def reverse_kl_repulsion(
    teacher: Tensor, student: Tensor, mask: Tensor | None = None, eps: float = 1e-8
) -> Tensor:
    """UNKT eq. 6, L_rkl(P, Q) = 1/M sum_i exp(-KL(P_i || Q_i)), used by eq. 7 and eq. 8.

    teacher (P, negative teacher, detached) and student (Q) are probability distributions over
    the last dim, same shape (..., D): hidden_distribution() of hidden states (eq. 7) or
    attention rows softmax(QK^T / sqrt(d_k)) (eq. 8). mask (bool, shaped like or broadcastable
    to the leading dims) selects the M rows averaged; all rows when None. The value is 1 for
    identical rows and falls towards 0 as the student moves away, so minimising it repels.
    0 log 0 = 0 in the teacher; the student is clamped to eps.
    """
    p = teacher.detach()
    kl = (torch.xlogy(p, p) - p * student.clamp_min(eps).log()).sum(-1)
    similarity = torch.exp(-kl)
    if mask is None:
        return similarity.mean()
    return _masked_mean(similarity, mask.expand_as(similarity))


def progressive_lambda(step: int, warmup_steps: int, total_steps: int) -> float:
    """UNKT §3.3 progressive weight of the negative terms in eq. 9.

    Rises linearly from 0 at step 0 to 1 at warmup_steps, then follows eq. 10,
    lambda = 1/2 (1 + cos(s / T * pi / 2)), s = step - warmup_steps, T = total - warmup.
    Note: eq. 10 as printed ends at 0.5 (cos(pi / 2) = 0), not 0; implemented as printed.
    Steps past total_steps stay at the end value.
    """
    if warmup_steps < 0 or total_steps < warmup_steps:
        raise DistinctcapError(
            f"progressive_lambda needs 0 <= warmup_steps <= total_steps, "
            f"got warmup_steps={warmup_steps}, total_steps={total_steps}"
        )
    step = min(max(step, 0), total_steps)
    if step < warmup_steps:
        return step / warmup_steps
    decay_steps = total_steps - warmup_steps
    if decay_steps == 0:
        return 1.0
    return 0.5 * (1.0 + math.cos((step - warmup_steps) / decay_steps * math.pi / 2))


def unkt_objective(
    mle: Tensor,
    pred: Tensor | None,
    hid_layers: Sequence[Tensor],
    att_layers: Sequence[Tensor],
    lam: float,
    w_pred: float = 1.0,
    w_hid: float = 1.0,
    w_att: float = 1.0,
) -> Tensor:
    """UNKT eq. 9: (1 - lam) L_mle + lam (w_pred L_pred + w_hid sum L_hid^l + w_att sum L_att^l).

    The weights are 1 in the paper; 0 gives the ablations of UNKT Table 3 (w/o L_pred, L_hid,
    L_att). A term whose weight is 0 may be passed as None / an empty list (not computed).
    """
    negative = torch.zeros_like(mle)
    terms = [("pred", w_pred, [] if pred is None else [pred])]
    terms += [("hid", w_hid, hid_layers), ("att", w_att, att_layers)]
    for name, weight, layers in terms:
        if weight == 0:
            continue
        if len(layers) == 0:
            raise DistinctcapError(f"unkt_objective: w_{name}={weight} but no L_{name} given")
        negative = negative + weight * torch.stack(list(layers)).sum()
    return (1 - lam) * mle + lam * negative


def contrastive_loss(
    logp_target_pos: Tensor | None,
    logp_ref_pos: Tensor | None,
    logp_target_neg: Tensor | None = None,
    logp_ref_neg: Tensor | None = None,
    nu: float = 1.0,
) -> Tensor:
    """CL eq. 7-10, returns -J.

    G = ln p_m(c|I) - ln p_n(c|I) (eq. 7, reference p_n detached), h = r_nu(G) =
    1 / (1 + nu exp(-G)) (eq. 3, 8) computed as sigmoid(G - ln nu). With T_n = T_m (CL uses
    nu = 1) and K negatives per positive, eq. 10 is J = mean over the B positives (B,) of ln h
    + mean over all B*K negatives (B, K) of ln(1 - h). Passing None for both negatives gives
    CL(P), None for both positives CL(N) (CL Table 4). G = 0, nu = 1 gives 2 ln 2.
    """
    if nu <= 0:
        raise DistinctcapError(f"contrastive_loss: nu must be > 0, got {nu}")
    log_nu = math.log(nu)
    loss = None
    if logp_target_pos is not None:
        g_pos = logp_target_pos - logp_ref_pos.detach()
        loss = -F.logsigmoid(g_pos - log_nu).mean()
    if logp_target_neg is not None:
        g_neg = logp_target_neg - logp_ref_neg.detach()
        neg = -F.logsigmoid(log_nu - g_neg).mean()
        loss = neg if loss is None else loss + neg
    if loss is None:
        raise DistinctcapError("contrastive_loss needs positive pairs, negative pairs or both")
    return loss


def _caption_set(labels: Tensor, vocab_size: int, pad_id: int) -> Tensor:
    """(B, N) labels -> (B, V) bool, True for every token occurring in the row (pad excluded)."""
    in_caption = torch.zeros(labels.shape[0], vocab_size, dtype=torch.bool, device=labels.device)
    in_caption.scatter_(1, labels, True)
    in_caption[:, pad_id] = False
    return in_caption


def _random_set(
    in_caption: Tensor, pad_id: int, generator: torch.Generator | None = None
) -> Tensor:
    """(B, V) bool: per row, |caption set| tokens drawn uniformly without replacement (no pad)."""
    scores = torch.rand(in_caption.shape, generator=generator, device=in_caption.device)
    scores[:, pad_id] = 2.0  # ranks last, never drawn
    ranks = scores.argsort(dim=1).argsort(dim=1)
    return ranks < in_caption.sum(1, keepdim=True)


def smile_loss(
    logits: Tensor,
    labels: Tensor,
    pad_id: int,
    first_token_mle: bool = True,
    subset: str = "smile",
    generator: torch.Generator | None = None,
) -> Tensor:
    """SMILE eq. 2-3 (App. A Algorithm 1): cross-entropy with the softmax restricted to a subset.

    subset="smile": V_D, the tokens occurring in that sequence's labels (pad excluded).
    subset="reverse" (SMILE §3.4): V \\ V_D plus the current label, V_Si = {w not in V_D} + {w_i}.
    subset="random" (SMILE §3.4): |V_D| tokens drawn once per caption and call, uniformly
    without replacement from the vocabulary (pad excluded), plus the current label at each
    position so the cross-entropy is defined (as in the authors' released code, which also
    appends the label to its random draw; the paper text only says "randomly choose 10 words").
    With first_token_mle (§3.3 "First-token MLE") position 0 uses the full vocabulary.
    logits (B, N, V), labels (B, N) -> scalar, mean over non-pad positions.
    """
    in_caption = _caption_set(labels, logits.shape[-1], pad_id)  # (B, V)
    if subset == "smile":
        allowed = in_caption
    elif subset == "reverse":
        allowed = ~in_caption
        allowed[:, pad_id] = False
    elif subset == "random":
        allowed = _random_set(in_caption, pad_id, generator)
    else:
        raise DistinctcapError(f"smile_loss: unknown subset {subset!r}; allowed: {SMILE_SUBSETS}")
    allowed = allowed.unsqueeze(1).expand_as(logits).clone()  # (B, N, V)
    allowed.scatter_(2, labels.unsqueeze(-1), True)  # the label is always a candidate
    if first_token_mle:
        allowed[:, 0] = True
    return mle_loss(logits.masked_fill(~allowed, float("-inf")), labels, pad_id)


def smile_objective(smile: Tensor, mle: Tensor, lam: float) -> Tensor:
    """SMILE eq. 4: L_overall = lam L_MLE + (1 - lam) L_SMILE, lam in [0, 1] (0: pure SMILE)."""
    return lam * mle + (1 - lam) * smile


def _similarity(text_emb: Tensor, image_emb: Tensor, cosine: bool) -> Tensor:
    """Row-wise dot product or cosine similarity, (B, D) x (B, D) -> (B,)."""
    if cosine:
        return F.cosine_similarity(text_emb, image_emb, dim=-1)
    return (text_emb * image_emb).sum(-1)


def specificity_loss(
    text_emb: Tensor,
    image_emb: Tensor,
    contrastive_image_emb: Tensor | None = None,
    kind: str = "ccos",
) -> Tensor:
    """Specificity losses, eq. 2-5, each the mean over the batch.

    text_emb c (B, D) embeds the generated caption; image_emb i_o (B, D) its own (true) image;
    contrastive_image_emb i_c (B, D) a similar other image (the paper draws it from the top 1%
    most similar images), needed by the contrastive kinds:
    dp -(c . i_o) (eq. 2); cos -cos(c, i_o) (eq. 3); cdp max(0, c . i_c - c . i_o) (eq. 4);
    ccos max(0, cos(c, i_c) - cos(c, i_o)) (eq. 5), 0 when the true image is the more similar.
    """
    if kind not in SPECIFICITY_KINDS:
        raise DistinctcapError(
            f"specificity_loss: unknown kind {kind!r}; allowed: {SPECIFICITY_KINDS}"
        )
    cosine = kind in ("cos", "ccos")
    true_sim = _similarity(text_emb, image_emb, cosine)
    if kind in ("dp", "cos"):
        return -true_sim.mean()
    if contrastive_image_emb is None:
        raise DistinctcapError(f"specificity_loss kind {kind!r} needs contrastive_image_emb")
    return (_similarity(text_emb, contrastive_image_emb, cosine) - true_sim).clamp_min(0).mean()
