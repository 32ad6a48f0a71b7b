"""Synthetic stores in the real on-disk format, for the scale harness (bench/bench_scale.py) and
the memory tests: images / captions tables with splits, a vocab, and a features index whose
image and text shards are written by the store's own writers (distinctcap.features.store:
`plan_shards`, `write_shard`, `fixed_list`, `shard_entry`), so readers see exactly what
extract_features writes. The values are random (pooled and text embeddings L2-normalised); no
images exist.

Speed (issue 42: part c of gpu_check.sh spent its GPU minutes here): each kind of feature is
one random block of a shard's rows, drawn once per store; every shard writes that block with a
cheap variation of its own (columns shuffled and signed for the unit vectors, a random mantissa
per column XORed into the float16 grid), so any two shards differ and the values keep their
norms and range. Shards are written by a pool of threads (parquet encodes and compresses
without the GIL). Drawing and writing one grid shard cost about the same before; 118,287
images took ~2 minutes on one thread.

Splits: `test` images (1,000 by default, fixed across sizes so decode and evaluate do the same
work at every size), `val` images in COCO's proportion (4,000 of 118,287), the rest train;
test and val images are spread over the id range, so a split's rows lie in every shard.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from distinctcap.core.io import SCHEMAS, atomic_path, write_json, write_table
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.features.read import grid_cache_path
from distinctcap.features.store import (
    FORMAT,
    Shard,
    digest,
    fixed_list,
    plan_shards,
    shard_entry,
    write_shard,
)

COCO_IMAGES = 118_287
COCO_VAL = 4_000


def split_counts(n: int, test: int = 1000) -> tuple[int, int, int]:
    """(train, val, test) images of a store of `n` images."""
    val = round(COCO_VAL * n / COCO_IMAGES)
    return n - val - test, val, test


def unit_rows(rng: np.random.Generator, rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(L2-normalised normal rows, their norms before normalising): the block every shard
    reuses (drawing per shard cost as much as writing)."""
    values = rng.standard_normal((rows, dim), dtype=np.float32)
    norms = np.linalg.norm(values, axis=1)
    return values / norms[:, None], norms


def grid_bits(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    """float16 bit patterns (uint16) with magnitudes in [2^-3, 2^2) and either sign: finite,
    and far cheaper to draw than normals (the grid is ~98% of the store)."""
    bits = rng.integers(0x3000, 0x4400, (rows, width), dtype=np.uint16)
    bits[:, ::2] |= 0x8000
    return bits


def signed_permutation(rng: np.random.Generator, rows: np.ndarray) -> np.ndarray:
    """`rows` with their columns shuffled and given a random sign each: a shard's unit vectors
    differ from every other shard's (dim! * 2^dim variants) and keep their norm, for one
    gather and one multiply."""
    dim = rows.shape[1]
    signs = rng.choice(np.array([-1.0, 1.0], np.float32), dim)
    return rows[:, rng.permutation(dim)] * signs


def mantissa_mask(rng: np.random.Generator, width: int) -> np.ndarray:
    """A random mantissa (low 10 bits) per column, to XOR into the grid block: each shard's
    grid differs from every other shard's (a reader that mixes shards up is caught), and the
    exponent and sign stay, so the values stay finite and in the block's range."""
    return rng.integers(0, 0x400, width, dtype=np.uint16)


@dataclass(frozen=True)
class Blocks:
    """The random blocks of one store and the per-shard variation of each."""

    seed: int
    pooled: np.ndarray  # (image shard rows, pooled dim), unit rows
    norms: np.ndarray  # the pooled rows' norms before normalising
    grid: np.ndarray  # (image shard rows, tokens * dim) float16 bits as uint16
    texts: np.ndarray  # (text shard rows, pooled dim), unit rows

    @classmethod
    def draw(cls, rng, seed, image_rows, text_rows, grid_width, pooled_dim) -> Blocks:
        pooled, norms = unit_rows(rng, image_rows, pooled_dim)
        grid = grid_bits(rng, image_rows, grid_width)
        return cls(seed, pooled, norms, grid, unit_rows(rng, text_rows, pooled_dim)[0])

    def grid_of(self, shard: Shard) -> np.ndarray:
        """The shard's grid, float16 (rows, tokens * dim): one function for the shard and the
        grid cache, so the two cannot differ."""
        vary = np.random.default_rng([self.seed, 2, shard.index])
        return (self.grid[: len(shard.rows)] ^ mantissa_mask(vary, self.grid.shape[1])).view(
            np.float16
        )

    def image_columns(self, shard: Shard, image_ids: np.ndarray) -> dict[str, pa.Array]:
        rows, vary = len(shard.rows), np.random.default_rng([self.seed, 0, shard.index])
        return {
            "image_id": pa.array(image_ids[shard.rows], pa.int64()),
            "pooled": fixed_list(signed_permutation(vary, self.pooled[:rows])),
            "pooled_norm": pa.array(self.norms[:rows], pa.float32()),
            "grid": fixed_list(self.grid_of(shard)),
        }

    def text_columns(self, shard: Shard, caption_ids: np.ndarray) -> dict[str, pa.Array]:
        rows, vary = len(shard.rows), np.random.default_rng([self.seed, 1, shard.index])
        return {
            "caption_id": pa.array(caption_ids[shard.rows], pa.int64()),
            "embedding": fixed_list(signed_permutation(vary, self.texts[:rows])),
        }


def write_shards(shards: list[Shard], columns, ids: np.ndarray, workers: int) -> None:
    """Each shard's `columns(shard, ids)`, written by `workers` threads; at most `workers`
    shards are in memory at once (each is built in its own task)."""
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda shard: write_shard(shard, columns(shard, ids)), shards))


def write_grid_cache(features: Path, blocks: Blocks, shards: list[Shard], tokens: int) -> None:
    """The grid cache training reads (features.read.grid_cache: an .npy of every image's grid
    in id order, where `grid_cache_path` looks), written from the blocks with plain writes:
    building it from the shards re-decodes every grid, ~1 minute of part c's GPU minutes at
    118,287 images (issue 42); that build holds one row group, so training's peak is the same."""
    width = blocks.grid.shape[1]
    count = sum(len(s.rows) for s in shards)
    header = {"descr": "<f2", "fortran_order": False, "shape": (count, tokens, width // tokens)}
    with atomic_path(grid_cache_path(features)) as tmp, open(tmp, "wb") as f:
        np.lib.format.write_array_header_2_0(f, header)
        for shard in shards:
            f.write(blocks.grid_of(shard).data)


def write_images(rng: np.random.Generator, n_images: int, test: int, path: Path):
    """images.parquet; returns (image ids, split of each image)."""
    _, n_val, n_test = split_counts(n_images, test)
    image_ids = np.arange(1, n_images + 1, dtype=np.int64) * 7  # sparse, sorted, like COCO's
    split = np.full(n_images, "train", dtype=object)
    chosen = rng.choice(n_images, n_val + n_test, replace=False)
    split[chosen[:n_val]], split[chosen[n_val:]] = "val", "test"
    images = pd.DataFrame(
        {
            "image_id": image_ids,
            "file": [f"synthetic/{i}.jpg" for i in image_ids],
            "split": split,
            "width": np.full(n_images, 640, np.int32),
            "height": np.full(n_images, 480, np.int32),
        }
    )
    write_table(images, path, "images")
    return image_ids, split


def write_captions(rng, image_ids, split, per_image: int, vocab_size: int, path: Path):
    """captions.parquet (random token ids, 8-16 per caption); returns the caption ids."""
    n_caps = len(image_ids) * per_image
    caption_ids = np.arange(n_caps, dtype=np.int64) + 1
    owner = np.repeat(np.arange(len(image_ids)), per_image)
    lengths = rng.integers(8, 17, n_caps)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = rng.integers(4, vocab_size, int(offsets[-1]), dtype=np.int32)
    captions = pa.table(
        {
            "caption_id": caption_ids,
            "image_id": image_ids[owner],
            "split": pa.array(split[owner].astype(str)),
            "text": pa.array([f"synthetic caption {c}" for c in caption_ids]),
            "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
        },
        schema=SCHEMAS["captions"],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(captions, tmp)
    return caption_ids


def write_store(
    root: str | Path,
    n_images: int,
    *,
    test: int = 1000,
    captions_per_image: int = 5,
    grid_tokens: int = 49,
    grid_dim: int = 768,
    pooled_dim: int = 512,
    vocab_size: int = 10_000,
    image_shard_size: int = 1024,
    text_shard_size: int = 16384,
    seed: int = 0,
    workers: int | None = None,
    grid_cache: bool = False,
) -> dict[str, Path]:
    """Write a store under `root`, its shards by `workers` threads (default: the cores, at
    most 8; beyond that the disk is the limit), and with `grid_cache` the grid cache training
    would otherwise build first; returns the paths (images, captions, vocab, features)."""
    root, rng = Path(root), np.random.default_rng(seed)
    workers = workers or min(8, os.cpu_count() or 1)
    paths = {
        "images": root / "data/images.parquet",
        "captions": root / "data/captions.parquet",
        "vocab": root / "data/vocab.json",
        "features": root / "features/index.json",
    }
    image_ids, split = write_images(rng, n_images, test, paths["images"])
    caption_ids = write_captions(
        rng, image_ids, split, captions_per_image, vocab_size, paths["captions"]
    )
    # captioner id i -> a CLIP BPE id (open_clip's vocabulary has 49,408 tokens)
    clip_ids = [0, 49406, 49407, 8344] + list(range(1000, 1000 + vocab_size - 4))
    CaptionTokenizer(clip_ids).save(paths["vocab"])

    info = {"format": FORMAT, "arch": "synthetic", "pretrained": None, "seed": seed}
    fingerprint = digest(info)
    cache = root / "cache/features"
    img_shards = plan_shards("images", image_ids.tolist(), image_shard_size, fingerprint, cache)
    txt_shards = plan_shards("texts", caption_ids.tolist(), text_shard_size, fingerprint, cache)
    blocks = Blocks.draw(
        rng, seed, image_shard_size, text_shard_size, grid_tokens * grid_dim, pooled_dim
    )
    write_shards(img_shards, blocks.image_columns, image_ids, workers)
    write_shards(txt_shards, blocks.text_columns, caption_ids, workers)
    index_root = paths["features"].parent
    write_json(
        {
            "manifest": info,
            "fingerprint": fingerprint,
            "logit_scale": 100.0,
            "images": {
                "count": n_images,
                "pooled_dim": pooled_dim,
                "grid_tokens": grid_tokens,
                "shards": [shard_entry(s, index_root) for s in img_shards],
            },
            "texts": {
                "count": len(caption_ids),
                "shards": [shard_entry(s, index_root) for s in txt_shards],
            },
        },
        paths["features"],
    )
    if grid_cache:
        write_grid_cache(paths["features"], blocks, img_shards, grid_tokens)
    return paths
