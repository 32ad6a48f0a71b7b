"""CLIP features of every image and caption, in resumable shards (ARCHITECTURE.md, data contracts).

Per image: the pooled embedding (L2-normalised, float32), its norm before normalising (the
unnormalised projection is pooled * pooled_norm: the specificity paper's dp and cdp, eq. 2 and 4,
use it) and the grid tokens (float16, G x Dv),
the captioner's input: for a ViT the last layer's tokens after its final LayerNorm
(`model.visual.output_tokens = True`); for a conv tower (open_clip's ModifiedResNet, timm
convnets) its last feature map, H x W positions of C channels, the input of its pooling head
(as grid-feature captioners use CLIP's ResNets). Per caption: the text embedding
(L2-normalised, float32).

Layout (under `cache_dir`, which is NOT a declared Snakemake output, so a killed run keeps it):
    images/part-00000.parquet  image_id int64, pooled fixed_size_list<float>[D],
                               pooled_norm float, grid fixed_size_list<halffloat>[G * Dv]
    texts/part-00000.parquet   caption_id int64, embedding fixed_size_list<float>[D]
    manifest.json              what the features were computed with (for people)
The rule's output is a small index JSON listing the shards. Each shard is written under a
temporary name and renamed; its parquet metadata holds a key = hash(manifest, its rows (image
file, size, mtime / caption text)). A rerun reuses a shard only if its key matches, so a
killed run recomputes only the missing shards and a change of CLIP (arch, weights content,
preprocessing, precision) recomputes everything: features are never mixed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import CenterCrop, Compose, Resize
from tqdm import tqdm

from distinctcap.clip import LoadedClip, byte_transform, encode_text, normalize
from distinctcap.data.quality import decoding
from distinctcap.devices import resolve_device
from distinctcap.errors import DistinctcapError
from distinctcap.io import atomic_path, file_sha256, read_json, write_json

log = logging.getLogger(__name__)

FORMAT = 2  # 2: images carry pooled_norm
KEY = b"distinctcap.key"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class FeatureSettings:
    batch_size: int = 256
    # DataLoader worker processes decoding images; auto: on a GPU every CPU of the job but the
    # main one's (`extract_features(threads=)`), on the CPU none (the main process computes)
    workers: int | str = "auto"
    image_shard_size: int = 1024
    text_shard_size: int = 16384
    precision: str = "auto"  # auto: fp16 autocast on a GPU, fp32 on the CPU


def loader_workers(workers: int | str, device: torch.device, threads: int | None) -> int:
    """DataLoader workers of `FeatureSettings.workers`: a number, or auto (see there)."""
    if workers != "auto":
        return int(workers)
    return max(0, (threads or 1) - 1) if device.type == "cuda" else 0


def compute_dtype(precision: str, device: torch.device) -> torch.dtype:
    if precision == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return DTYPES[precision]


def manifest(clip: LoadedClip, dtype: torch.dtype) -> dict:
    """Everything the features depend on besides the inputs themselves."""
    return {
        "format": FORMAT,
        "arch": clip.arch,
        "pretrained": clip.pretrained,
        "weight_files": [str(f) for f in clip.weight_files],
        "weights_sha256": file_sha256(clip.weight_files),
        "preprocess": clip.preprocess_cfg(),
        "context_length": int(getattr(clip.model, "context_length", 0) or 0),
        "precision": str(dtype).removeprefix("torch."),
    }


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


# ---------------------------------------------------------------- images


class ImageFiles(Dataset):
    """Image files -> uint8 tensors (3, H, W) through the CLIP's resize/crop.

    An image already at the CLIP's input size (the shapes world) skips resize and crop: they
    are identities there (PIL returns a copy), and skipping them saves a quarter of the
    decoding cost, which on a 2-core box competes with the model for the same cores.
    """

    def __init__(self, files: Sequence[str], transform: Compose, size: int | Sequence[int]):
        self.files, self.transform = list(files), transform
        self.light = Compose(
            [t for t in transform.transforms if not isinstance(t, Resize | CenterCrop)]
        )
        self.size = (size, size) if isinstance(size, int) else tuple(size)  # (H, W)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        with decoding(self.files[i]), Image.open(self.files[i]) as image:
            same = image.size[::-1] == self.size  # PIL gives (W, H)
            return (self.light if same else self.transform)(image)


def image_batches(shards: list[Shard], batch_size: int) -> list[list[int]]:
    """Batches that never straddle two shards, in shard order."""
    return [
        s.rows[b : b + batch_size].tolist()
        for s in shards
        for b in range(0, len(s.rows), batch_size)
    ]


def encode_images(
    clip: LoadedClip,
    loader: DataLoader,
    device: torch.device,
    dtype: torch.dtype,
    mean: torch.Tensor,
    std: torch.Tensor,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(pooled L2-normalised float32 (B, D), its norms (B,), grid tokens (B, G, Dv)) per batch,
    on `device`."""
    amp = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    with torch.inference_mode(), amp:
        for batch in own_errors(loader):
            x = normalize(batch.to(device, non_blocking=True), mean, std)
            pooled, tokens = pooled_and_grid(clip.model.visual, x)
            pooled = pooled.float()
            yield F.normalize(pooled, dim=-1), pooled.norm(dim=-1), tokens


def own_errors(loader: DataLoader) -> Iterator[torch.Tensor]:
    """The loader's batches; a DistinctcapError from a worker process is raised with its own
    message (the DataLoader puts the worker's traceback in front of it)."""
    batches = iter(loader)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except DistinctcapError as error:
            last = str(error).strip().splitlines()[-1]
            raise DistinctcapError(last.split("DistinctcapError: ", 1)[-1]) from error
        yield batch


def pooled_and_grid(visual: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pooled (B, D), grid tokens (B, G, Dv)) of a ViT or of a conv tower (module docstring)."""
    if hasattr(visual, "output_tokens"):  # a ViT: switch its output to tokens for this call only
        before, visual.output_tokens = visual.output_tokens, True
        try:
            return visual(x)
        finally:
            visual.output_tokens = before
    out = visual.forward_intermediates(x, indices=1)  # the last stage's map, then the head
    return out["image_features"], out["image_intermediates"][-1].flatten(2).transpose(1, 2)


@torch.inference_mode()
def grid_token_count(clip: LoadedClip) -> int:
    """G, from one blank image at the model's input size."""
    size = clip.preprocess_cfg()["size"]
    height, width = (size, size) if isinstance(size, int) else size
    param = next(clip.model.visual.parameters())
    blank = torch.zeros(1, 3, height, width, device=param.device, dtype=param.dtype)
    return pooled_and_grid(clip.model.visual, blank)[1].shape[1]


def extract_images(
    images: pd.DataFrame,
    clip: LoadedClip,
    shards: list[Shard],
    settings: FeatureSettings,
    device: torch.device,
    dtype: torch.dtype,
    on_shard: Callable[[Shard], None] | None = None,
    threads: int | None = None,
) -> None:
    """Compute and write the given image shards; `on_shard` runs after each one is renamed.
    `threads`: the job's CPUs, for `settings.workers` auto."""
    visual = clip.model.visual
    if not hasattr(visual, "output_tokens") and not hasattr(visual, "forward_intermediates"):
        raise DistinctcapError(
            f"clip.arch = {clip.arch!r} gives no grid tokens; use a ViT or a conv tower"
        )
    to_bytes, mean, std = byte_transform(clip.preprocess)
    workers = loader_workers(settings.workers, device, threads)
    log.info("images: %d DataLoader workers, pinned memory %s", workers, device.type == "cuda")
    loader = DataLoader(
        ImageFiles(images.file.tolist(), to_bytes, clip.preprocess_cfg()["size"]),
        batch_sampler=image_batches(shards, settings.batch_size),
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=4 if workers else None,
    )
    batches = encode_images(clip, loader, device, dtype, mean, std)
    ids = images.image_id.to_numpy()
    total = sum(len(s.rows) for s in shards)
    bar = tqdm(total=total, desc="image features", unit="images", smoothing=0.1)
    with bar, ShardWriter(on_shard) as writer:
        for shard in shards:
            pooled = grid = None
            norms = torch.empty(len(shard.rows), dtype=torch.float32)
            done = 0
            while done < len(shard.rows):
                p, n, g = next(batches)
                if pooled is None:  # copy_ converts to the stored dtype on the way to the CPU
                    pooled = torch.empty((len(shard.rows), *p.shape[1:]), dtype=torch.float32)
                    grid = torch.empty((len(shard.rows), *g.shape[1:]), dtype=torch.float16)
                pooled[done : done + len(p)].copy_(p)
                norms[done : done + len(n)].copy_(n)
                grid[done : done + len(g)].copy_(g)
                done += len(p)
                bar.update(len(p))
            check_finite(ids[shard.rows], "image", pooled, grid)
            writer.submit(
                shard,
                {
                    "image_id": pa.array(ids[shard.rows], pa.int64()),
                    "pooled": fixed_list(pooled.numpy()),
                    "pooled_norm": pa.array(norms.numpy(), pa.float32()),
                    "grid": fixed_list(grid.numpy()),
                },
            )


# ---------------------------------------------------------------- texts


def extract_texts(
    captions: pd.DataFrame,
    clip: LoadedClip,
    shards: list[Shard],
    settings: FeatureSettings,
    device: torch.device,
    dtype: torch.dtype,
    on_shard: Callable[[Shard], None] | None = None,
) -> None:
    ids, texts = captions.caption_id.to_numpy(), captions.text.tolist()
    amp = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    bar = tqdm(total=sum(len(s.rows) for s in shards), desc="text features", unit="captions")
    with bar, ShardWriter(on_shard) as writer, torch.inference_mode(), amp:
        for shard in shards:
            out = []
            for b in range(0, len(shard.rows), settings.batch_size):
                rows = shard.rows[b : b + settings.batch_size]
                tokens = clip.tokenizer([texts[r] for r in rows])
                if device.type == "cuda":  # an asynchronous copy from pinned memory
                    tokens = tokens.pin_memory().to(device, non_blocking=True)
                out.append(F.normalize(encode_text(clip.model, tokens).float(), dim=-1).cpu())
                bar.update(len(rows))
            emb = torch.cat(out)
            check_finite(ids[shard.rows], "caption", emb)
            writer.submit(
                shard,
                {
                    "caption_id": pa.array(ids[shard.rows], pa.int64()),
                    "embedding": fixed_list(emb.numpy()),
                },
            )


# ---------------------------------------------------------------- the stage


def extract_features(
    images: pd.DataFrame,
    captions: pd.DataFrame,
    clip: LoadedClip,
    index_path: str | Path,
    cache_dir: str | Path,
    settings: FeatureSettings | None = None,
    device: str = "auto",
    on_shard: Callable[[Shard], None] | None = None,
    threads: int | None = None,
) -> dict:
    """Features of every image and caption; reuses finished shards; writes the index JSON.

    `on_shard(shard)` is called after each newly written shard (progress hooks, tests).
    `threads`: the CPUs of the job (snakemake.threads), for `settings.workers` auto.
    """
    settings = settings or FeatureSettings()
    dev = resolve_device(device)
    dtype = compute_dtype(settings.precision, dev)
    clip.model.to(dev).eval()
    cache = Path(cache_dir)
    info = manifest(clip, dtype)
    # where the weights were read from is recorded, not hashed: their content is
    fingerprint = digest({k: v for k, v in info.items() if k not in ("pretrained", "weight_files")})
    images = images.sort_values("image_id").reset_index(drop=True)
    captions = captions.sort_values("caption_id").reset_index(drop=True)
    img_shards = plan_shards(
        "images", image_keys(images), settings.image_shard_size, fingerprint, cache
    )
    txt_keys = list(zip(captions.caption_id.astype(int), captions.text, strict=True))
    txt_shards = plan_shards("texts", txt_keys, settings.text_shard_size, fingerprint, cache)
    clean_cache(cache, img_shards + txt_shards)
    write_json(info, cache / "manifest.json")
    todo = [s for s in img_shards if not s.is_done()]
    log.info("image shards: %d reused, %d to compute", len(img_shards) - len(todo), len(todo))
    extract_images(images, clip, todo, settings, dev, dtype, on_shard, threads)
    todo = [s for s in txt_shards if not s.is_done()]
    log.info("text shards: %d reused, %d to compute", len(txt_shards) - len(todo), len(todo))
    extract_texts(captions, clip, todo, settings, dev, dtype, on_shard)
    index = build_index(info, fingerprint, clip, img_shards, txt_shards, Path(index_path).parent)
    write_json(index, index_path)
    return index


def clean_cache(cache: Path, keep: list[Shard]) -> None:
    """Remove temporary files of killed runs and parts beyond the current plan."""
    wanted = {s.path for s in keep}
    for kind in ("images", "texts"):
        for path in (cache / kind).glob("*"):
            if path not in wanted and (path.name.endswith(".tmp") or path.suffix == ".parquet"):
                path.unlink()


def build_index(
    info: dict,
    fingerprint: str,
    clip: LoadedClip,
    img_shards: list[Shard],
    txt_shards: list[Shard],
    root: Path,
) -> dict:
    first = pq.read_schema(img_shards[0].path) if img_shards else None
    return {
        "manifest": info,
        "fingerprint": fingerprint,
        "logit_scale": clip.logit_scale,
        "images": {
            "count": int(sum(len(s.rows) for s in img_shards)),
            "pooled_dim": first.field("pooled").type.list_size if first else None,
            "grid_tokens": grid_token_count(clip),  # extract_images checked the tower has a grid
            "shards": [shard_entry(s, root) for s in img_shards],
        },
        "texts": {
            "count": int(sum(len(s.rows) for s in txt_shards)),
            "shards": [shard_entry(s, root) for s in txt_shards],
        },
    }


def shard_entry(shard: Shard, root: Path) -> dict:
    return {"path": os.path.relpath(shard.path, root), "key": shard.key, "rows": len(shard.rows)}


# ---------------------------------------------------------------- loaders
#
# A job reads what it needs (issue #16): `load_image_features(..., image_ids=...)` reads each
# shard's image_id column, then the pooled / grid columns of only the shards that hold a wanted
# image, one shard at a time, into arrays allocated once at the size of the answer, so its peak
# is the answer plus one shard (the old read concatenated every shard's arrays: ~3.2x the whole
# grid). Training, which needs (nearly) every image, reads the grid from `grid_cache`: one
# contiguous float16 .npy beside the shards, memory-mapped, from which batches gather rows.


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


def _row_groups(file: pq.ParquetFile) -> np.ndarray:
    """The first row of each row group of a shard, and the shard's row count last."""
    sizes = [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)]
    return np.cumsum([0] + sizes)


def _gather(file: pq.ParquetFile, local: np.ndarray, columns: dict, into: dict[str, tuple]) -> None:
    """Write rows `local` of one shard's `columns` ({name: dtype}) into `into` ({name: (array,
    positions)}), reading only the row groups that hold one of them, one at a time: parquet
    decodes a list column with per-value levels, about 7x the values, so a read's transient
    is one group's (ROW_GROUP_ROWS rows), not the shard's."""
    starts = _row_groups(file)
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
        _release_arrow_memory()


def _release_arrow_memory() -> None:
    """Hand the freed buffers of a shard read back to the OS. Arrow's allocator (mimalloc or
    jemalloc) keeps them for reuse otherwise, so a read of shard after shard grew the RSS by
    about a shard each (measured: 1,000 images' rows peaked at 1.3 GB over a 10k store)."""
    pa.default_memory_pool().release_unused()


def feature_rows(ids: np.ndarray, image_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Row of each of `image_ids` in the sorted `ids`; a DistinctcapError names ids without
    features."""
    want = np.asarray(image_ids, dtype=np.int64)
    if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():  # shards are sorted; be safe anyway
        rows = pd.Index(ids).get_indexer(want)
        if (rows < 0).any():
            missing = want[rows < 0][:10].tolist()
            raise DistinctcapError(f"no image features for image ids {missing} (first 10 shown)")
        return rows
    rows = np.minimum(np.searchsorted(ids, want), max(len(ids) - 1, 0))
    bad = (ids[rows] != want) if len(ids) else np.ones(len(want), dtype=bool)
    if bad.any():
        missing = want[bad][:10].tolist()
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


def grid_cache_path(index_path: str | Path) -> Path:
    """Where `grid_cache` keeps the index's grid: `grid/<key>.npy` beside the image shards'
    folder, the key a hash of every image shard's key (so of the CLIP and the images)."""
    index = read_json(index_path)
    shards = index["images"]["shards"]
    if not shards:
        raise DistinctcapError(f"{index_path} lists no image shards")
    folder = (Path(index_path).parent / shards[0]["path"]).parent.parent
    key = digest(index["fingerprint"], [s["key"] for s in shards])[:32]
    return folder / "grid" / f"{key}.npy"


def grid_cache(index_path: str | Path) -> np.ndarray:
    """The grid of every image of the index (float16 (N, G, Dv), sorted by image_id, the values
    `load_image_features` gives) as a read-only-on-disk memory map (copy-on-write in memory).

    Built once per features index, under a lock (concurrent jobs wait for one writer instead
    of each writing the same file): the .npy header, then each shard's grid appended with
    plain writes, one shard at a time (written pages are page cache, not the writer's RSS),
    then renamed into place. Other keys' caches in that folder are removed (a job that still
    maps one keeps reading it). Its pages are the file's: the kernel shares them between jobs
    and drops them under pressure, so a training job's memory is the batches it gathers."""
    import fcntl

    path = grid_cache_path(index_path)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not path.is_file():
                    _write_grid_cache(index_path, path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return np.load(path, mmap_mode="c")


def _write_grid_cache(index_path: str | Path, path: Path) -> None:
    index, files = _shard_files(index_path, "images")
    count, tokens = index["images"]["count"], index["images"]["grid_tokens"]
    width = files[0].schema_arrow.field("grid").type.list_size
    if width % tokens:
        raise DistinctcapError(f"{index_path}: grid width {width} is not a multiple of {tokens}")
    header = {"descr": "<f2", "fortran_order": False, "shape": (count, tokens, width // tokens)}
    log.info("writing the grid cache %s (%.1f GiB)", path, count * width * 2 / 2**30)
    written = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.lib.format.write_array_header_2_0(f, header)
        for file in files:
            for g in range(file.num_row_groups):
                values = _rows(file.read_row_group(g, columns=["grid"]), "grid", np.float16)
                f.write(np.ascontiguousarray(values.astype("<f2", copy=False)).data)
                written += len(values)
                del values
                _release_arrow_memory()
        if written != count:
            raise DistinctcapError(
                f"{index_path} records {count} images; its shards hold {written}"
            )
    for stale in path.parent.glob("*.npy"):
        if stale != path:
            stale.unlink(missing_ok=True)


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


def load_text_features(index_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(caption_ids int64 (M,), embeddings float32 (M, D) L2-normalised), sorted by caption_id."""
    files = _shard_files(index_path, "texts")[1]
    per_shard = [f.read(columns=["caption_id"]).column(0).to_numpy() for f in files]
    if not per_shard:
        return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
    ids = np.concatenate(per_shard).astype(np.int64)
    out = np.empty((len(ids), _width(files, "embedding")), np.float32)
    starts = np.cumsum([0] + [len(s) for s in per_shard])
    for s, file in enumerate(files):  # the answer + one row group's decode at a time
        rows = np.arange(len(per_shard[s]))
        _gather(file, rows, {"embedding": np.float32}, {"embedding": (out, rows + starts[s])})
    return ids, out
