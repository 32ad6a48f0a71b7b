"""Distinctiveness by retrieval: CLIP self-retrieval R@k / mean rank (SMILE §4, specificity
paper §4 "recall at k", "mean rank"), CLIPScore and RefCLIPScore (Hessel et al. 2021, SMILE
§4), and the captioner's own self-retrieval from log p(c | I) (CL §4.1).

Embeddings are (rows, D) numpy arrays or CPU torch tensors; rows are L2-normalised here, so
any CLIP output works. The ranks (1-based, ties counted against the caption) are
`distinctcap.scores.ranks`, which checkpoint selection shares.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import CLIPSCORE_PREFIX  # noqa: F401  (re-export)
from distinctcap.scores.ranks import ranks_from_scores, retrieval_ranks, unit_rows
from distinctcap.scores.result import MetricResult

# CLIPSCORE_PREFIX (data.tokenizer, shared with the CLIPScore reward of training) goes before
# candidates and references for CLIPScore / RefCLIPScore. Self-retrieval (SMILE) encodes the
# caption as it is.


def recall_at_k(
    ranks: np.ndarray, ks: Sequence[int] = (1, 5, 10), prefix: str = ""
) -> dict[str, float]:
    """{prefix + "r_at_k": share of captions whose image ranks within the top k} (fractions)."""
    ranks = np.asarray(ranks)
    return {f"{prefix}r_at_{k}": float(np.mean(ranks <= k)) for k in ks}


def mean_rank(ranks: np.ndarray) -> float:
    """Mean 1-based rank of the correct image (specificity paper §4; lower is better)."""
    return float(np.mean(ranks))


def retrieval_scores(
    text_emb: object,
    image_emb: object,
    target_index: Sequence[int] | np.ndarray,
    ks: Sequence[int] = (1, 5, 10),
) -> MetricResult:
    """CLIP self-retrieval columns r_at_1, r_at_5, r_at_10 (fractions) and mean_rank."""
    return rank_summary(retrieval_ranks(text_emb, image_emb, target_index), ks)


def rank_summary(ranks: np.ndarray, ks: Sequence[int], prefix: str = "") -> MetricResult:
    """{prefix}r_at_k (`recall_at_k`) and {prefix}mean_rank (`mean_rank`) of 1-based ranks."""
    out = MetricResult(recall_at_k(ranks, ks, prefix=prefix))
    out.values[f"{prefix}mean_rank"] = mean_rank(ranks)
    return out


def clipscores(text_emb: object, image_emb: object, w: float = 2.5) -> np.ndarray:
    """CLIPScore of each pair (Hessel et al. 2021 eq. 1): w * max(cos(t_i, v_i), 0), float32.

    Row i of `text_emb` is caption i encoded with CLIPSCORE_PREFIX prepended, row i of
    `image_emb` its image. Range [0, w]; papers print it x100.
    """
    text, image = unit_rows(text_emb, "text_emb"), unit_rows(image_emb, "image_emb")
    if text.shape != image.shape:
        raise DistinctcapError(f"clipscore pairs rows: text {text.shape} vs image {image.shape}")
    return w * np.clip((text * image).sum(axis=1), 0.0, None)


def clipscore(text_emb: object, image_emb: object, w: float = 2.5) -> float:
    """CLIPScore (Hessel et al. 2021 eq. 1): the mean over pairs of `clipscores`."""
    return float(np.mean(clipscores(text_emb, image_emb, w)))


def refclipscores(
    text_emb: object,
    image_emb: object,
    ref_emb: object,
    ref_owner: Sequence[int] | np.ndarray,
    w: float = 2.5,
) -> np.ndarray:
    """RefCLIPScore of each candidate (Hessel et al. 2021 eq. 2), float32:
    H-Mean(CLIPScore(c, v), max(max_r cos(c, r), 0)) over the references r of its image.

    Rows of `text_emb` and `image_emb` as in `clipscores`; `ref_emb` (R, D) holds every
    reference, encoded like the candidates (with CLIPSCORE_PREFIX), and `ref_owner` (R,) the
    candidate row each belongs to; every candidate needs one. The paper's equation, not their
    clipscore.py where it differs: the text side is clipped at 0 (their code takes the raw
    maximum), and a harmonic mean with a side at 0 is 0 (their code divides 0 by 0 when
    both are). Range [0, 2w / (w + 1)] = [0, 1.43] at w = 2.5.
    """
    image_side = clipscores(text_emb, image_emb, w)
    text_side = np.clip(best_reference_cosines(text_emb, ref_emb, ref_owner), 0.0, None)
    return harmonic_mean(image_side, text_side)


def best_reference_cosines(
    text_emb: object, ref_emb: object, ref_owner: Sequence[int] | np.ndarray
) -> np.ndarray:
    """max over the references r of candidate i (`ref_owner` == i) of cos(c_i, r), float32."""
    text, refs = unit_rows(text_emb, "text_emb"), unit_rows(ref_emb, "ref_emb")
    owner = np.asarray(ref_owner, dtype=np.int64)
    if refs.shape[1] != text.shape[1] or owner.shape != (len(refs),):
        raise DistinctcapError(
            f"text_emb {text.shape}, ref_emb {refs.shape} and ref_owner {owner.shape} must be "
            "(N, D), (R, D) and (R,)"
        )
    if len(owner) and (owner.min() < 0 or owner.max() >= len(text)):
        raise DistinctcapError(f"ref_owner must lie in [0, {len(text)}) (rows of text_emb)")
    best = np.full(len(text), -np.inf, dtype=np.float32)
    np.maximum.at(best, owner, (refs * text[owner]).sum(axis=1))
    orphans = np.flatnonzero(np.isneginf(best))
    if len(orphans):
        raise DistinctcapError(f"candidates {orphans[:5].tolist()} have no reference")
    return best


def harmonic_mean(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """2ab / (a + b) of non-negative arrays, elementwise; 0 where a side is 0 (its limit)."""
    a, b = np.asarray(a), np.asarray(b)
    total = a + b
    return np.divide(2 * a * b, total, out=np.zeros_like(total), where=total > 0)


def model_self_retrieval(
    logp_matrix: object, target: int | Sequence[int] = 0, ks: Sequence[int] = (1, 5, 10)
) -> MetricResult:
    """Self-retrieval with the captioner itself (CL §4.1): rank images by log p(c_t | I).

    `logp_matrix` (N_caps, pool): each caption's sequence log-probability under every pool
    image; `target` is the column of its own image (0 by default, or one per caption).
    Returns self_r_at_k (fractions) and self_mean_rank.
    """
    scores = np.asarray(logp_matrix, dtype=np.float64)
    if scores.ndim != 2:
        raise DistinctcapError(f"logp_matrix must be (N_caps, pool), got shape {scores.shape}")
    if np.isnan(scores).any():
        raise DistinctcapError("logp_matrix holds NaN log-probabilities")
    cols = np.broadcast_to(np.asarray(target, dtype=np.int64), (len(scores),))
    if len(cols) and (cols.min() < 0 or cols.max() >= scores.shape[1]):
        raise DistinctcapError(f"target must lie in [0, {scores.shape[1]}) (pool columns)")
    return rank_summary(ranks_from_scores(scores, cols), ks, prefix="self_")
