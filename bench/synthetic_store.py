"""Synthetic stores in the real on-disk format, for the scale harness (bench/bench_scale.py) and
the memory tests: images / captions tables with splits, a vocab, and a features index whose
image and text shards are written by the store's own writers (distinctcap.features.store:
`plan_shards`,
`write_shard`, `fixed_list`, `shard_entry`), so readers see exactly what extract_features
writes. The values are random (pooled and text embeddings L2-normalised); no images exist.

Splits: `test` images (1,000 by default, fixed across sizes so decode and evaluate do the same
work at every size), `val` images in COCO's proportion (4,000 of 118,287), the rest train;
test and val images are spread over the id range, so a split's rows lie in every shard.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from distinctcap.core.io import SCHEMAS, atomic_path, write_json, write_table
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.features.store import (
    FORMAT,
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
) -> dict[str, Path]:
    """Write a store under `root`; returns the paths (images, captions, vocab, features)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    n_train, n_val, n_test = split_counts(n_images, test)
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
    paths = {
        "images": root / "data/images.parquet",
        "captions": root / "data/captions.parquet",
        "vocab": root / "data/vocab.json",
        "features": root / "features/index.json",
    }
    write_table(images, paths["images"], "images")

    n_caps = n_images * captions_per_image
    caption_ids = np.arange(n_caps, dtype=np.int64) + 1
    owner = np.repeat(np.arange(n_images), captions_per_image)
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
    paths["captions"].parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(paths["captions"]) as tmp:
        pq.write_table(captions, tmp)
    del captions, tokens
    # captioner id i -> a CLIP BPE id (open_clip's vocabulary has 49,408 tokens)
    clip_ids = [0, 49406, 49407, 8344] + list(range(1000, 1000 + vocab_size - 4))
    CaptionTokenizer(clip_ids).save(paths["vocab"])

    info = {"format": FORMAT, "arch": "synthetic", "pretrained": None, "seed": seed}
    fingerprint = digest(info)
    cache = root / "cache/features"
    img_shards = plan_shards("images", image_ids.tolist(), image_shard_size, fingerprint, cache)
    for shard in img_shards:
        rows = len(shard.rows)
        pooled = rng.standard_normal((rows, pooled_dim), dtype=np.float32)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        pooled /= norms
        # float16 bit patterns with magnitudes in [2^-3, 2^2) and either sign: finite, and far
        # cheaper to draw than normals (the grid is ~98% of the store)
        bits = rng.integers(0x3000, 0x4400, (rows, grid_tokens * grid_dim), dtype=np.uint16)
        bits[:, ::2] |= 0x8000
        write_shard(
            shard,
            {
                "image_id": pa.array(image_ids[shard.rows], pa.int64()),
                "pooled": fixed_list(pooled),
                "pooled_norm": pa.array(norms.ravel(), pa.float32()),
                "grid": fixed_list(bits.view(np.float16)),
            },
        )
        del bits
    txt_shards = plan_shards("texts", caption_ids.tolist(), text_shard_size, fingerprint, cache)
    for shard in txt_shards:
        emb = rng.standard_normal((len(shard.rows), pooled_dim), dtype=np.float32)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        write_shard(
            shard,
            {
                "caption_id": pa.array(caption_ids[shard.rows], pa.int64()),
                "embedding": fixed_list(emb),
            },
        )
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
                "count": n_caps,
                "shards": [shard_entry(s, index_root) for s in txt_shards],
            },
        },
        paths["features"],
    )
    return paths
