"""Atomic writes and schema-checked parquet tables."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from distinctcap.core.errors import DistinctcapError

SCHEMAS: dict[str, pa.Schema] = {
    "images": pa.schema(
        [("image_id", pa.int64()), ("file", pa.string()), ("split", pa.string()),
         ("width", pa.int32()), ("height", pa.int32())]
    ),
    "captions": pa.schema(
        [("caption_id", pa.int64()), ("image_id", pa.int64()), ("split", pa.string()),
         ("text", pa.string()), ("tokens", pa.list_(pa.int32()))]
    ),
    "quarantine": pa.schema(
        [("kind", pa.string()), ("id", pa.string()), ("file", pa.string()),
         ("reason", pa.string())]
    ),
    "entropy": pa.schema(
        [("caption_id", pa.int64()), ("image_id", pa.int64()), ("entropy", pa.float32()),
         ("subset", pa.string())]
    ),
    "generated": pa.schema(
        [("run", pa.string()), ("image_id", pa.int64()), ("sample", pa.int32()),
         ("text", pa.string()), ("logprob", pa.float32())]
    ),
    "per_image": pa.schema(  # distinctcap.evaluate.device.PER_IMAGE
        [("image_id", pa.int64()), ("clip_rank", pa.int64()), ("clipscore", pa.float32()),
         ("judge_rank", pa.int64()), ("judge_clipscore", pa.float32()),
         ("scene_rank", pa.float64()), ("scene_top1", pa.float64())]
    ),
}


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it to `path` only if the block succeeds.

    The file gets the mode `open()` would give it (0o666 less the umask). A failure on a full
    disk becomes a DistinctcapError naming `path`; this write leaves the previous file at `path`
    as it was, but under Snakemake the failed job's outputs are removed by Snakemake, which the
    message says (issue 28: it promised the previous file was kept)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        tmp = _temp_beside(path)
        yield tmp
        os.replace(tmp, path)
    except Exception as error:
        if disk_full(error, path.parent):
            raise DistinctcapError(
                f"no space left on device writing {path} "
                f"({shutil.disk_usage(path.parent).free} bytes free there): free space and "
                f"rerun. The temporary file is removed and this write left any previous "
                f"{path.name} as it was, but Snakemake removes every output of a failed job "
                "(resume checkpoints and feature shards are not outputs: the rerun resumes "
                f"from them): {error}"
            ) from error
        raise
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _temp_beside(path: Path) -> Path:
    """A new empty file next to `path`, with the mode the umask gives new files."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)
    return Path(tmp)


def current_umask() -> int:
    """This process's umask, read from /proc on Linux (no window with another umask for other
    threads), else by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def disk_full(error: BaseException, folder: Path) -> bool:
    """Whether `error` came from a full disk: ENOSPC, or (libraries that hide the errno, e.g.
    torch.save) any error while the disk of `folder` has (nearly) no free space left."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return False
    return usage.free < min(1 << 20, usage.total // 100)


def write_table(df: pd.DataFrame, path: str | os.PathLike, table: str | None = None) -> None:
    """Write `df` as parquet atomically; contract columns are cast to the named table's types."""
    write_arrow(pa.Table.from_pandas(df, preserve_index=False), path, table)


ROW_GROUP_ROWS = 65_536  # a filtered read decodes a group at a time, not a whole column


def write_arrow(arrow: pa.Table, path: str | os.PathLike, table: str | None = None) -> None:
    """`write_table` of an arrow table (no pandas copy), in row groups of ROW_GROUP_ROWS."""
    write_pieces([arrow], path, table)


def write_pieces(
    pieces: Iterable[pa.Table], path: str | os.PathLike, table: str | None = None
) -> None:
    """`write_arrow` of a table given a piece at a time (at least one), each cast to the named
    contract's types as it is written: the job holds a piece, not the table (issue 55: a D-
    shard of 100,000 captions gathered whole was +70 MB)."""
    with atomic_path(path) as tmp:
        writer = None
        try:
            for piece in pieces:
                piece = to_contract(piece, table)
                writer = writer or pq.ParquetWriter(tmp, piece.schema)
                writer.write_table(piece, row_group_size=ROW_GROUP_ROWS)
                del piece
                release_arrow_memory()
        finally:
            if writer is not None:
                writer.close()


def to_contract(arrow: pa.Table, table: str | None) -> pa.Table:
    """`arrow` with the named contract's columns cast to its types."""
    for field in SCHEMAS[table] if table else []:
        if field.name not in arrow.column_names:
            raise DistinctcapError(f"{table} table is missing column {field.name!r}")
        i = arrow.schema.get_field_index(field.name)
        arrow = arrow.set_column(i, field, arrow.column(i).cast(field.type))
    return arrow


def build_once(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """`path`, made by `write(path)` where it is missing, under a lock in its folder: concurrent
    jobs wait for one writer instead of each writing the same file (`write` writes it whole or
    not at all, through `atomic_path`). The folder's other files of its suffix, other keys'
    builds, are then removed; a job that still maps one keeps reading it."""
    path = Path(path)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not path.is_file():
                    write(path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        for stale in path.parent.glob(f"*{path.suffix}"):
            if stale != path:
                stale.unlink(missing_ok=True)
    return path


def release_arrow_memory() -> None:
    """Hand the freed buffers of a read back to the OS. Arrow's allocator (mimalloc or
    jemalloc) keeps them for reuse otherwise, so a read of shard after shard grew the RSS by
    about a shard each (measured: 1,000 images' rows peaked at 1.3 GB over a 10k store)."""
    pa.default_memory_pool().release_unused()


def row_group_starts(file: pq.ParquetFile) -> np.ndarray:
    """The first row of each row group of a parquet file, and the file's row count last."""
    sizes = [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)]
    return np.cumsum([0, *sizes])


def row_pieces(file: pq.ParquetFile, rows: np.ndarray) -> Iterator[tuple[np.ndarray, pa.Table]]:
    """Rows `rows` of a parquet file by the row group that holds them, in the groups' order,
    one group read at a time: (their positions in `rows`, those rows)."""
    starts = row_group_starts(file)
    group_of = np.searchsorted(starts, rows, side="right") - 1
    for g in np.unique(group_of):
        pick = np.flatnonzero(group_of == g)
        yield pick, file.read_row_group(int(g)).take(rows[pick] - starts[g])
        release_arrow_memory()


def rows_in(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Each of `wanted`'s row in the unique `ids` (ascending or not), -1 where it is not: a
    sorted search, through a sorter where `ids` are not ascending."""
    if not len(ids):
        return np.full(len(wanted), -1, dtype=np.int64)
    sorter = None if (ids[1:] > ids[:-1]).all() else np.argsort(ids, kind="stable")
    at = np.minimum(np.searchsorted(ids, wanted, sorter=sorter), len(ids) - 1)
    rows = at if sorter is None else sorter[at]
    return np.where(ids[rows] == wanted, rows, -1)


def read_rows(file: pq.ParquetFile, rows: np.ndarray) -> pa.Table:
    """Rows `rows` of a parquet file, in that order, read from the row groups that hold one of
    them, one group at a time: the caller holds the rows and a row group, not the file."""
    pieces, picked = [], []
    for pick, piece in row_pieces(file, rows):
        pieces.append(piece)
        picked.append(pick)
    if not pieces:
        return file.schema_arrow.empty_table()
    return pa.concat_tables(pieces).take(np.argsort(np.concatenate(picked), kind="stable"))


def read_table(
    path: str | os.PathLike,
    table: str | None = None,
    columns: list[str] | None = None,
    filters: list[tuple] | None = None,
) -> pd.DataFrame:
    """Read parquet and check it has the named contract's columns and types; `columns` reads
    only those (a stage that needs the captions' ids, not their text and tokens, holds a tenth
    of the table: issue 55), `filters` only the rows that pass (pyarrow's DNF form, e.g.
    `[("image_id", "in", ids)]`)."""
    frame = read_arrow(path, table, columns, filters).to_pandas()
    release_arrow_memory()  # the arrow table's buffers: 75 MB of COCO's captions (issue 55)
    return frame


def read_arrow(
    path: str | os.PathLike,
    table: str | None = None,
    columns: list[str] | None = None,
    filters: list[tuple] | None = None,
) -> pa.Table:
    """`read_table` as an arrow table: a list column stays packed (the training captions'
    tokens are ~30 MB so, several times that as pandas' arrays)."""
    arrow = pq.read_table(path, columns=columns, filters=filters)
    if table:
        check_schema(arrow.schema, table, path, columns)
    return arrow


def read_columns(
    path: str | os.PathLike | pq.ParquetFile, table: str | None, columns: list[str]
) -> dict[str, np.ndarray]:
    """Numeric columns of a parquet file as numpy arrays filled a row group at a time: the read
    holds the arrays and one group, not an arrow table and its pandas copy (issue 55: +67 MB
    for the 20 bytes a caption of 600,000 captions' entropies)."""
    file = path if isinstance(path, pq.ParquetFile) else pq.ParquetFile(path)
    if table:
        check_schema(file.schema_arrow, table, path, columns)
    starts = row_group_starts(file)
    arrays = {
        name: np.empty(starts[-1], file.schema_arrow.field(name).type.to_pandas_dtype())
        for name in columns
    }
    for g in range(file.num_row_groups):
        group = file.read_row_group(g, columns=columns)
        for name in columns:
            arrays[name][starts[g] : starts[g + 1]] = group.column(name).to_numpy()
        release_arrow_memory()
    return arrays


def check_schema(
    schema: pa.Schema, table: str, where: object, columns: list[str] | None = None
) -> None:
    """The contract's fields (those in `columns`, when given) are in `schema`, typed as it says."""
    for field in SCHEMAS[table]:
        if columns is not None and field.name not in columns:
            continue
        if field.name not in schema.names:
            raise DistinctcapError(f"{where}: {table} table lacks column {field.name!r}")
        got = schema.field(field.name).type
        if got != field.type:
            raise DistinctcapError(
                f"{where}: column {field.name!r} of the {table} table is {got}, "
                f"expected {field.type}"
            )


def write_json(obj: object, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")


def read_json(path: str | os.PathLike) -> object:
    return json.loads(Path(path).read_text())


def file_sha256(paths: Sequence[str | os.PathLike]) -> str:
    """One content hash over the files (order as given), read in 4 MiB blocks."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()
