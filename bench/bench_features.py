"""Benchmark of CLIP feature extraction (distinctcap.features.extract); prints ratios.

End-to-end image features/s (decode, resize, DataLoader workers, forward with grid tokens,
NaN check, parquet shards written atomically) as a fraction of the model-only forward/s of the
same CLIP on the same images already decoded in memory, same batch size, same device, same
run. On a shared box wall-clock rates drift, so the main process's CPU seconds are compared
too (meaningful for workers = 0). Also prints text features captions/s.

Two worlds:
- shapes PNGs already at the model's size (`--images N`, `--coco`: 224 px for a random-init
  ViT-B-32): no resize, little decoding;
- `--coco-jpegs N`: N generated JPEGs at COCO's sizes (640 x 480 and the like, both
  orientations) and a random-init ViT-B-32 (`--arch`: another CLIP, e.g. shapes-vit-tiny for
  a CPU check that is mostly decoding, seconds instead of minutes). Both decoders
  (clip.features.decode pil and tensor) run in the same process, each after its own
  model-only baseline, and are timed in steady state: the images of every shard after the
  second, over the time from the first shard's rename to the last's (steady_end_to_end;
  worker start-up, nvjpeg's and the model's first calls left out). Shards of `--shard-size`
  images (default: the batch size, at most a quarter of N, so a small N still has a steady
  window). One file in 32 is an odd one COCO also has (grayscale, CMYK, progressive, bytes
  after the end marker), so the PIL fallback and nvjpeg's per-image path run too: the
  `fallback rate` line counts, by reason, the files the tensor decoder left to PIL. Prints
  `ratio ... = X` lines and the lowest cosine between the two decoders' pooled features.
  Goal on a GPU: tensor end to end >= 0.7 of model-only.

    python bench/bench_features.py [--images 2048 --batch-size 256 --workers 0 1 --threads 1]
    python bench/bench_features.py --coco-jpegs 4096 --device cuda
    python bench/bench_features.py --coco-jpegs 64 --arch shapes-vit-tiny --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import open_clip
import pandas as pd
import pyarrow.parquet as pq
import torch
from PIL import Image

from distinctcap.clip.load import byte_transform, load_clip, load_images, normalize
from distinctcap.core.devices import resolve_device
from distinctcap.core.io import read_table
from distinctcap.data.prepare import prepare
from distinctcap.features.extract import (
    FeatureSettings,
    compute_dtype,
    extract_images,
    extract_texts,
    fallback_line,
)
from distinctcap.features.store import plan_shards
from distinctcap.train.clip import save_weights


def shapes_world(root: Path, n: int, size: int = 64) -> tuple:
    shapes = {"n_train": n, "n_val": 1, "n_test": 1, "seed": 0, "image_size": size}
    data = {"source": "shapes", "shapes": shapes}
    out = {k: str(root / f"data/{k}.parquet") for k in ("images", "captions", "quarantine")}
    prepare(data, "skip", {**out, "vocab": str(root / "data/vocab.json")})
    return read_table(out["images"], "images"), read_table(out["captions"], "captions")


# (width, height) of common COCO images; each JPEG takes one at random
COCO_SIZES = [(640, 480), (640, 427), (480, 640), (640, 426), (427, 640), (640, 360), (500, 375)]


# One file in ODD_EVERY is odd, the kinds in turn: enough for each path to run and be counted
# (the `fallback rate` line), not COCO's shares.
ODD_EVERY = 32
ODD_KINDS = ("grayscale", "cmyk", "progressive", "padded")


def coco_jpeg(path: Path, size: tuple[int, int], seed: int, kind: str = "rgb") -> None:
    """A JPEG of `size` with photo-like statistics at little cost: smooth colour fields (a
    bicubic upsampling of coarse noise) plus fine noise, quality 90 (~100-200 KB at 640 x 480).
    `kind` (ODD_KINDS): grayscale and CMYK go to PIL (decode.why_pil), progressive to nvjpeg's
    per-image path, padded (bytes after its end marker) to PIL."""
    rng = np.random.default_rng(seed)
    width, height = size
    coarse = rng.integers(0, 256, (height // 24 + 2, width // 24 + 2, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize(size, Image.BICUBIC), dtype=np.int16)
    grain = rng.integers(-12, 13, (height, width, 3), dtype=np.int16)
    image = Image.fromarray((smooth + grain).clip(0, 255).astype(np.uint8))
    modes = {"grayscale": "L", "cmyk": "CMYK"}
    image.convert(modes.get(kind, "RGB")).save(path, quality=90, progressive=kind == "progressive")
    if kind == "padded":
        with open(path, "ab") as f:
            f.write(b"\0" * 64)


def odd_kind(i: int) -> str:
    """The kind of the i-th generated file (ODD_EVERY)."""
    if i % ODD_EVERY != ODD_EVERY - 1:
        return "rgb"
    return ODD_KINDS[(i // ODD_EVERY) % len(ODD_KINDS)]


def coco_jpegs(root: Path, n: int) -> pd.DataFrame:
    """`n` JPEGs at COCO's sizes under root/jpegs, written on a thread pool: images table."""
    folder = root / "jpegs"
    folder.mkdir(parents=True)
    sizes = np.random.default_rng(0).integers(0, len(COCO_SIZES), n)
    files = [folder / f"{i:07d}.jpg" for i in range(n)]
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        kinds = map(odd_kind, range(n))
        list(pool.map(coco_jpeg, files, [COCO_SIZES[s] for s in sizes], range(n), kinds))
    return pd.DataFrame({"image_id": np.arange(n, dtype=np.int64), "file": map(str, files)})


def model_only(clip, pixels, batch_size: int, device: torch.device, dtype, n: int = 0) -> tuple:
    """(images/s, CPU s) of normalise + visual forward on pre-decoded uint8 batches: `n`
    images (default: all of `pixels`), going round `pixels` as often as it takes."""
    _, mean, std = byte_transform(clip.preprocess)
    visual = clip.model.visual
    visual.output_tokens = True
    amp = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    with torch.inference_mode(), amp:
        visual(normalize(pixels[:batch_size].to(device), mean, std))  # warm-up
        sync(device)
        start, cpu = time.perf_counter(), time.process_time()
        batches = pixels.split(batch_size)
        done = 0
        while done < (n or len(pixels)):
            batch = batches[(done // batch_size) % len(batches)]
            pooled, tokens = visual(normalize(batch.to(device), mean, std))
            pooled.float().cpu(), tokens.half().cpu()
            done += len(batch)
        sync(device)
    return done / (time.perf_counter() - start), time.process_time() - cpu


def end_to_end(clip, images, settings, device, dtype, cache: Path) -> tuple:
    """(images/s, CPU s of this process) of extract_images: decode to written shards."""
    keys = list(zip(images.image_id.astype(int), images.file, strict=True))
    shards = plan_shards("images", keys, settings.image_shard_size, f"bench{time.time()}", cache)
    start, cpu = time.perf_counter(), time.process_time()
    extract_images(images, clip, shards, settings, device, dtype)
    sync(device)
    return len(images) / (time.perf_counter() - start), time.process_time() - cpu


def steady_end_to_end(clip, images, settings, device, dtype, cache: Path) -> tuple:
    """(images/s in steady state (module docstring), images per CPU second of this process,
    the shards, the files PIL decoded instead by reason) of extract_images.

    A shard's rename is seen (`on_shard`) when the next shard is submitted (store.ShardWriter),
    so the first stamp comes once shards 0 and 1 are computed: the window from it to the last
    computes shards[2:] exactly (and writes shards[1:], overlapped), so those are the images
    counted (counting shards[1:] overstated the rate by (n-1)/(n-2): 7/6 at 8 shards)."""
    keys = list(zip(images.image_id.astype(int), images.file, strict=True))
    shards = plan_shards("images", keys, settings.image_shard_size, f"bench{time.time()}", cache)
    if len(shards) < 3:
        raise SystemExit("steady state needs three shards or more: more images or --shard-size")
    written = []  # (wall, this process's CPU) seconds at each shard's rename
    fallbacks = Counter()
    extract_images(
        images, clip, shards, settings, device, dtype,
        on_shard=lambda shard: written.append((time.perf_counter(), time.process_time())),
        threads=os.cpu_count(),
        fallbacks=fallbacks,
    )
    steady = sum(len(s.rows) for s in shards[2:])
    wall, cpu = (b - a for a, b in zip(written[0], written[-1], strict=True))
    return steady / wall, steady / cpu, shards, fallbacks


def lowest_cosine(a: list, b: list) -> float:
    """The lowest cosine between the pooled features of the same images in two shard lists."""
    def pooled(shards):
        return np.concatenate(
            [np.stack(pq.read_table(s.path, columns=["pooled"]).column(0).to_numpy(
                zero_copy_only=False)) for s in shards]
        )
    return float((pooled(a) * pooled(b)).sum(axis=1).min())


def say(line: str) -> None:
    """Print a result line at once: bench/gpu_check.sh keeps what a run killed at its limit
    printed, so every number must be out as soon as it exists."""
    print(line, flush=True)


def shard_size(args) -> int:
    """--shard-size, else the batch size, at most a quarter of --coco-jpegs: >= 4 shards, so
    the steady window (shards[2:]) has two or more (16 shards at 4,096 and batch 256)."""
    return args.shard_size or max(1, min(args.batch_size, args.coco_jpegs // 4))


def coco_jpeg_bench(args, root: Path, device: torch.device) -> None:
    """The --coco-jpegs run: pil and tensor decoders, each against model-only, same process;
    batches no larger than a shard (batches never straddle shards, and model-only must run the
    same batch size)."""
    start = time.perf_counter()
    shard = shard_size(args)
    batch_size = min(args.batch_size, shard)
    images = coco_jpegs(root, args.coco_jpegs)
    say(json.dumps({"jpegs": len(images), "generated_s": round(time.perf_counter() - start, 1),
                    "mean_kb": round(sum(os.path.getsize(f) for f in images.file)
                                     / len(images) / 1024, 1),
                    "shard_size": shard, "batch_size": batch_size}))
    save_weights(open_clip.create_model(args.arch), root / "clip.pt")
    clip = load_clip(args.arch, str(root / "clip.pt"), device)
    dtype = compute_dtype("auto", device)
    sample = images.file.tolist()[: 2 * batch_size]  # model-only goes round them
    pixels = load_images(sample, byte_transform(clip.preprocess)[0])
    rates, shards = {}, {}
    for workers in args.workers:
        for decode in ("pil", "tensor"):
            base, base_cpu = model_only(clip, pixels, batch_size, device, dtype, len(images))
            settings = FeatureSettings(batch_size=batch_size, workers=workers,
                                       image_shard_size=shard, decode=decode)
            cache = root / f"cache-{decode}-{workers}"
            rate, per_cpu, shards[decode], fallbacks = steady_end_to_end(
                clip, images, settings, device, dtype, cache
            )
            rates[decode] = rate
            say(json.dumps({"decode": decode, "workers": workers,
                            "model_only_images/s": round(base, 1),
                            "end_to_end_images/s": round(rate, 1)}))
            say(f"ratio end_to_end/model_only {decode} workers={workers} = {rate / base:.3f}")
            if workers == 0:  # this process did all the work: CPU time drifts less than wall
                cpu_ratio = per_cpu / (len(images) / base_cpu)
                say(f"ratio cpu end_to_end/model_only {decode} workers=0 = {cpu_ratio:.3f}")
            if decode == "tensor":
                say(f"fallback rate tensor workers={workers} = "
                    f"{sum(fallbacks.values()) / len(images):.3f}: "
                    + fallback_line(fallbacks, len(images)))
        say(f"ratio tensor/pil end_to_end workers={workers} = "
            f"{rates['tensor'] / rates['pil']:.3f}")
        say(json.dumps({"pil_vs_tensor_lowest_cosine": round(
            lowest_cosine(shards["pil"], shards["tensor"]), 6)}))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--arch", help="default shapes-vit-tiny; --coco, --coco-jpegs: ViT-B-32")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument(
        "--workers",
        nargs="+",
        help="loader workers to run (numbers or auto); default 0 1 2, --coco-jpegs: auto",
    )
    p.add_argument(
        "--coco-jpegs",
        type=int,
        metavar="N",
        help="N generated JPEGs at COCO sizes, ViT-B-32, decoders pil and tensor (docstring)",
    )
    p.add_argument(
        "--shard-size",
        type=int,
        help="--coco-jpegs: images per shard (default: the batch size, at most N/4)",
    )
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
    args.arch = args.arch or ("ViT-B-32" if args.coco_jpegs else "shapes-vit-tiny")
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    default = ["auto"] if args.coco_jpegs else [0, 1, 2]
    args.workers = [w if w == "auto" else int(w) for w in args.workers or default]
    if args.coco_jpegs:
        with tempfile.TemporaryDirectory() as tmp:
            say(json.dumps({"device": str(device), "threads": torch.get_num_threads(),
                            "cpus": os.cpu_count()}))
            coco_jpeg_bench(args, Path(tmp), device)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        images, captions = shapes_world(root, args.images, 224 if args.coco else 64)
        save_weights(open_clip.create_model(args.arch), root / "clip.pt")
        clip = load_clip(args.arch, str(root / "clip.pt"), device)
        dtype = compute_dtype("auto", device)
        pixels = load_images(images.file.tolist(), byte_transform(clip.preprocess)[0])
        say(
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
            say(json.dumps(row))
        settings = FeatureSettings(batch_size=args.batch_size)
        keys = list(zip(captions.caption_id.astype(int), captions.text, strict=True))
        shards = plan_shards("texts", keys, settings.text_shard_size, "bench", root / "t")
        start = time.perf_counter()
        extract_texts(captions, clip, shards, settings, device, dtype)
        rate = len(captions) / (time.perf_counter() - start)
        say(json.dumps({"text_features_captions/s": round(rate, 1)}))


if __name__ == "__main__":
    main()
