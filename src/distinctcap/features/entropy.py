"""Retrieval entropy of the training captions (UNKT §3.1, eq. 3), the score D- / D+ split on.

For a caption y and the training images x_1..x_N,
    p_r(x_i | y) = softmax_i(s_i),   s_i = scale * cos(y, x_i),
    H(y) = -sum_i p_r(x_i | y) log p_r(x_i | y) = log Z - E_p[s]      (eq. 3, natural log)
with log Z = logsumexp_i s_i. `retrieval_entropy` computes it exactly in one streamed pass over
image chunks with a running log-sum-exp, so memory holds (text block x image chunk) tiles,
never the N_text x N_images matrix (COCO: 591,753 x 118,287). The stage (`score_captions`)
reads both sides from the store as it goes (`entropies_by_image_chunks`): the train images'
embeddings CHUNKS_PER_READ chunks at a time, and for each such read the captions' embeddings
block by block (`train_text_blocks`). So its memory holds a read of images (64 MB), a shard
of captions and three floats per caption, not the 1.2 GB of caption embeddings it held whole,
twice, nor the 242 MB of image embeddings it held whole, before issue 55.

Only the train split is scored; `features.subsets` ranks the scores into D- and D+.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from distinctcap.core.devices import CPU
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_json
from distinctcap.core.logs import progress
from distinctcap.features.read import (
    feature_ids,
    pooled_reads,
    text_caption_ids,
    text_feature_shards,
)
from distinctcap.features.store import check_finite

log = logging.getLogger(__name__)


def _mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = a @ b.T. fp16/bf16 inputs with an fp32 `out`: on CUDA the product itself is
    accumulated and returned in fp32 (mm's out_dtype, CUDA only); elsewhere it is upcast."""
    if a.dtype == out.dtype:
        return torch.mm(a, b.T, out=out)
    if a.is_cuda:
        return out.copy_(torch.mm(a, b.T, out_dtype=out.dtype))
    return out.copy_(a @ b.T)


def _tiles(rows: int, images: int, chunk: int, acc: torch.dtype, device) -> tuple:
    """The two (rows x chunk) work tiles of a streamed entropy, allocated once for every block:
    fresh multi-MB buffers per chunk cost page faults, and per block they fragmented glibc's
    heap (issue 55: +1.5 GB over 160 blocks kept beside their small results)."""
    tile_s = torch.empty(rows * min(chunk, images), dtype=acc, device=device)
    return tile_s, torch.empty_like(tile_s)


def _absorb(state: tuple | None, s: torch.Tensor, e: torch.Tensor) -> tuple:
    """The running state of a streamed entropy after one more chunk of logits `s` (rows x
    chunk, overwritten; `e` a tile of its shape).

    Per row: m (max logit so far), z = sum exp(s - m), a = sum exp(s - m)(s - m). Then
    H = log Z - E[s] = log z - a / z (`_entropy`), all in offsets from m (no cancellation of
    large logits). When m grows to m', old terms rescale by exp(m - m') and their offset by
    (m - m')."""
    m_chunk = s.amax(dim=1)
    m_new = m_chunk if state is None else torch.maximum(state[0], m_chunk)
    s.sub_(m_new[:, None])  # s - m' <= 0
    torch.exp(s, out=e)
    z_chunk = e.sum(dim=1)
    a_chunk = torch.bmm(e.unsqueeze(1), s.unsqueeze(2)).view(-1)  # row dots, no temp tile
    if state is None:
        return m_new, z_chunk, a_chunk
    m, z, a = state
    shift = m - m_new  # <= 0
    decay = torch.exp(shift)
    return m_new, decay * z + z_chunk, decay * (a + shift * z) + a_chunk


def _entropy(state: tuple) -> torch.Tensor:
    _, z, a = state
    return torch.log(z) - a / z


def retrieval_entropy(
    text_emb: torch.Tensor,
    image_emb: torch.Tensor,
    logit_scale: float,
    chunk: int = 8192,
    text_chunk: int = 1024,
    matmul_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """UNKT eq. 3: H(y) for every caption embedding y over ALL image embeddings, in nats.

    text_emb (Nt, D), image_emb (Ni, D): L2-normalised CLIP embeddings (cosine = dot product).
    logit_scale: CLIP's exp(t) (the softmax temperature's inverse). Returns (Nt,) in the
    accumulation dtype: float64 for float64 inputs, else float32. Exact (no top-k truncation);
    beyond its inputs, memory holds two text_chunk x chunk tiles (32 MiB each by default),
    whatever N_images. The product runs in `matmul_dtype` (default: the
    accumulation dtype on CPU, float16 on CUDA, with the log-sum-exp always accumulated in fp32).
    """
    if text_emb.shape[0] == 0 and image_emb.shape[0]:
        return torch.empty(0, dtype=_accumulation(text_emb.dtype), device=text_emb.device)
    starts = range(0, text_emb.shape[0], text_chunk)
    return entropies_by_image_chunks(
        lambda: (text_emb[s : s + text_chunk] for s in starts),
        [image_emb],
        logit_scale,
        chunk,
        matmul_dtype,
    )


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _matmul_dtype(block: torch.Tensor) -> torch.dtype:
    """The product's default dtype: float16 on CUDA for float32 inputs, else the accumulation's."""
    acc = _accumulation(block.dtype)
    return torch.float16 if block.is_cuda and acc == torch.float32 else acc


def entropies_by_image_chunks(
    text_blocks: Callable[[], Iterable[torch.Tensor]],
    image_reads: Iterable[torch.Tensor],
    logit_scale: float,
    chunk: int = 8192,
    matmul_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`retrieval_entropy` with the images read in parts, for images too many to hold: each read of
    image embeddings (`image_reads`, a multiple of `chunk` rows each but the last) meets every
    block of caption embeddings (`text_blocks()`, streamed afresh for each read) a `chunk` at a
    time, and each caption keeps its running (m, z, a) between reads. Memory holds a read of
    images, a block of captions and three floats per caption, not the N x D image embeddings
    (242 MB at COCO's size); the captions are read once per read of images. Each caption meets
    the same operations in the same order whatever the reads, so the entropies are the same bit
    for bit as from one read of every image."""
    states: list[tuple] = []
    tiles, seen = None, 0
    for read in image_reads:
        images, seen = None, seen + len(read)
        for k, block in enumerate(text_blocks()):
            if block.shape[-1] != read.shape[-1]:
                raise DistinctcapError(
                    f"text embeddings have dim {block.shape[-1]}, images {read.shape[-1]}"
                )
            acc = _accumulation(block.dtype)
            matmul_dtype = matmul_dtype or _matmul_dtype(block)
            if images is None:
                images = read.to(matmul_dtype).contiguous()
            rows = block.shape[0]
            if tiles is None or tiles[0].dtype != acc or tiles[0].numel() < rows * min(
                chunk, len(images)
            ):
                tiles = _tiles(rows, len(images), chunk, acc, block.device)
            q = (block.to(acc) * logit_scale).to(matmul_dtype)
            state = states[k] if k < len(states) else None
            for start in range(0, len(images), chunk):
                part = images[start : start + chunk]
                s = _mm(q, part, tiles[0][: rows * len(part)].view(rows, len(part)))
                state = _absorb(state, s, tiles[1][: s.numel()].view_as(s))
            states[k : k + 1] = [state]
    if not seen:
        raise DistinctcapError("retrieval entropy needs at least one image")
    return torch.cat([_entropy(state) for state in states]) if states else torch.empty(0)


def train_text_blocks(
    index_path: str | Path, train_ids: np.ndarray, block: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(caption ids, float32 embeddings) of the sorted `train_ids`, read shard by shard
    (features.read.text_feature_shards) and regrouped into blocks of `block` rows: the blocks
    retrieval_entropy cuts from the whole matrix, so the entropies are the same bit for bit.

    Each block is a copy, so a shard is freed as soon as its last block is cut: memory holds
    one shard (100,000 captions, 205 MB, by default) and a block, not a shard, its copy with
    the last one's rest, and the next shard (~3 shards before issue 55's fix)."""
    rest_ids, rest_rows = np.zeros(0, np.int64), None
    for ids, rows in text_feature_shards(index_path, train_ids):
        if len(rest_ids):
            need = block - len(rest_ids)
            rest_ids = np.concatenate([rest_ids, ids[:need]])
            rest_rows = np.concatenate([rest_rows, rows[:need]])
            ids, rows = ids[need:], rows[need:]
            if len(rest_ids) < block:
                continue
            yield rest_ids, rest_rows
        full = len(ids) - len(ids) % block
        for start in range(0, full, block):
            yield ids[start : start + block].copy(), rows[start : start + block].copy()
        rest_ids, rest_rows = ids[full:].copy(), rows[full:].copy()
        del ids, rows  # the shard, before the next one is read
    if len(rest_ids):
        yield rest_ids, rest_rows


# ---------------------------------------------------------------- the stage


# images read at a time, in `chunk`s: 4 reads of 32,768 (64 MB) at COCO's 118,287 training
# images, so the captions' embeddings are read 4 times (~26 CPU s a read there, on 2 cores)
CHUNKS_PER_READ = 4


def _checked(blocks: Iterable[tuple[np.ndarray, np.ndarray]], device) -> Iterator[torch.Tensor]:
    """Each block's embeddings on `device`, stopped at a NaN / inf naming its captions."""
    for ids, rows in blocks:
        txt = torch.from_numpy(rows).to(device)
        check_finite(ids, "caption", txt)
        yield txt


def score_captions(
    index_path: str | Path,
    captions: pd.DataFrame,
    logit_scale: float | None = None,
    chunk: int = 8192,
    text_chunk: int = 1024,
    device: torch.device = CPU,
) -> pd.DataFrame:
    """Retrieval entropy of every train caption over every train image (UNKT eq. 3).

    `logit_scale` None uses the CLIP's own exp(t), recorded in the features index.
    Returns caption_id, image_id, entropy (float32), sorted by caption_id.
    """
    scale = float(read_json(index_path)["logit_scale"] if logit_scale is None else logit_scale)
    train = captions[captions.split == "train"].sort_values("caption_id")
    train_ids = train.caption_id.to_numpy()
    if not np.isin(train_ids, text_caption_ids(index_path)).all():
        raise DistinctcapError(
            f"{index_path} lacks text features of some train captions; "
            "rerun the extract_features rule"
        )
    image_ids = np.intersect1d(feature_ids(index_path), train.image_id.unique())  # sorted
    log.info(
        "retrieval entropy of %d captions over %d images, logit scale %.3f, on %s",
        len(train_ids),
        len(image_ids),
        scale,
        device,
    )
    per_read = chunk * CHUNKS_PER_READ
    reads = pooled_reads(index_path, image_ids, per_read, device)
    entropy = entropies_by_image_chunks(
        lambda: _checked(train_text_blocks(index_path, train_ids, text_chunk), device),
        progress(reads, desc="entropy", total=-(-len(image_ids) // per_read), unit="image reads"),
        scale,
        chunk,
    )
    if len(entropy) != len(train_ids):
        raise DistinctcapError(f"{index_path}: its text shards hold a caption id twice")
    return pd.DataFrame(
        {
            "caption_id": train_ids,
            "image_id": train.image_id.to_numpy(),
            "entropy": entropy.float().cpu().numpy(),
        }
    )
