"""Readers of the feature store: a selection of images' rows read row group by row group, the
mapped float16 grid cache that training reads, image norms and text embeddings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import Tensor

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import (
    atomic_path,
    build_once,
    read_json,
    release_arrow_memory,
    row_group_starts,
    rows_in,
)
from distinctcap.features.store import KEY, check_finite, digest

log = logging.getLogger(__name__)


def _shard_files(index_path: str | Path, kind: str) -> tuple[dict, list[pq.ParquetFile]]:
    """The index and its `kind` shards, opened (footer only); each shard's key is checked."""
    index = read_json(index_path)
    root = Path(index_path).parent
    files = []
    for entry in index[kind]["shards"]:
        path = root / entry["path"]
        try:
            # pre_buffer would keep each opened shard's read ranges cached for the file's life:
            # ~+470 MB for 1,000 images' rows from a 40k store (measured), growing with N
            file = pq.ParquetFile(path, pre_buffer=False)
            meta = file.schema_arrow.metadata or {}
        except (OSError, pa.ArrowInvalid):
            file, meta = None, {}
        if file is None or meta.get(KEY, b"").decode() != entry["key"]:
            raise DistinctcapError(
                f"{path} is missing or was computed for other inputs or another CLIP than "
                f"{index_path} records; rerun the extract_features rule"
            )
        files.append(file)
    return index, files


def _rows(table: pa.Table, column: str, dtype) -> np.ndarray:
    """A fixed-size list column of one shard as a (rows, width) array."""
    chunk = table.column(column).combine_chunks()
    flat = chunk.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(-1, chunk.type.list_size).astype(dtype, copy=False)


def _width(files: list[pq.ParquetFile], column: str) -> int:
    return files[0].schema_arrow.field(column).type.list_size


def _gather(file: pq.ParquetFile, local: np.ndarray, columns: dict, into: dict[str, tuple]) -> None:
    """Write rows `local` of one shard's `columns` ({name: dtype}) into `into` ({name: (array,
    positions)}), reading only the row groups that hold one of them, one at a time: parquet
    decodes a list column with per-value levels, about 7x the values, so a read's transient
    is one group's (ROW_GROUP_ROWS rows), not the shard's."""
    starts = row_group_starts(file)
    group_of = np.searchsorted(starts, local, side="right") - 1
    for g in np.unique(group_of):
        pick = np.flatnonzero(group_of == g)
        table = file.read_row_group(int(g), columns=list(columns))
        for name, dtype in columns.items():
            values = _rows(table, name, dtype)
            array, positions = into[name]
            array[positions[pick]] = values[local[pick] - starts[g]]
            del values
        del table
        release_arrow_memory()


def feature_rows(ids: np.ndarray, image_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Row of each of `image_ids` in the sorted `ids`; a DistinctcapError names ids without
    features."""
    want = np.asarray(image_ids, dtype=np.int64)
    rows = rows_in(ids, want)
    if (rows < 0).any():
        missing = want[rows < 0][:10].tolist()
        raise DistinctcapError(f"no image features for image ids {missing} (first 10 shown)")
    return rows


def feature_ids(index_path: str | Path) -> np.ndarray:
    """The image ids of the index's shards, in their order (sorted): the rows of `grid_cache`."""
    per_shard = [
        f.read(columns=["image_id"]).column(0).to_numpy()
        for f in _shard_files(index_path, "images")[1]
    ]
    return np.concatenate(per_shard).astype(np.int64) if per_shard else np.zeros(0, np.int64)


def load_image_features(
    index_path: str | Path,
    grid: bool = True,
    image_ids: Sequence[int] | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(image_ids int64 (N,), pooled float32 (N, D) L2-normalised, grid float16 (N, G, Dv)):
    every image sorted by image_id, or those of `image_ids` in that order (a DistinctcapError
    names ids that have none). `grid=False` skips the grid tokens and returns None for them.

    Reads the shards one at a time and only those that hold a wanted image (module section
    "loaders"): the peak is the answer plus one shard."""
    index, files = _shard_files(index_path, "images")
    per_shard = [f.read(columns=["image_id"]).column(0).to_numpy() for f in files]
    ids = np.concatenate(per_shard).astype(np.int64) if per_shard else np.zeros(0, np.int64)
    if image_ids is None:
        out_ids, want = ids, np.arange(len(ids))
    else:
        out_ids = np.asarray(image_ids, dtype=np.int64)
        want = feature_rows(ids, out_ids)
    columns = {"pooled": np.float32} | ({"grid": np.float16} if grid else {})
    out = (
        {
            name: np.empty((len(out_ids), _width(files, name)), dtype)
            for name, dtype in columns.items()
        }
        if files
        else {}
    )
    starts = np.cumsum([0] + [len(s) for s in per_shard])
    order = np.argsort(want, kind="stable")  # answer positions by row: one slice per shard
    bounds = np.searchsorted(want[order], starts)
    for s, file in enumerate(files):
        dest = order[bounds[s] : bounds[s + 1]]
        if len(dest):
            _gather(file, want[dest] - starts[s], columns, {n: (a, dest) for n, a in out.items()})
    width = index["images"].get("pooled_dim") or 0
    pooled = out.get("pooled", np.zeros((len(out_ids), width), np.float32))
    if not grid:
        return out_ids, pooled, None
    tokens = index["images"]["grid_tokens"]
    flat = out.get("grid", np.zeros((len(out_ids), 0), np.float16))
    return out_ids, pooled, flat.reshape(len(out_ids), tokens, -1)


def pooled_reads(
    index_path: str | Path, image_ids: np.ndarray, chunk: int, device: torch.device | str = "cpu"
) -> Iterator[torch.Tensor]:
    """The pooled embeddings of `image_ids`, `chunk` images a read, each read from the store
    (one shard's decode at a time), stopped at a NaN / inf naming its image."""
    for start in range(0, len(image_ids), chunk):
        ids = image_ids[start : start + chunk]
        _, pooled, _ = load_image_features(index_path, grid=False, image_ids=ids)
        images = torch.from_numpy(pooled).to(device)
        check_finite(ids, "image", images)
        yield images


CACHED = {"grid": "<f2", "pooled": "<f4"}  # the columns kept as one .npy each, their dtype


def grid_cache_path(index_path: str | Path) -> Path:
    """Where `grid_cache` keeps the index's grid (`cache_path`)."""
    return cache_path(index_path, "grid")


def cache_path(index_path: str | Path, column: str) -> Path:
    """Where `cached` keeps the index's `column`: `<column>/<key>.npy` beside the image shards'
    folder, the key a hash of every image shard's key (so of the CLIP and the images)."""
    index = read_json(index_path)
    shards = index["images"]["shards"]
    if not shards:
        raise DistinctcapError(f"{index_path} lists no image shards")
    folder = (Path(index_path).parent / shards[0]["path"]).parent.parent
    key = digest(index["fingerprint"], [s["key"] for s in shards])[:32]
    return folder / column / f"{key}.npy"


def grid_cache(index_path: str | Path) -> np.ndarray:
    """The grid of every image of the index, float16 (N, G, Dv): `cached(index_path, "grid")`."""
    return cached(index_path, "grid")


def cached(index_path: str | Path, column: str) -> np.ndarray:
    """`column` (CACHED) of every image of the index (sorted by image_id, the values
    `load_image_features` gives) as a read-only-on-disk memory map (copy-on-write in memory).

    Built once per features index, under a lock (concurrent jobs wait for one writer instead
    of each writing the same file): the .npy header, then each shard's rows appended with
    plain writes, one row group at a time (written pages are page cache, not the writer's RSS),
    then renamed into place. Other keys' caches in that folder are removed (a job that still
    maps one keeps reading it). Its pages are the file's: the kernel shares them between jobs
    and drops them under pressure, so a training job's memory is the batches it gathers."""
    path = build_once(cache_path(index_path, column), lambda p: _write_cache(index_path, p, column))
    return np.load(path, mmap_mode="c")


class RowFile:
    """A feature cache's rows (`cached`: the grid, the pooled embeddings) read on demand with
    plain reads (page cache, not the reader's RSS). Gathered through the cache's memory map,
    each row touched mapped the large page-cache folio around it: 1,500 random rows (108 MB)
    of the 40,000-image rehearsal's 2.9 GB grid cache added 554 MB to a process's RSS, 176 MB
    at 10,000 images, and a long training run maps the whole file (issue 55)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        header = np.load(self.path, mmap_mode="r")  # its shape, dtype and offset; no page read
        self.shape, self.dtype, self.offset = header.shape, header.dtype, header.offset

    def rows(self, rows: np.ndarray | Tensor, out: np.ndarray | None = None) -> np.ndarray:
        """Rows `rows` (any order, repeats allowed) into one array (`out` if given)."""
        rows = np.asarray(rows.cpu() if isinstance(rows, Tensor) else rows, dtype=np.int64)
        out = np.empty((len(rows), *self.shape[1:]), self.dtype) if out is None else out
        row_bytes = out[0].nbytes if len(rows) else 0
        with open(self.path, "rb") as f:
            for i, row in enumerate(rows):
                f.seek(self.offset + int(row) * row_bytes)
                if f.readinto(memoryview(out[i]).cast("B")) != row_bytes:
                    raise DistinctcapError(f"{self.path} ends before row {row} of {self.shape[0]}")
        return out


def grid_rows(index_path: str | Path, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` of the index's grid cache (which must exist), read with plain reads into one
    array (`RowFile`). Gathered through the map instead, every page they touched counted in
    the job's RSS beside the copy until the map went: 2,000 of 3,000 images' grids (144 MB)
    added 369 MB to the peak, read this way 146 (`tests/test_store.py`, issue 55)."""
    return RowFile(grid_cache_path(index_path)).rows(rows)


def _write_cache(index_path: str | Path, path: Path, column: str) -> None:
    index, files = _shard_files(index_path, "images")
    count, width, dtype = index["images"]["count"], _width(files, column), CACHED[column]
    shape = (count, width)
    if column == "grid":
        tokens = index["images"]["grid_tokens"]
        if width % tokens:
            raise DistinctcapError(
                f"{index_path}: grid width {width} is not a multiple of {tokens}"
            )
        shape = (count, tokens, width // tokens)
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    nbytes = count * width * np.dtype(dtype).itemsize
    log.info("writing the %s cache %s (%.2f GiB)", column, path, nbytes / 2**30)
    written = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.lib.format.write_array_header_2_0(f, header)
        for file in files:
            for g in range(file.num_row_groups):
                values = _rows(file.read_row_group(g, columns=[column]), column, dtype)
                f.write(np.ascontiguousarray(values).data)
                written += len(values)
                del values
                release_arrow_memory()
        if written != count:
            raise DistinctcapError(
                f"{index_path} records {count} images; its shards hold {written}"
            )


def load_image_norms(
    index_path: str | Path, image_ids: Sequence[int] | np.ndarray | None = None
) -> np.ndarray | None:
    """Norm of each image's pooled embedding before L2 normalisation, float32 (N,), in the
    order of `load_image_features` with the same `image_ids` (pooled * norm is CLIP's
    unnormalised projection); None for features without it (format 1, and a pre-trained
    captioner's own vision states): only specificity dp/cdp need it."""
    files = _shard_files(index_path, "images")[1]
    if not files or "pooled_norm" not in files[0].schema_arrow.names:
        return None
    per_shard = [f.read(columns=["pooled_norm"]).column(0).to_numpy() for f in files]
    norms = np.concatenate(per_shard).astype(np.float32)
    if image_ids is None:
        return norms
    return norms[feature_rows(feature_ids(index_path), image_ids)]


def text_feature_shards(
    index_path: str | Path, wanted: np.ndarray | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Shard by shard, in caption_id order: (caption_ids int64, embeddings float32) of the
    shard's rows whose id is in `wanted` (every row when None), one row group's decode at a
    time: a reader's memory holds one shard's answer, not the store's."""
    files = _shard_files(index_path, "texts")[1]
    for file in files:
        ids = file.read(columns=["caption_id"]).column(0).to_numpy().astype(np.int64)
        local = np.arange(len(ids)) if wanted is None else np.flatnonzero(np.isin(ids, wanted))
        out = np.empty((len(local), _width(files, "embedding")), np.float32)
        if len(local):
            into = {"embedding": (out, np.arange(len(local)))}
            _gather(file, local, {"embedding": np.float32}, into)
        yield ids[local], out


def _caption_ids(files: list[pq.ParquetFile]) -> list[np.ndarray]:
    return [f.read(columns=["caption_id"]).column(0).to_numpy() for f in files]


def text_caption_ids(index_path: str | Path) -> np.ndarray:
    """The caption ids of the index's text shards, in their order (sorted)."""
    per_shard = _caption_ids(_shard_files(index_path, "texts")[1])
    return np.concatenate(per_shard).astype(np.int64) if per_shard else np.zeros(0, np.int64)


def load_text_features(index_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(caption_ids int64 (M,), embeddings float32 (M, D) L2-normalised), sorted by caption_id."""
    files = _shard_files(index_path, "texts")[1]
    per_shard = _caption_ids(files)
    if not per_shard:
        return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
    ids = np.concatenate(per_shard).astype(np.int64)
    out = np.empty((len(ids), _width(files, "embedding")), np.float32)
    starts = np.cumsum([0] + [len(s) for s in per_shard])
    for s, file in enumerate(files):  # the answer + one row group's decode at a time
        rows = np.arange(len(per_shard[s]))
        _gather(file, rows, {"embedding": np.float32}, {"embedding": (out, rows + starts[s])})
    return ids, out


@dataclass
class ImageFeatures:
    image_ids: np.ndarray  # (N,) int64
    pooled: Tensor  # (N, Dp) float32, L2-normalised
    grid: Tensor  # (N, G, Dv) float16
    # (N,) float32: pooled's norm before normalising (pooled * pooled_norm is CLIP's
    # unnormalised projection, specificity dp/cdp); None where not loaded
    pooled_norm: Tensor | None = None
    # the caches `grid` and `pooled` map, where every image was loaded: rows are read from
    # them (`grid_at`, `pooled_at`), not gathered through the maps
    grid_file: RowFile | None = None
    pooled_file: RowFile | None = None

    @classmethod
    def load(
        cls, index_path: str | os.PathLike, image_ids: Sequence[int] | np.ndarray | None = None
    ) -> ImageFeatures:
        """The image features of a features index (distinctcap.features.extract): every image,
        sorted
        by image id, or those of `image_ids` in that order (a DistinctcapError names ids that
        have none).

        It reads what the job needs (ARCHITECTURE.md, Data contracts): `image_ids` (decode,
        evaluate) reads only those images' rows, so the memory is that of the selection; every
        image (training) maps the grid from the index's contiguous cache (`grid_cache`, built
        once) and reads the rows each batch asks for from its file (`grid_at`); pooled (small)
        is read into memory. The numbers are the shards' either way. A selection is
        read from the cache when it exists (`grid_rows`: fewer bytes than whole shards)."""
        norms = load_image_norms(index_path, image_ids)
        norm = None if norms is None else torch.from_numpy(norms)
        if image_ids is None:
            maps = {c: cached(index_path, c) for c in CACHED}
            files = {c: RowFile(m.filename) for c, m in maps.items()}
            grid, pooled = (torch.from_numpy(maps[c]) for c in ("grid", "pooled"))
            ids = feature_ids(index_path)
            return cls(ids, pooled, grid, norm, files["grid"], files["pooled"])
        elif not grid_cache_path(index_path).is_file():
            ids, pooled, grid = load_image_features(index_path, image_ids=image_ids)
        else:
            ids, pooled, _ = load_image_features(index_path, grid=False, image_ids=image_ids)
            grid = grid_rows(index_path, feature_rows(feature_ids(index_path), ids))
        return cls(ids, torch.from_numpy(pooled), torch.from_numpy(grid), norm)

    def rows(self, image_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Row of each image id; a DistinctcapError names the ids that have no features."""
        index = pd.Index(self.image_ids)
        rows = index.get_indexer(np.asarray(image_ids, dtype=np.int64))
        if (rows < 0).any():
            missing = np.asarray(image_ids)[rows < 0][:10].tolist()
            raise DistinctcapError(f"no image features for image ids {missing} (first 10 shown)")
        return rows

    def subset(self, image_ids: Sequence[int] | np.ndarray) -> ImageFeatures:
        rows = torch.as_tensor(self.rows(image_ids))
        norm = None if self.pooled_norm is None else self.pooled_norm[rows]
        return ImageFeatures(
            np.asarray(image_ids, dtype=np.int64), self.pooled_at(rows), self.grid_at(rows), norm
        )

    def grid_at(self, rows: Tensor, out: Tensor | None = None) -> Tensor:
        """`grid[rows]` (into `out` if given): read from the grid cache's file when the
        features map it (`RowFile`), so that a job's RSS holds the rows it asked for."""
        return _rows_at(self.grid, self.grid_file, rows, out)

    def pooled_at(self, rows: Tensor, out: Tensor | None = None) -> Tensor:
        """`pooled[rows]`, as `grid_at`: 123,166 images' pooled embeddings held in memory were
        a COCO training job's largest table (252 MB; issue 55)."""
        return _rows_at(self.pooled, self.pooled_file, rows, out)

    def unnormalised(self, rows: Tensor) -> Tensor:
        """CLIP's image projections before L2 normalisation at `rows`, float32 (B, Dp)."""
        if self.pooled_norm is None:
            raise DistinctcapError(
                "these image features carry no pooled_norm (made before it was stored); "
                "rerun the extract_features rule"
            )
        return self.pooled_at(rows).float() * self.pooled_norm[rows].float().unsqueeze(-1)


def _rows_at(table: Tensor, file: RowFile | None, rows: Tensor, out: Tensor | None) -> Tensor:
    """`table[rows]` (into `out` if given), read from `file` where the table maps it."""
    if file is None:
        return torch.index_select(table, 0, rows.to(table.device), out=out)
    if out is None:
        return torch.from_numpy(file.rows(rows))
    file.rows(rows, out.numpy())
    return out
