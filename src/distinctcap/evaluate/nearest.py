"""Cosine nearest neighbours of pooled CLIP features, the pool a block at a time.

The evaluate job needs each test image's nearest training images twice, for the consensus
references (evaluate.stage) and for the hard retrieval pool (evaluate.device). COCO has
118,287 training images: their pooled features alone are 242 MB, and a 1,000 x 118,287
similarity matrix with its sort keys is more. `nearest_in_blocks` takes the pool as blocks,
so the caller can read them from the feature store one at a time (evaluate.loaded) and the
job holds one block, never the pool (issue 55).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

POOL_BLOCK = 16_384  # pool rows a block: with 256 query rows, ~80 MB of similarities and keys


def nearest(
    query: np.ndarray, pool: np.ndarray, k: int, chunk: int = 256, pool_chunk: int = POOL_BLOCK
) -> np.ndarray:
    """Rows of the k most cosine-similar `pool` rows for each `query` row -> (Nq, k), most
    similar first (equal similarities by lower row): `nearest_in_blocks` over `pool` cut into
    blocks of `pool_chunk` rows."""
    blocks = (pool[p : p + pool_chunk] for p in range(0, len(pool), pool_chunk))
    return nearest_in_blocks(query, blocks, k, chunk)


def nearest_in_blocks(
    query: np.ndarray, blocks: Iterable[np.ndarray], k: int, chunk: int = 256
) -> np.ndarray:
    """`nearest` with the pool given as consecutive blocks (rows numbered across them), each
    seen once. Memory is bounded by one block and a `chunk` of query rows: each query chunk
    keeps its best k while the blocks pass by. A row's neighbours depend on its own
    similarities only, so neither the chunk nor the block size changes them."""
    starts = range(0, len(query), chunk)
    best: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(starts)
    offset = 0
    for block in blocks:
        for c, s in enumerate(starts):
            sims, rows = block_top_k(query[s : s + chunk] @ block.T, k)
            best[c] = merge_top_k(best[c], sims, offset + rows, k)
        offset += len(block)
    if not best or best[0] is None:  # no query rows, or no blocks
        return np.empty((len(query), min(k, offset)), np.int64)
    return np.vstack([rows for _, rows in best])


def merge_top_k(
    best: tuple[np.ndarray, np.ndarray] | None, sims: np.ndarray, rows: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(similarities, rows) of each query row's k best among `best` and a block's candidates,
    most similar first, equal similarities by lower row."""
    if best is not None:
        sims, rows = np.hstack([best[0], sims]), np.hstack([best[1], rows])
    order = np.lexsort((rows, -sims), axis=1)[:, :k]
    return np.take_along_axis(sims, order, axis=1), np.take_along_axis(rows, order, axis=1)


def block_top_k(sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(similarities, columns) of each row's k highest `sims` (all of them when k or fewer),
    unordered."""
    if sims.shape[1] <= k:
        return sims, np.broadcast_to(np.arange(sims.shape[1]), sims.shape)
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    return np.take_along_axis(sims, top, axis=1), top
