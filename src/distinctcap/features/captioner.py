"""The pre-trained captioner's own image features (captioner.kind transformers): its frozen vision
tower's states, or the processed pixels when the tower trains, in resumable shards laid out like
CLIP's (distinctcap.features.store).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from distinctcap.captioner.hf import KIND, _transformers, hub_load, load_processor
from distinctcap.core.devices import CPU
from distinctcap.core.io import write_json
from distinctcap.core.logs import progress
from distinctcap.data.quality import decoding
from distinctcap.features.extract import (
    FeatureSettings,
    compute_dtype,
    image_batches,
    loader_workers,
)
from distinctcap.features.store import (
    FORMAT,
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


class ProcessedImages(Dataset):
    """Image files -> pixel values through the model's image processor."""

    def __init__(self, files: Sequence[str], processor):
        self.files, self.processor = list(files), processor

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Tensor:
        with decoding(self.files[i]), Image.open(self.files[i]) as image:
            pixels = self.processor(images=image.convert("RGB"), return_tensors="pt")
        return pixels["pixel_values"][0]


def vision_grid(model, pixels: Tensor, vision: str) -> tuple[Tensor, Tensor]:
    """(pooled (B, D), grid (B, G, Dv)) of a batch of pixels (B, 3, H, W) (see
    extract_vision_features)."""
    if vision == "train":
        return pixels.new_ones(len(pixels), 1).float(), pixels.flatten(1, 2)
    out = model.vision_model(pixel_values=pixels)
    return F.normalize(out.pooler_output.float(), dim=-1), out.last_hidden_state


def vision_manifest(source: str, model, processor, dtype: torch.dtype, vision: str) -> dict:
    """What the cached grid depends on besides the images: the tower's weights and settings."""
    weights = hashlib.sha256()
    for name, value in sorted(model.vision_model.state_dict().items()):
        weights.update(name.encode())
        weights.update(value.detach().float().cpu().numpy().tobytes())
    return {
        "format": FORMAT,
        "captioner": KIND,
        "pretrained": source,
        "vision_config": model.config.vision_config.to_dict(),
        "vision_weights": weights.hexdigest(),
        "preprocess": processor.image_processor.to_dict(),
        "precision": str(dtype).removeprefix("torch."),
        "vision": vision,
    }


def extract_vision_features(
    images: pd.DataFrame,
    source: str,
    index_path: str | os.PathLike,
    cache_dir: str | os.PathLike,
    settings=None,
    device: torch.device = CPU,
    threads: int | None = None,
    vision: str = "frozen",
) -> dict:
    """The captioner's grid of every image, in resumable shards laid out like CLIP's
    (distinctcap.features.extract), and the index JSON `ImageFeatures.load` reads. `vision` frozen:
    the vision tower's last hidden states (float16, 1 + patches tokens) and its pooled output
    (L2-normalised); train: the processed pixels (float16, (3H, W)) and a unit "pooled" 1-vector,
    which the end-to-end captioner ignores."""
    settings = settings or FeatureSettings()
    dtype = compute_dtype(settings.precision, device)
    tf = _transformers()
    model = hub_load(tf.AutoModelForImageTextToText, source).float().to(device).eval()
    processor = load_processor(source)
    info = vision_manifest(source, model, processor, dtype, vision)
    fingerprint = digest({k: v for k, v in info.items() if k != "pretrained"})
    cache = Path(cache_dir)
    images = images.sort_values("image_id").reset_index(drop=True)
    shards = plan_shards(
        "images", image_keys(images), settings.image_shard_size, fingerprint, cache
    )
    clean_cache(cache, shards)
    write_json(info, cache / "manifest.json")
    todo = [s for s in shards if not s.is_done()]
    log.info("captioner image shards: %d reused, %d to compute", len(shards) - len(todo), len(todo))
    loader = DataLoader(
        ProcessedImages(images.file.tolist(), processor),
        batch_sampler=image_batches(todo, settings.batch_size),
        num_workers=loader_workers(settings.workers, device, threads),
        pin_memory=device.type == "cuda",
    )
    ids = images.image_id.to_numpy()
    batches = iter(loader)
    amp = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    bar = progress(total=sum(len(s.rows) for s in todo), desc="captioner features", unit="images")
    with bar, ShardWriter() as writer, torch.inference_mode(), amp:
        for shard in todo:
            pooled, grid = [], []
            while sum(len(p) for p in pooled) < len(shard.rows):
                p, g = vision_grid(model, next(batches).to(device), vision)
                pooled.append(p.cpu())
                grid.append(g.half().cpu())
                bar.update(len(p))
            p, g = torch.cat(pooled), torch.cat(grid)
            check_finite(ids[shard.rows], "image", p, g)
            writer.submit(
                shard,
                {
                    "image_id": pa.array(ids[shard.rows], pa.int64()),
                    "pooled": fixed_list(p.numpy()),
                    "grid": fixed_list(g.numpy()),
                },
            )
    cfg = model.config.vision_config
    side = processor.image_processor.size["height"]  # the pixels' H in vision train
    tokens, width = ((cfg.image_size // cfg.patch_size) ** 2 + 1, cfg.hidden_size)
    index = {
        "manifest": info,
        "fingerprint": fingerprint,
        "logit_scale": None,
        "images": {
            "count": len(images),
            "pooled_dim": width if vision == "frozen" else 1,
            "grid_tokens": tokens if vision == "frozen" else 3 * side,
            "shards": [shard_entry(s, Path(index_path).parent) for s in shards],
        },
        "texts": {"count": 0, "shards": []},
    }
    write_json(index, index_path)
    return index
