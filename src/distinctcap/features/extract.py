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
preprocessing, precision) recomputes everything: features are never mixed."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import CenterCrop, Compose, Resize

from distinctcap.clip.load import LoadedClip, byte_transform, normalize
from distinctcap.clip.text import encode_text
from distinctcap.core.devices import CPU
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import file_sha256, write_json
from distinctcap.core.logs import progress
from distinctcap.data.quality import decoding
from distinctcap.features.decode import (
    ImageBytes,
    as_is,
    device_batches,
    resolve_decode,
    tensor_steps,
    unpacked,
)
from distinctcap.features.shm import LOADER_PREFETCH, workers_fitting_shm
from distinctcap.features.store import (
    FORMAT,
    Shard,
    ShardWriter,
    check_finite,
    clean_cache,
    digest,
    fixed_list,
    image_keys,
    plan_shards,
    shard_entry,
)

log = logging.getLogger(__name__)


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
    # pil | tensor | auto: tensor (JPEGs decoded and resized on the device) on CUDA, pil on
    # the CPU (distinctcap.features.decode)
    decode: str = "auto"
    text_batch_size: int | str = "auto"  # auto: batch_size on the CPU, 4 x batch_size on a GPU


def loader_workers(workers: int | str, device: torch.device, threads: int | None) -> int:
    """DataLoader workers of `FeatureSettings.workers`: a number, or auto (see there)."""
    if workers != "auto":
        return int(workers)
    return max(0, (threads or 1) - 1) if device.type == "cuda" else 0


def compute_dtype(precision: str, device: torch.device) -> torch.dtype:
    if precision == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return DTYPES[precision]


def manifest(clip: LoadedClip, dtype: torch.dtype, decode: str = "pil") -> dict:
    """Everything the features depend on besides the inputs themselves. `decode` is recorded
    only when it is not pil, so features made before it existed keep their fingerprint."""
    return {
        "format": FORMAT,
        "arch": clip.arch,
        "pretrained": clip.pretrained,
        **({"tag": clip.tag} if clip.tag else {}),  # its settings change the features
        "weight_files": [str(f) for f in clip.weight_files],
        "weights_sha256": file_sha256(clip.weight_files),
        "preprocess": clip.preprocess_cfg(),
        "context_length": int(getattr(clip.model, "context_length", 0) or 0),
        "precision": str(dtype).removeprefix("torch."),
        **({"decode": decode} if decode != "pil" else {}),
    }


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
    batches: Iterable[torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
    mean: torch.Tensor,
    std: torch.Tensor,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(pooled L2-normalised float32 (B, D), its norms (B,), grid tokens (B, G, Dv)) per uint8
    batch (B, 3, H, W), on `device`."""
    amp = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    with torch.inference_mode(), amp:
        for batch in batches:
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


def image_bytes(clip: LoadedClip) -> int:
    """Bytes of one image as the loader ships it (uint8, 3 x the model's input size)."""
    size = clip.preprocess_cfg()["size"]
    height, width = (size, size) if isinstance(size, int) else size
    return 3 * height * width


@torch.inference_mode()
def grid_token_count(clip: LoadedClip) -> int:
    """G, from one blank image at the model's input size."""
    size = clip.preprocess_cfg()["size"]
    height, width = (size, size) if isinstance(size, int) else size
    param = next(clip.model.visual.parameters())
    blank = torch.zeros(1, 3, height, width, device=param.device, dtype=param.dtype)
    return pooled_and_grid(clip.model.visual, blank)[1].shape[1]


def decoder(settings: FeatureSettings, device: torch.device, clip: LoadedClip) -> str:
    """The image decoder clip.features.decode resolves to (distinctcap.features.decode)."""
    return resolve_decode(settings.decode, device, byte_transform(clip.preprocess)[0])


def image_loader(
    files: list[str],
    clip: LoadedClip,
    shards: list[Shard],
    settings: FeatureSettings,
    device: torch.device,
    threads: int | None,
    fallbacks: Counter | None = None,
) -> Iterator[torch.Tensor]:
    """uint8 batches (B, 3, H, W) of the shards' images through the CLIP's resize/crop, decoded
    by PIL in DataLoader workers or, for `decode` tensor, on `device` from the bytes they read
    (one tensor per batch: decode.Packed); why each file PIL decoded instead is counted in
    `fallbacks`."""
    to_bytes = byte_transform(clip.preprocess)[0]
    pil_path = ImageFiles(files, to_bytes, clip.preprocess_cfg()["size"])
    tensor = decoder(settings, device, clip) == "tensor"
    workers = loader_workers(settings.workers, device, threads)
    if workers:
        workers = workers_fitting_shm(workers, settings.batch_size * image_bytes(clip))
    log.info(
        "images: %d DataLoader workers, pinned memory %s, decoded by %s",
        workers, device.type == "cuda", "the device" if tensor else "PIL",
    )
    loader = DataLoader(
        ImageBytes(files, pil_path) if tensor else pil_path,
        batch_sampler=image_batches(shards, settings.batch_size),
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=LOADER_PREFETCH if workers else None,
        collate_fn=as_is if tensor else None,
    )
    if tensor:
        items = unpacked(own_errors(loader), fallbacks)
        return device_batches(items, tensor_steps(to_bytes), pil_path, device, fallbacks)
    return own_errors(loader)


def extract_images(
    images: pd.DataFrame,
    clip: LoadedClip,
    shards: list[Shard],
    settings: FeatureSettings,
    device: torch.device,
    dtype: torch.dtype,
    on_shard: Callable[[Shard], None] | None = None,
    threads: int | None = None,
    fallbacks: Counter | None = None,
) -> None:
    """Compute and write the given image shards; `on_shard` runs after each one is renamed.
    `threads`: the job's CPUs, for `settings.workers` auto. With the tensor decoder, the files
    PIL decoded instead are counted by reason in `fallbacks` and logged (decode.why_pil)."""
    visual = clip.model.visual
    if not hasattr(visual, "output_tokens") and not hasattr(visual, "forward_intermediates"):
        raise DistinctcapError(
            f"clip.arch = {clip.arch!r} gives no grid tokens; use a ViT or a conv tower"
        )
    mean, std = byte_transform(clip.preprocess)[1:]
    fallbacks = Counter() if fallbacks is None else fallbacks
    files = images.file.tolist()
    pixels = image_loader(files, clip, shards, settings, device, threads, fallbacks)
    batches = encode_images(clip, pixels, device, dtype, mean, std)
    ids = images.image_id.to_numpy()
    total = sum(len(s.rows) for s in shards)
    bar = progress(total=total, desc="image features", unit="images", smoothing=0.1)
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
    if fallbacks:
        log.info("images: %s", fallback_line(fallbacks, total))


def fallback_line(fallbacks: Counter, total: int) -> str:
    """The files the tensor decoder left to PIL, by reason: a share of CMYK or cut files large
    enough to slow the stage shows here (and in bench_features.py)."""
    reasons = ", ".join(f"{n} {why}" for why, n in fallbacks.most_common())
    line = f"{sum(fallbacks.values())} of {total} decoded by PIL, not the device"
    return f"{line} ({reasons})" if reasons else line


class CaptionTokens(Dataset):
    """Batches of captions (rows of `texts`) -> their token ids, so DataLoader workers
    tokenise while the device encodes."""

    def __init__(self, texts: list[str], batches: list[list[int]], tokenizer):
        self.texts, self.batches, self.tokenizer = texts, batches, tokenizer

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, b: int) -> torch.Tensor:
        return self.tokenizer([self.texts[r] for r in self.batches[b]])


def text_batch_size(settings: FeatureSettings, device: torch.device) -> int:
    """Captions per text forward (clip.features.text_batch_size; auto: batch_size on the CPU,
    whose numbers stay as they were, 4 x batch_size on a GPU)."""
    if settings.text_batch_size != "auto":
        return int(settings.text_batch_size)
    return settings.batch_size * (4 if device.type == "cuda" else 1)


def extract_texts(
    captions: pd.DataFrame,
    clip: LoadedClip,
    shards: list[Shard],
    settings: FeatureSettings,
    device: torch.device,
    dtype: torch.dtype,
    on_shard: Callable[[Shard], None] | None = None,
    threads: int | None = None,
) -> None:
    """Compute and write the given text shards; tokenised by `settings.workers` DataLoader
    workers (auto: see FeatureSettings; `threads` the job's CPUs)."""
    ids, texts = captions.caption_id.to_numpy(), captions.text.tolist()
    batches = image_batches(shards, text_batch_size(settings, device))
    workers = loader_workers(settings.workers, device, threads)
    loader = DataLoader(
        CaptionTokens(texts, batches, clip.tokenizer),
        batch_size=None,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=LOADER_PREFETCH if workers else None,
    )
    tokens_of = iter(loader)
    amp = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    bar = progress(total=sum(len(s.rows) for s in shards), desc="text features", unit="captions")
    with bar, ShardWriter(on_shard) as writer, torch.inference_mode(), amp:
        for shard in shards:
            out, done = [], 0
            while done < len(shard.rows):
                tokens = next(tokens_of).to(device, non_blocking=True)
                out.append(F.normalize(encode_text(clip.model, tokens).float(), dim=-1))
                done += len(tokens)
                bar.update(len(tokens))
            emb = torch.cat(out).cpu()
            check_finite(ids[shard.rows], "caption", emb)
            writer.submit(
                shard,
                {
                    "caption_id": pa.array(ids[shard.rows], pa.int64()),
                    "embedding": fixed_list(emb.numpy()),
                },
            )


def extract_features(
    images: pd.DataFrame,
    captions: pd.DataFrame,
    clip: LoadedClip,
    index_path: str | Path,
    cache_dir: str | Path,
    settings: FeatureSettings | None = None,
    device: torch.device = CPU,
    on_shard: Callable[[Shard], None] | None = None,
    threads: int | None = None,
) -> dict:
    """Features of every image and caption; reuses finished shards; writes the index JSON.

    `on_shard(shard)` is called after each newly written shard (progress hooks, tests).
    `threads`: the CPUs of the job (snakemake.threads), for `settings.workers` auto.
    """
    settings = settings or FeatureSettings()
    dtype = compute_dtype(settings.precision, device)
    clip.model.to(device).eval()
    cache = Path(cache_dir)
    info = manifest(clip, dtype, decoder(settings, device, clip))
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
    extract_images(images, clip, todo, settings, device, dtype, on_shard, threads)
    todo = [s for s in txt_shards if not s.is_done()]
    log.info("text shards: %d reused, %d to compute", len(txt_shards) - len(todo), len(todo))
    extract_texts(captions, clip, todo, settings, device, dtype, on_shard, threads)
    index = build_index(info, fingerprint, clip, img_shards, txt_shards, Path(index_path).parent)
    write_json(index, index_path)
    return index


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
