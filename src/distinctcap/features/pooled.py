"""Pooled image embeddings of the evaluated splits in one parquet file: the judge CLIP's features
(evaluate.judge, rule judge_features; docs/report.md, "The judge CLIP").

The images go through extract_features' own loader and encoder (distinctcap.features.extract:
the CLIP's resize/crop, the configured decoder and precision), so the judge's embeddings are
computed exactly as the trainer CLIP's are; only the pooled embedding is kept (the evaluation
reads no grid, no stored text embedding), of the val and test images only (no training image
is ranked or scored), in one file: a few thousand rows, minutes at most, so no resumable shards.

Layout: image_id int64, pooled fixed_size_list<float>[D] (L2-normalised), sorted by image_id,
written atomically; its metadata key `distinctcap.manifest` holds extract.manifest (arch,
pretrained, tag, weights sha256, preprocessing, precision), from which the evaluation loads the
same CLIP to encode the captions (`read_pooled`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from distinctcap.clip.load import LoadedClip, byte_transform
from distinctcap.core.devices import CPU
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path
from distinctcap.features.extract import (
    FeatureSettings,
    compute_dtype,
    decoder,
    encode_images,
    image_loader,
    manifest,
)
from distinctcap.features.read import _rows, feature_rows
from distinctcap.features.store import Shard, check_finite, fixed_list

MANIFEST_KEY = b"distinctcap.manifest"
EVALUATED_SPLITS = ("val", "test")


def extract_pooled(
    images: pd.DataFrame,
    clip: LoadedClip,
    path: str | Path,
    settings: FeatureSettings | None = None,
    device: torch.device = CPU,
    threads: int | None = None,
    splits: Sequence[str] = EVALUATED_SPLITS,
) -> None:
    """The pooled, L2-normalised embedding by `clip` of every image of `splits` -> `path`
    (module docstring). `settings` and `threads` as extract_features'."""
    settings = settings or FeatureSettings()
    dtype = compute_dtype(settings.precision, device)
    clip.model.to(device).eval()
    images = images[images.split.isin(splits)].sort_values("image_id").reset_index(drop=True)
    if images.empty:
        raise DistinctcapError(f"no images of the splits {list(splits)} to embed")
    info = manifest(clip, dtype, decoder(settings, device, clip))
    every = Shard("images", 0, np.arange(len(images)), "", Path(path))  # the loader's batch plan
    pixels = image_loader(images.file.tolist(), clip, [every], settings, device, threads)
    mean, std = byte_transform(clip.preprocess)[1:]
    pooled = torch.cat(
        [p.cpu() for p, _, _ in encode_images(clip, pixels, device, dtype, mean, std)]
    )
    ids = images.image_id.to_numpy(dtype=np.int64)
    check_finite(ids, "image", pooled)
    table = pa.table({"image_id": pa.array(ids, pa.int64()), "pooled": fixed_list(pooled.numpy())})
    table = table.replace_schema_metadata({MANIFEST_KEY: json.dumps(info, sort_keys=True)})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_pooled(path: str | Path, image_ids: Sequence[int]) -> tuple[np.ndarray, dict]:
    """(pooled float32 (N, D) of `image_ids` in that order, the manifest) of an
    `extract_pooled` file; a DistinctcapError names ids that have none."""
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    if MANIFEST_KEY not in meta:
        raise DistinctcapError(f"{path} holds no judge features manifest; rerun judge_features")
    rows = feature_rows(table.column("image_id").to_numpy().astype(np.int64), image_ids)
    return _rows(table, "pooled", np.float32)[rows], json.loads(meta[MANIFEST_KEY])
