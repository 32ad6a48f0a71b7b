"""The contrastive-image table of the specificity method (specificity paper §3.2, eq. 4-5).

For the contrastive losses the paper draws I_c "at random from the top 1% most similar images
to I_o"; we measure similarity by the cosine of the CLIP pooled image embeddings (the paper used
the captioner CNN's last conv activations). The table is computed once per fraction and cached:
one row per training image, `image_id` int64 and `neighbours` list<int64> of the k most similar
other training images, most similar first, with k = max(1, ceil(fraction * (N - 1))).

Neither the similarity matrix nor the N keys are held whole: query rows are processed `chunk`
at a time against the keys a tile of at most KEY_ROWS at a time, each tile's top k merged with
the best so far, and the table is streamed to parquet one row group per chunk. The stage spills
the keys from the store to a temporary file and reads each tile from there (`spilled_pooled`),
so its memory is set by the tiles and by k, not by N's keys (242 MB at COCO's size).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import Tensor

from distinctcap.core.devices import CPU
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, build_once, read_table
from distinctcap.core.logs import progress
from distinctcap.features.read import RowFile, feature_ids, pooled_reads
from distinctcap.features.store import digest

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


SIMILARITY_BYTES = 64 * 2**20  # a tile's (queries x keys) float32 similarities at most
KEY_ROWS = 16384  # keys a tile at most: 1,024 queries a pass over them at any N
# a chunk's best k and its tiles' (COCO's 1% is k = 1,183: 1,024 queries, 53 MB); more
# neighbours than that take fewer queries a pass, so k does not set the memory either
TOP_BYTES = 64 * 2**20


class PooledFile:
    """(N, D) float32 rows in a file, sliced like a tensor with plain reads: a mapped file's
    touched pages would count in the job's RSS, as the keys held whole did (242 MB at COCO's
    size, issue 55)."""

    def __init__(self, path: str | os.PathLike, rows: int, dim: int):
        self.path, self.rows, self.dim = Path(path), rows, dim

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, part: slice) -> Tensor:
        start, stop, _ = part.indices(self.rows)
        return self.read(start, torch.empty((max(0, stop - start), self.dim)))

    def read(self, start: int, out: Tensor) -> Tensor:
        """Rows start.. into `out` (float32, contiguous): as many as it holds, or up to N."""
        rows = min(len(out), self.rows - start)
        view = out[:rows]
        with open(self.path, "rb") as f:
            f.seek(start * self.dim * 4)
            if f.readinto(memoryview(view.numpy()).cast("B")) != view.nbytes:
                raise DistinctcapError(f"{self.path} ends before row {start + rows}")
        return view


def _tile_rows(n: int, chunk: int, k: int = 1) -> tuple[int, int]:
    """(queries, keys) of a similarity tile: at most KEY_ROWS keys, and queries so that the
    tile fits SIMILARITY_BYTES and their best k (`_Buffers`) fit TOP_BYTES. Up to KEY_ROWS
    images there is one tile a chunk, as before the keys were streamed."""
    keys = max(1, min(n, KEY_ROWS, SIMILARITY_BYTES // 4))
    best = TOP_BYTES // (_Buffers.BYTES_PER_NEIGHBOUR * k)
    queries = min(chunk, SIMILARITY_BYTES // (4 * keys), best)
    return max(1, queries), keys


class _Buffers:
    """A pass's tensors, taken once (issue 55): the queries, a tile of keys, its similarities,
    the tile's top k and the best k so far beside it. Allocated anew per tile, as before,
    glibc's heap kept their space: 1,112 MB against 912 on a synthetic store of COCO's size."""

    BYTES_PER_NEIGHBOUR = 44  # a query's: values, rows, top and picked rows below

    def __init__(self, chunk: int, block: int, k: int, dim: int, device):
        self.k, width = k, k + min(k, block)
        self.queries, self.keys = torch.empty((chunk, dim)), torch.empty((block, dim))
        self.sims = torch.empty(chunk * block, device=device)
        self.values = torch.empty((chunk, width), device=device)
        self.rows = torch.empty((chunk, width), dtype=torch.long, device=device)
        self.top_values = torch.empty(chunk * k, device=device)
        self.top_rows = torch.empty(chunk * k, dtype=torch.long, device=device)
        self.picked_rows = torch.empty(chunk * k, dtype=torch.long, device=device)

    def picked(self, c: int, k: int) -> Tensor:
        return self.picked_rows[: c * k].view(c, k)

    def top(self, values: Tensor, k: int, sort: bool) -> tuple[Tensor, Tensor]:
        """torch.topk of the rows of `values` (c, m), into the buffers."""
        c = len(values)
        out = (self.top_values[: c * k].view(c, k), self.top_rows[: c * k].view(c, k))
        return torch.topk(values, k, dim=1, sorted=sort, out=out)

    def similarities(self, queries: Tensor, keys: Tensor) -> Tensor:
        c = len(queries)
        return torch.mm(queries, keys.T, out=self.sims[: c * len(keys)].view(c, len(keys)))


def _top_of_tiles(queries: Tensor, start: int, tiles: Iterable[Tensor], b: _Buffers) -> Tensor:
    """(c, k) int64: the k keys most similar to each of `queries` (keys start.. of the same
    rows, so each query excludes itself), most similar first, from the keys a tile at a time.
    The first tile's top k is sorted, as the whole keys' was when they were one tile (so one
    tile gives that table, ties and all); each later tile's top k is merged with the best so
    far unsorted (a partial selection), and the merged best sorted once at the end."""
    c = len(queries)
    values, rows = b.values[:c], b.rows[:c]  # the best `have` columns, then a tile's top
    at = have = tiles_seen = 0
    for keys in tiles:
        sims = b.similarities(queries, keys)  # (c, len(keys))
        own = torch.arange(c, device=sims.device)
        hit = (own + start >= at) & (own + start < at + len(keys))
        sims[own[hit], own[hit] + start - at] = float("-inf")  # self excluded
        tile = min(b.k, len(keys))
        top_values, top_rows = b.top(sims, tile, sort=not tiles_seen)
        values[:, have : have + tile] = top_values
        rows[:, have : have + tile] = top_rows.add_(at)
        span = have + tile
        if tiles_seen:  # the tile's top merged with the best so far
            have = min(b.k, span)
            best_values, picked = b.top(values[:, :span], have, sort=False)
            best_rows = torch.gather(rows[:, :span], 1, picked, out=b.picked(c, have))
            values[:, :have], rows[:, :have] = best_values, best_rows
        else:
            have = tile
        at, tiles_seen = at + len(keys), tiles_seen + 1
    if tiles_seen == 1:  # its top k sorted as it was found
        return rows[:, :have].clone()
    return rows[:, :have].gather(1, values[:, :have].argsort(dim=1, descending=True, stable=True))


def _rows(keys: Tensor | PooledFile, start: int, out: Tensor) -> Tensor:
    """Rows start.. of `keys`, as many as `out` holds: a file's read into `out`, a tensor's
    a view."""
    return keys.read(start, out) if isinstance(keys, PooledFile) else keys[start : start + len(out)]


def _chunks(keys: Tensor | PooledFile, k: int, chunk: int, device=CPU):
    """Yield (start, rows (c, k) int64 on CPU) of the k most similar other images per row,
    `chunk` rows at a time, each chunk meeting the keys a tile at a time (`_tile_rows`): memory
    holds a tile, a chunk's best k and a tile of keys, not all N keys (issue 55)."""
    n = len(keys)
    chunk, block = _tile_rows(n, chunk, k)
    dim = keys.dim if isinstance(keys, PooledFile) else keys.shape[1]
    b = _Buffers(chunk, block, k, dim, device)
    for s in range(0, n, chunk):
        tiles = (_rows(keys, a, b.keys).to(device) for a in range(0, n, block))
        yield s, _top_of_tiles(_rows(keys, s, b.queries).to(device), s, tiles, b).cpu()


def top_neighbours(
    emb: Tensor, k: int, chunk: int = 1024, device: str | torch.device = "cpu"
) -> Tensor:
    """Rows of the k most similar other rows of `emb` (N, D) (L2-normalised, so dot = cosine),
    most similar first -> (N, k) int64. Ties are broken arbitrarily (torch.topk)."""
    emb = torch.as_tensor(emb, dtype=torch.float32)
    if not 1 <= k < emb.shape[0]:
        raise DistinctcapError(f"k = {k} neighbours of {emb.shape[0]} images: allowed 1..N-1")
    return torch.cat([rows for _, rows in _chunks(emb, k, chunk, device)])


def _finite_rows(ids: np.ndarray, emb: Tensor | np.ndarray | PooledFile) -> Tensor | PooledFile:
    """`emb` as float32 rows (a PooledFile as it is: its rows were checked as it was written),
    stopped at a NaN / inf or a count that is not the ids'."""
    if isinstance(emb, PooledFile):
        if len(emb) != len(ids):
            raise DistinctcapError(f"{len(ids)} image ids but {len(emb)} embeddings")
        return emb
    emb = torch.as_tensor(np.asarray(emb), dtype=torch.float32)
    if emb.ndim != 2 or len(ids) != emb.shape[0]:
        raise DistinctcapError(f"{len(ids)} image ids but embeddings of shape {tuple(emb.shape)}")
    if not torch.isfinite(emb).all():
        bad = ids[(~torch.isfinite(emb).all(dim=1)).numpy()][:10].tolist()
        raise DistinctcapError(f"non-finite image embeddings for image ids {bad} (first 10)")
    return emb


def write_neighbours(
    image_ids: Sequence[int] | np.ndarray,
    emb: Tensor | np.ndarray | PooledFile,
    path: str | os.PathLike,
    fraction: float = 0.01,
    chunk: int = 1024,
    device: str | torch.device = "cpu",
) -> int:
    """Compute the table of `image_ids` with pooled embeddings `emb` (N, D) and write it to
    `path` atomically, streamed one row group per chunk. Returns k."""
    ids = np.asarray(image_ids, dtype=np.int64)
    keys = _finite_rows(ids, emb)
    k = neighbour_count(len(ids), fraction)
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, SCHEMA) as writer:
        with progress(total=len(ids), unit="images", desc=f"neighbours (top {k})") as bar:
            for s, rows in _chunks(keys, k, chunk, device):
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


def neighbour_rows_path(path: str | os.PathLike, index: pd.Index) -> Path:
    """Where `NeighbourTable.load` keeps the table at `path` as feature rows of `index`:
    `<stem>.rows/<key>.npy` beside it, the key a hash of the table file's size and time and of
    the feature ids."""
    path = Path(path)
    stat = path.stat()
    ids = hashlib.sha256(np.asarray(index, dtype=np.int64).tobytes()).hexdigest()
    key = digest(stat.st_size, stat.st_mtime_ns, ids)[:32]
    return path.with_name(f"{path.stem}.rows") / f"{key}.npy"


def write_neighbour_rows(path: str | os.PathLike, index: pd.Index, out: Path) -> None:
    """The neighbours of the table at `path` as feature rows in `index`, (N, k) int32, into
    the .npy `out`: a row group read and written at a time, so the writer holds one group."""
    file = pq.ParquetFile(path)
    check_columns(file.schema_arrow, path)
    n, k = file.metadata.num_rows, None
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        for g in range(file.num_row_groups):
            lists = file.read_row_group(g, columns=["neighbours"]).column(0).combine_chunks()
            if k is None:
                k = neighbours_per_row(lists, path)
                header = {"descr": "<i4", "fortran_order": False, "shape": (n, k)}
                np.lib.format.write_array_header_2_0(f, header)
            elif neighbours_per_row(lists, path) != k:
                raise DistinctcapError(f"{path}: rows have different numbers of neighbours")
            f.write(rows_of(index, lists.flatten().to_numpy().reshape(-1, k)).tobytes())
        if k is None:
            np.lib.format.write_array_header_2_0(
                f, {"descr": "<i4", "fortran_order": False, "shape": (0, 0)}
            )


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
        """The table at `path` (`write_neighbours`) as int32 feature rows in a file beside it
        (`neighbour_rows_path`, written once), mapped, each draw reading its rows from the
        file. At COCO's size it has 140 million neighbours: read whole as int64 ids they
        peaked at 6.2 GB in the 123,287-image rehearsal's specificity job; held as int32 rows,
        0.56 GB, x1.66 the job's RSS at 10,000 images (issue 55)."""
        index = pd.Index(np.asarray(feature_ids, dtype=np.int64))
        ids = pq.read_table(path, columns=["image_id"]).column(0).to_numpy()
        rows = neighbour_rows_path(path, index)
        build_once(rows, lambda out: write_neighbour_rows(path, index, out))
        table = cls.__new__(cls)
        table._fill(index, ids, np.load(rows, mmap_mode="c"))
        table.file = RowFile(rows)
        return table

    def _fill(self, index: pd.Index, image_ids: np.ndarray, neighbour_rows: np.ndarray) -> None:
        """The (N, k) int32 feature rows of each image's neighbours, and each feature row's
        slot in them."""
        rows = rows_of(index, np.asarray(image_ids))
        self.k = neighbour_rows.shape[1]
        self.neighbours = torch.as_tensor(neighbour_rows)  # (N, k) feature rows
        self.file = None  # RowFile: where `load` maps them, draws read them from it
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
        if self.file is None:
            return self.neighbours[slots, pick].long()
        rows = torch.from_numpy(self.file.rows(slots))  # (B, k)
        return rows[torch.arange(len(slots)), pick].long()


READ_ROWS = 8192  # images a read from the store while the keys are spilled


@contextmanager
def spilled_pooled(
    features_index: str | os.PathLike, image_ids: np.ndarray, folder: Path
) -> Iterator[PooledFile]:
    """The pooled embeddings of `image_ids`, written READ_ROWS at a time from the store to a
    temporary file in `folder` (the stage's own) and removed after: each pass of the
    neighbours reads its keys from there with plain reads (page cache), not from the store's
    shards again (~1 CPU s a pass at COCO's size, 116 passes)."""
    folder.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=".pooled-", suffix=".tmp", dir=folder)
    dim = 0
    try:
        with os.fdopen(handle, "wb") as f:
            for read in pooled_reads(features_index, image_ids, READ_ROWS):
                f.write(memoryview(np.ascontiguousarray(read.numpy())).cast("B"))
                dim = read.shape[1]
        yield PooledFile(name, len(image_ids), dim)
    finally:
        os.unlink(name)


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
    with spilled_pooled(features_index, train, Path(out).parent) as keys:
        k = write_neighbours(train, keys, out, pct / 100, chunk, device)
    log.info("%d training images, top %g%% = %d neighbours each -> %s", len(train), pct, k, out)
    return k
