"""Retrieval ranks by cosine: CLIP self-retrieval of the evaluation
and checkpoint selection through a frozen CLIP (methods.clipval).

Embeddings are (rows, D) numpy arrays or CPU torch tensors; rows are L2-normalised here, so
any CLIP output works. Ranks are 1-based and count ties against the caption (rank = number of
pool images scoring at least as high as the target), so a degenerate constant embedding
cannot score well.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distinctcap.core.errors import DistinctcapError


def unit_rows(x: object, name: str) -> np.ndarray:
    """x (rows, D), a numpy array or a tensor, as float32 rows of norm 1 (0 rows stay 0)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    a = np.asarray(x, dtype=np.float32)
    if a.ndim != 2:
        raise DistinctcapError(f"{name} must be a (rows, D) matrix, got shape {a.shape}")
    norm = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.maximum(norm, 1e-12)


def ranks_from_scores(scores: np.ndarray, target: np.ndarray) -> np.ndarray:
    """1-based rank of column target[i] in row i of scores, ties counted against it."""
    own = scores[np.arange(len(scores)), target]
    return (scores >= own[:, None]).sum(axis=1)


def retrieval_ranks(
    text_emb: object, image_emb: object, target_index: Sequence[int] | np.ndarray, chunk: int = 1024
) -> np.ndarray:
    """1-based rank of each caption's own image among all `image_emb` rows by cosine.

    text_emb (N, D), image_emb (M, D), target_index (N,) = row of each caption's image. A hard
    retrieval pool (SMILE, after CapEnrich) is just a bigger `image_emb`: append the extra
    similar images after the test images and keep `target_index` pointing at the test rows.
    """
    text, image = unit_rows(text_emb, "text_emb"), unit_rows(image_emb, "image_emb")
    target = np.asarray(target_index, dtype=np.int64)
    if text.shape[1] != image.shape[1] or target.shape != (len(text),):
        raise DistinctcapError(
            f"text_emb {text.shape}, image_emb {image.shape} and target_index {target.shape} "
            "must be (N, D), (M, D) and (N,)"
        )
    if len(target) and (target.min() < 0 or target.max() >= len(image)):
        raise DistinctcapError(f"target_index must lie in [0, {len(image)}) (rows of image_emb)")
    ranks = np.empty(len(text), dtype=np.int64)
    for start in range(0, len(text), chunk):
        stop = start + chunk
        ranks[start:stop] = ranks_from_scores(text[start:stop] @ image.T, target[start:stop])
    return ranks
