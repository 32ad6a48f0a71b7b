"""The shard store of image and text features: shards planned by content key, written atomically in
128-row groups (off the main thread), the cache cleaned of shards no longer planned, and the
index JSON that lists them (ARCHITECTURE.md, Data contracts).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path

FORMAT = 2  # 2: images carry pooled_norm


KEY = b"distinctcap.key"


def digest(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode())
    return h.hexdigest()


@dataclass
class Shard:
    kind: str  # images | texts
    index: int
    rows: np.ndarray  # positions in the (sorted) table
    key: str
    path: Path

    def is_done(self) -> bool:
        if not self.path.is_file():
            return False
        try:
            meta = pq.read_schema(self.path).metadata or {}
        except (OSError, pa.ArrowInvalid):
            return False  # a torn file from some other writer: recompute
        return meta.get(KEY, b"").decode() == self.key


def plan_shards(
    kind: str, keys: Sequence[object], size: int, fingerprint: str, folder: Path
) -> list[Shard]:
    """Cut the table into shards of `size` rows; each shard's key covers the model and rows."""
    shards = []
    for i, start in enumerate(range(0, len(keys), size)):
        rows = np.arange(start, min(start + size, len(keys)))
        key = digest(fingerprint, kind, [keys[r] for r in rows])
        shards.append(Shard(kind, i, rows, key, folder / kind / f"part-{i:05d}.parquet"))
    return shards


def image_keys(images: pd.DataFrame) -> list[tuple]:
    """(image_id, file, size, mtime_ns): a regenerated or edited image changes its key."""
    out = []
    for image_id, file in zip(images.image_id, images.file, strict=True):
        try:
            st = os.stat(file)
        except OSError as error:
            raise DistinctcapError(
                f"image {image_id}: cannot read {file} ({error.strerror}); images.parquet paths "
                "are relative to the working directory"
            ) from error
        out.append((int(image_id), str(file), st.st_size, st.st_mtime_ns))
    return out


def check_finite(ids: np.ndarray, kind: str, *arrays: torch.Tensor) -> None:
    """Stop on NaN/inf embeddings, naming the ids (UNKT eq. 3 would silently spread NaN).

    A row is finite iff its fp32 sum is (NaN and inf propagate; no embedding row comes near
    fp32 overflow): one reduction pass, cheaper than an elementwise isfinite on float16.
    """
    ok = torch.ones(len(ids), dtype=torch.bool)
    for a in arrays:
        ok &= torch.isfinite(a.reshape(len(ids), -1).sum(dim=1, dtype=torch.float32)).cpu()
    if not ok.all():
        bad = np.asarray(ids)[~ok.numpy()]
        more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise DistinctcapError(
            f"CLIP gave NaN/inf embeddings for {kind} ids {bad[:10].tolist()}{more}; check "
            "these inputs and the CLIP weights"
        )


def fixed_list(values: np.ndarray) -> pa.FixedSizeListArray:
    """Rows of a 2-D+ float32/float16 array as a fixed-size list column, without copying."""
    flat = np.ascontiguousarray(values.reshape(len(values), -1))
    if flat.dtype == np.float16:  # pa.array converts float16 element by element: view instead
        items = pa.array(flat.ravel().view(np.uint16)).view(pa.float16())
    else:
        items = pa.array(flat.ravel())
    return pa.FixedSizeListArray.from_arrays(items, flat.shape[1])


# Rows per parquet row group: the unit a reader decodes (`_gather`); 128 COCO grids decode in
# about 70 MB of transient memory.
ROW_GROUP_ROWS = 128


def write_shard(shard: Shard, columns: dict[str, pa.Array]) -> None:
    """Atomically; no dictionary encoding or statistics: float vectors gain nothing from them
    and they cost more than the rest of the write."""
    table = pa.table(columns).replace_schema_metadata({KEY: shard.key})
    with atomic_path(shard.path) as tmp:
        pq.write_table(
            table,
            tmp,
            use_dictionary=False,
            write_statistics=False,
            row_group_size=ROW_GROUP_ROWS,
        )


class ShardWriter:
    """Writes shards on one background thread (pyarrow releases the GIL) while the next shard
    is computed; at most one write in flight. `on_shard(shard)` runs once a shard is renamed."""

    def __init__(self, on_shard: Callable[[Shard], None] | None = None):
        self.on_shard = on_shard
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending: tuple[Shard, Future] | None = None

    def submit(self, shard: Shard, columns: dict[str, pa.Array]) -> None:
        self.wait()
        self.pending = (shard, self.pool.submit(write_shard, shard, columns))

    def wait(self) -> None:
        if self.pending:
            shard, future = self.pending
            self.pending = None
            future.result()
            if self.on_shard:
                self.on_shard(shard)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if kind is None:
                self.wait()
        finally:
            self.pool.shutdown(wait=True)  # an interrupted write still renames or cleans up


def clean_cache(cache: Path, keep: list[Shard]) -> None:
    """Remove temporary files of killed runs and parts beyond the current plan."""
    wanted = {s.path for s in keep}
    for kind in ("images", "texts"):
        for path in (cache / kind).glob("*"):
            if path not in wanted and (path.name.endswith(".tmp") or path.suffix == ".parquet"):
                path.unlink()



def shard_entry(shard: Shard, root: Path) -> dict:
    return {"path": os.path.relpath(shard.path, root), "key": shard.key, "rows": len(shard.rows)}
