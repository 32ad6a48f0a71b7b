"""Benchmark of CLIP feature extraction (distinctcap.features.extract); prints ratios.

End-to-end image features/s (decode PNG, resize, DataLoader workers, forward with grid tokens,
NaN check, parquet shards written atomically) as a fraction of the model-only forward/s of the
same CLIP on the same images already decoded in memory, same batch size, same device, same
run. Goal >= 0.8: loading must not be the bottleneck. On a shared box wall-clock rates drift,
so the main process's CPU seconds are compared too (meaningful for workers = 0). Also prints
text features captions/s.

    python bench/bench_features.py [--images 2048 --batch-size 256 --workers 0 1 --threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import open_clip
import torch

from distinctcap.clip.load import byte_transform, load_clip, load_images, normalize
from distinctcap.clip.train import save_weights
from distinctcap.core.devices import resolve_device
from distinctcap.core.io import read_table
from distinctcap.data.prepare import prepare
from distinctcap.features.extract import (
    FeatureSettings,
    compute_dtype,
    extract_images,
    extract_texts,
)
from distinctcap.features.store import plan_shards


def shapes_world(root: Path, n: int, size: int = 64) -> tuple:
    shapes = {"n_train": n, "n_val": 1, "n_test": 1, "seed": 0, "image_size": size}
    data = {"source": "shapes", "shapes": shapes}
    out = {k: str(root / f"data/{k}.parquet") for k in ("images", "captions", "quarantine")}
    prepare(data, "skip", {**out, "vocab": str(root / "data/vocab.json")})
    return read_table(out["images"], "images"), read_table(out["captions"], "captions")


def model_only(clip, pixels, batch_size: int, device: torch.device, dtype) -> tuple:
    """(images/s, CPU s) of normalise + visual forward on pre-decoded uint8 batches."""
    _, mean, std = byte_transform(clip.preprocess)
    visual = clip.model.visual
    visual.output_tokens = True
    amp = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    with torch.inference_mode(), amp:
        visual(normalize(pixels[:batch_size].to(device), mean, std))  # warm-up
        sync(device)
        start, cpu = time.perf_counter(), time.process_time()
        for batch in pixels.split(batch_size):
            pooled, tokens = visual(normalize(batch.to(device), mean, std))
            pooled.float().cpu(), tokens.half().cpu()
        sync(device)
    return len(pixels) / (time.perf_counter() - start), time.process_time() - cpu


def end_to_end(clip, images, settings, device, dtype, cache: Path) -> tuple:
    """(images/s, CPU s of this process) of extract_images: decode to written shards."""
    keys = list(zip(images.image_id.astype(int), images.file, strict=True))
    shards = plan_shards("images", keys, settings.image_shard_size, f"bench{time.time()}", cache)
    start, cpu = time.perf_counter(), time.process_time()
    extract_images(images, clip, shards, settings, device, dtype)
    sync(device)
    return len(images) / (time.perf_counter() - start), time.process_time() - cpu


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--arch", default="shapes-vit-tiny")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--coco",
        action="store_true",
        help="COCO sizes: a random-init ViT-B-32 on 224 px images (overrides --arch)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch threads for both measurements",
    )
    args = p.parse_args()
    if args.coco:
        args.arch = "ViT-B-32"
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        images, captions = shapes_world(root, args.images, 224 if args.coco else 64)
        save_weights(open_clip.create_model(args.arch), root / "clip.pt")
        clip = load_clip(args.arch, str(root / "clip.pt"), device)
        dtype = compute_dtype("auto", device)
        pixels = load_images(images.file.tolist(), byte_transform(clip.preprocess)[0])
        print(
            json.dumps(
                {
                    "device": str(device),
                    "threads": torch.get_num_threads(),
                    "cpus": os.cpu_count(),
                    "images": len(images),
                }
            )
        )
        for workers in args.workers:  # baseline right before each run: shared boxes drift
            base, base_cpu = model_only(clip, pixels, args.batch_size, device, dtype)
            settings = FeatureSettings(batch_size=args.batch_size, workers=workers)
            cache = root / f"cache{workers}"
            rate, cpu = end_to_end(clip, images, settings, device, dtype, cache)
            row = {
                "workers": workers,
                "model_only_images/s": round(base, 1),
                "end_to_end_images/s": round(rate, 1),
                "ratio": round(rate / base, 3),
            }
            if workers == 0:
                row["cpu_ratio"] = round(base_cpu / cpu, 3)
            print(json.dumps(row))
        settings = FeatureSettings(batch_size=args.batch_size)
        keys = list(zip(captions.caption_id.astype(int), captions.text, strict=True))
        shards = plan_shards("texts", keys, settings.text_shard_size, "bench", root / "t")
        start = time.perf_counter()
        extract_texts(captions, clip, shards, settings, device, dtype)
        rate = len(captions) / (time.perf_counter() - start)
        print(json.dumps({"text_features_captions/s": round(rate, 1)}))


if __name__ == "__main__":
    main()
