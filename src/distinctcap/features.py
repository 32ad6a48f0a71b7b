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


def write_shard(shard: Shard, columns: dict[str, pa.Array]) -> None:
    """Atomically; no dictionary encoding or statistics: float vectors gain nothing from them
    and they cost more than the rest of the write."""
    table = pa.table(columns).replace_schema_metadata({KEY: shard.key})
    with atomic_path(shard.path) as tmp:
        pq.write_table(table, tmp, use_dictionary=False, write_statistics=False)


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


def _read_shards(index_path: str | Path, kind: str, columns: list[str]) -> list[pa.Table]:
    index = read_json(index_path)
    root = Path(index_path).parent
    tables = []
    for entry in index[kind]["shards"]:
        path = root / entry["path"]
        table = pq.read_table(path, columns=columns) if path.is_file() else None
        meta = (table.schema.metadata or {}) if table is not None else {}
        if table is None or meta.get(KEY, b"").decode() != entry["key"]:
            raise DistinctcapError(
                f"{path} is missing or was computed for other inputs or another CLIP than "
                f"{index_path} records; rerun the extract_features rule"
            )
        tables.append(table)
    return tables


def _matrix(tables: list[pa.Table], column: str, dtype) -> np.ndarray:
    if not tables:
        return np.zeros((0, 0), dtype)
    chunks = [t.column(column).combine_chunks() for t in tables]
    width = chunks[0].type.list_size
    return np.concatenate([c.flatten().to_numpy().reshape(-1, width) for c in chunks]).astype(
        dtype, copy=False
    )


def load_image_features(
    index_path: str | Path, grid: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(image_ids int64 (N,), pooled float32 (N, D) L2-normalised, grid float16 (N, G, Dv)),
    sorted by image_id. `grid=False` skips reading the grid tokens and returns None for them."""
    columns = ["image_id", "pooled"] + (["grid"] if grid else [])
    tables = _read_shards(index_path, "images", columns)
    ids = np.concatenate([t.column("image_id").to_numpy() for t in tables]).astype(np.int64)
    pooled = _matrix(tables, "pooled", np.float32)
    if not grid:
        return ids, pooled, None
    tokens = read_json(index_path)["images"]["grid_tokens"]
    return ids, pooled, _matrix(tables, "grid", np.float16).reshape(len(ids), tokens, -1)


def load_image_norms(index_path: str | Path) -> np.ndarray | None:
    """Norm of each image's pooled embedding before L2 normalisation, float32 (N,), in the
    order of `load_image_features` (pooled * norm is CLIP's unnormalised projection); None for
    features of format 1, which did not store it (only specificity dp/cdp need it)."""
    if read_json(index_path)["manifest"].get("format", 1) < 2:
        return None
    tables = _read_shards(index_path, "images", ["pooled_norm"])
    if not tables:
        return np.zeros(0, np.float32)
    return np.concatenate([t.column("pooled_norm").to_numpy() for t in tables]).astype(np.float32)


def load_text_features(index_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(caption_ids int64 (M,), embeddings float32 (M, D) L2-normalised), sorted by caption_id."""
    tables = _read_shards(index_path, "texts", ["caption_id", "embedding"])
    ids = np.concatenate([t.column("caption_id").to_numpy() for t in tables]).astype(np.int64)
    return ids, _matrix(tables, "embedding", np.float32)
