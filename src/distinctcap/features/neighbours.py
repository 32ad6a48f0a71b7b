"""The contrastive-image table of the specificity method (specificity paper §3.2, eq. 4-5).

For the contrastive losses the paper draws I_c "at random from the top 1% most similar images
to I_o"; we measure similarity by the cosine of the CLIP pooled image embeddings (the paper used
the captioner CNN's last conv activations). The table is computed once per fraction and cached:
one row per training image, `image_id` int64 and `neighbours` list<int64> of the k most similar
other training images, most similar first, with k = max(1, ceil(fraction * (N - 1))).

The similarity matrix is never held whole: query rows are processed `chunk` at a time against
all N images (memory chunk x N), so COCO's 118k images fit, and the table is streamed to
parquet one row group per chunk.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import Tensor

from distinctcap.core.devices import CPU
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, read_table
from distinctcap.core.logs import progress
from distinctcap.features.read import feature_ids, load_image_features

log = logging.getLogger(__name__)

ROOT = "results/neighbours"
SCHEMA = pa.schema([("image_id", pa.int64()), ("neighbours", pa.list_(pa.int64()))])


def table_path(pct: float, root: str = ROOT) -> str:
    """The cached table of the top `pct` percent, e.g. results/neighbours/train_top1pct.parquet
    (the `{pct}` wildcard of the neighbours rule; a run picks it with `contrastive_top_pct`)."""
    return f"{root}/train_top{float(pct):g}pct.parquet"


def neighbour_count(n: int, fraction: float) -> int:
    """k = max(1, ceil(fraction * (n - 1))): the top `fraction` of the n - 1 other images."""
    if not 0 < fraction <= 1:
        raise DistinctcapError(f"neighbour fraction {fraction}: allowed 0 < fraction <= 1")
    if n < 2:
        raise DistinctcapError(f"{n} training image(s): contrastive images need at least 2")
    return min(n - 1, max(1, math.ceil(fraction * (n - 1))))


SIMILARITY_BYTES = 64 * 2**20  # a chunk's (rows x N) float32 similarities at most


def _chunks(emb: Tensor, k: int, chunk: int):
    """Yield (start, rows (c, k) int64 on CPU) of the k most similar other images per row,
    `chunk` rows at a time, fewer where chunk x N similarities would pass SIMILARITY_BYTES
    (issue 55: 1,024 x 118,287 were 484 MB, growing with N)."""
    n = emb.shape[0]
    chunk = max(1, min(chunk, SIMILARITY_BYTES // (4 * n)))
    for s in range(0, n, chunk):
        q = emb[s : s + chunk]  # (c, D)
        sims = q @ emb.T  # (c, N)
        own = torch.arange(q.shape[0], device=emb.device)
        sims[own, own + s] = float("-inf")  # self excluded
        yield s, sims.topk(k, dim=1).indices.cpu()


def top_neighbours(
    emb: Tensor, k: int, chunk: int = 1024, device: str | torch.device = "cpu"
) -> Tensor:
    """Rows of the k most similar other rows of `emb` (N, D) (L2-normalised, so dot = cosine),
    most similar first -> (N, k) int64. Ties are broken arbitrarily (torch.topk)."""
    emb = torch.as_tensor(emb, dtype=torch.float32).to(device)
    if not 1 <= k < emb.shape[0]:
        raise DistinctcapError(f"k = {k} neighbours of {emb.shape[0]} images: allowed 1..N-1")
    return torch.cat([rows for _, rows in _chunks(emb, k, chunk)])


def write_neighbours(
    image_ids: Sequence[int] | np.ndarray,
    emb: Tensor | np.ndarray,
    path: str | os.PathLike,
    fraction: float = 0.01,
    chunk: int = 1024,
    device: str | torch.device = "cpu",
) -> int:
    """Compute the table of `image_ids` with pooled embeddings `emb` (N, D) and write it to
    `path` atomically, streamed one row group per chunk. Returns k."""
    ids = np.asarray(image_ids, dtype=np.int64)
    emb = torch.as_tensor(np.asarray(emb), dtype=torch.float32)
    if emb.ndim != 2 or len(ids) != emb.shape[0]:
        raise DistinctcapError(f"{len(ids)} image ids but embeddings of shape {tuple(emb.shape)}")
    if not torch.isfinite(emb).all():
        bad = ids[(~torch.isfinite(emb).all(dim=1)).numpy()][:10].tolist()
        raise DistinctcapError(f"non-finite image embeddings for image ids {bad} (first 10)")
    k = neighbour_count(len(ids), fraction)
    emb = emb.to(device)
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, SCHEMA) as writer:
        with progress(total=len(ids), unit="images", desc=f"neighbours (top {k})") as bar:
            for s, rows in _chunks(emb, k, chunk):
                c = rows.shape[0]
                offsets = pa.array(np.arange(0, (c + 1) * k, k, dtype=np.int32))
                values = pa.array(ids[rows.numpy().reshape(-1)])
                lists = pa.ListArray.from_arrays(offsets, values)
                writer.write_table(pa.table([pa.array(ids[s : s + c]), lists], schema=SCHEMA))
                bar.update(c)
    return k


def rows_of(index: pd.Index, image_ids: np.ndarray) -> np.ndarray:
    """The feature rows (int32, `image_ids`' shape) of image ids that must all have features."""
    rows = index.get_indexer(image_ids.reshape(-1).astype(np.int64, copy=False))
    if (rows < 0).any():
        missing = image_ids.reshape(-1)[rows < 0]
        raise DistinctcapError(
            f"neighbour table names image ids without features: {missing[:10].tolist()}"
        )
    return rows.astype(np.int32).reshape(image_ids.shape)


def read_neighbour_rows(path: str | os.PathLike, index: pd.Index) -> tuple[np.ndarray, np.ndarray]:
    """-> image ids (N,) int64 and their neighbours' feature rows in `index` (N, k) int32,
    read a row group at a time."""
    file = pq.ParquetFile(path)
    check_columns(file.schema_arrow, path)
    n = file.metadata.num_rows
    ids, rows, at = np.empty(n, np.int64), None, 0
    for g in range(file.num_row_groups):
        group = file.read_row_group(g)
        lists = group.column("neighbours").combine_chunks()
        k = neighbours_per_row(lists, path)
        rows = np.empty((n, k), np.int32) if rows is None else rows
        if k != rows.shape[1]:
            raise DistinctcapError(f"{path}: rows have different numbers of neighbours")
        ids[at : at + len(group)] = group.column("image_id").to_numpy()
        rows[at : at + len(group)] = rows_of(index, lists.flatten().to_numpy().reshape(-1, k))
        at += len(group)
    return ids, rows if rows is not None else np.empty((0, 0), np.int32)


def check_columns(schema: pa.Schema, path: str | os.PathLike) -> None:
    if schema.names != SCHEMA.names:
        raise DistinctcapError(
            f"{path}: neighbour table needs columns {SCHEMA.names}, has {schema.names}"
        )


def neighbours_per_row(lists: pa.ListArray, path: str | os.PathLike) -> int:
    """k, the neighbours of every row of `lists` (a DistinctcapError if rows differ)."""
    k = len(lists[0]) if len(lists) else 0
    if len(lists) and lists.value_lengths().to_numpy().min() != k:
        raise DistinctcapError(f"{path}: rows have different numbers of neighbours")
    return k


def read_neighbours(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """-> image ids (N,) and neighbour ids (N, k), both int64."""
    table = pq.read_table(path)
    check_columns(table.schema, path)
    ids = table.column("image_id").to_numpy()
    lists = table.column("neighbours").combine_chunks()
    k = neighbours_per_row(lists, path)
    return ids, lists.flatten().to_numpy().reshape(len(ids), k)


class NeighbourTable:
    """Neighbours as rows of an image-feature table, for drawing contrastive images."""

    def __init__(self, image_ids: np.ndarray, neighbour_ids: np.ndarray, feature_ids: np.ndarray):
        """`feature_ids` (F,) are the image ids of the feature rows used in training; every
        image of the table and every neighbour must be among them."""
        index = pd.Index(np.asarray(feature_ids, dtype=np.int64))
        self._fill(index, image_ids, rows_of(index, np.asarray(neighbour_ids)))

    @classmethod
    def load(cls, path: str | os.PathLike, feature_ids: np.ndarray) -> NeighbourTable:
        """The table at `path` (`write_neighbours`), read a row group at a time into its
        int32 feature rows: never the whole table as int64 ids. At COCO's size it has 140
        million neighbours; reading them whole peaked at 6.2 GB in the 123,287-image
        rehearsal's specificity job, for a table that holds 0.56 GB (issue 55)."""
        index = pd.Index(np.asarray(feature_ids, dtype=np.int64))
        table = cls.__new__(cls)
        table._fill(index, *read_neighbour_rows(path, index))
        return table

    def _fill(self, index: pd.Index, image_ids: np.ndarray, neighbour_rows: np.ndarray) -> None:
        """The (N, k) int32 feature rows of each image's neighbours, and each feature row's
        slot in them."""
        rows = rows_of(index, np.asarray(image_ids))
        self.k = neighbour_rows.shape[1]
        # (N, k) feature rows; int32 halves the table (COCO: 118k x 1183 neighbours = 0.56 GB)
        self.neighbours = torch.as_tensor(neighbour_rows)
        self.slot = torch.full((len(index),), -1, dtype=torch.long)  # feature row -> table row
        self.slot[torch.as_tensor(rows, dtype=torch.long)] = torch.arange(len(rows))

    def draw(self, feature_rows: Tensor, generator: torch.Generator) -> Tensor:
        """One neighbour, uniformly among the k, for each image (B,) -> feature rows (B,)."""
        slots = self.slot[feature_rows.cpu()]
        if (slots < 0).any():
            raise DistinctcapError(
                f"feature rows {feature_rows.cpu()[slots < 0].tolist()} are not in the "
                "neighbour table (contrastive images come from the training split)"
            )
        pick = torch.randint(self.k, (len(slots),), generator=generator)
        return self.neighbours[slots, pick].long()


def build_table(
    features_index: str | os.PathLike,
    images_path: str | os.PathLike,
    out: str | os.PathLike,
    pct: float = 1.0,
    device: torch.device = CPU,
    chunk: int = 1024,
) -> int:
    """The stage: the training images' pooled CLIP embeddings (features index JSON, images
    table) -> the table of their top `pct` percent most similar training images. Returns k."""
    images = read_table(images_path, "images", ["image_id", "split"])
    train = np.sort(images.image_id[images.split == "train"].to_numpy(dtype=np.int64))
    missing = np.setdiff1d(train, feature_ids(features_index))
    if len(missing):
        raise DistinctcapError(
            f"no image features for training images {missing[:10].tolist()} (first 10)"
        )
    _, pooled, _ = load_image_features(features_index, grid=False, image_ids=train)  # no copy
    k = write_neighbours(train, pooled, out, pct / 100, chunk, device)
    log.info("%d training images, top %g%% = %d neighbours each -> %s", len(train), pct, k, out)
    return k
