"""The loss of `method: label_smoothing`, a pure function of tensors: the token cross-entropy
against targets smoothed towards the uniform distribution (Szegedy et al. 2016, "Rethinking the
Inception Architecture for Computer Vision", §7):

    q'(k) = (1 - eps) [k = y] + eps / V
    L = -sum_k q'(k) log p(k) = (1 - eps) (-log p(y)) + eps * mean_k (-log p(k))

averaged over the non-pad tokens of the batch, as MLE (UNKT eq. 1) is.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothing_loss(logits: Tensor, labels: Tensor, pad_id: int, epsilon: float) -> Tensor:
    """logits (B, N, V), labels (B, N) -> the mean over non-pad positions of
    (1 - eps) (-log p(y)) + eps * mean_k (-log p(k)) (§7); eps = 0 is MLE's loss."""
    logp = F.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, N)
    uniform = -logp.mean(dim=-1)  # (B, N)
    per_token = (1 - epsilon) * nll + epsilon * uniform
    mask = (labels != pad_id).float()
    return (per_token * mask).sum() / mask.sum().clamp(min=1)
