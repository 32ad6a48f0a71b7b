"""Trainer overhead: steps/s of distinctcap.train.trainer.train as a fraction of a bare loop.

The bare loop runs the same model on the same micro-batches (precomputed, already on the
device) with the same arithmetic as the MLE objective (one encoder pass per image, decoder,
token cross-entropy), backward and an AdamW step, and nothing else. `train` adds what a run
needs: batch gathering, the lr schedule, gradient clipping, the finite-loss check, the
progress bar and the curve. Goal: ratio >= 0.85. Repetitions alternate bare / train so a busy
machine slows both alike; the median ratio is printed.

    PYTHONPATH=src python bench/bench_trainer.py [--steps 60] [--reps 3] [--threads 1]
        [--device cuda] [--coco]  # --coco: config.coco.yaml's captioner (512 wide, 6 + 6
                                  # layers) on ViT-B/32-sized features, batch 50
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.core.devices import resolve_device
from distinctcap.core.run import RunConfig, RunPaths
from distinctcap.core.settings import TrainConfig
from distinctcap.features.batches import BatchOrder, CaptionData, encode_batch
from distinctcap.features.read import ImageFeatures
from distinctcap.methods.losses import mle_loss
from distinctcap.train.data import RunData
from distinctcap.train.schedule import autocast_dtype, make_optimizer
from distinctcap.train.trainer import train

CAPTIONER = {
    "vocab_size": 69,
    "width": 128,
    "enc_layers": 2,
    "dec_layers": 2,
    "heads": 4,
    "ffn": 512,
    "dropout": 0.1,
    "max_len": 32,
}


# config.coco.yaml's captioner on ViT-B/32 features at 224 px (49 grid tokens of width 768,
# pooled 512), a COCO-sized vocabulary and captions of up to 20 words
COCO_CAPTIONER = {
    "vocab_size": 10000,
    "width": 512,
    "enc_layers": 6,
    "dec_layers": 6,
    "heads": 8,
    "ffn": 2048,
    "dropout": 0.1,
    "max_len": 22,
}


def shapes_like_data(
    images: int = 2000,
    per_image: int = 5,
    seed: int = 0,
    grid: tuple[int, int] = (64, 128),
    pooled: int = 128,
    vocab: int = 69,
    max_len: int = 32,
) -> RunData:
    """Shapes-world sizes by default: 64 grid tokens of width 128, pooled 128, vocab 69,
    2-26 tokens."""
    g = np.random.default_rng(seed)
    feats = ImageFeatures(
        np.arange(images),
        torch.nn.functional.normalize(torch.randn(images, pooled), dim=-1),
        torch.randn(images, *grid).half(),
    )
    n = images * per_image
    longest = min(27, max_len - 1)
    tokens = [g.integers(4, vocab, size=g.integers(2, longest)).tolist() for _ in range(n)]
    data = CaptionData(
        feats, np.arange(n), np.repeat(np.arange(images), per_image), tokens, max_len
    )
    return RunData(data, None)


def bare_steps_per_s(cfg: dict, data: RunData, steps: int) -> float:
    device = resolve_device(cfg["device"])
    torch.manual_seed(0)
    feats = data.train.features
    model = Captioner(
        CaptionerConfig(
            visual_dim=feats.grid.shape[-1],
            pooled_dim=feats.pooled.shape[-1],
            **cfg["captioner"],
        )
    )
    model = model.to(device).train()
    tc = TrainConfig.from_dict(cfg["train"])
    opt = make_optimizer(model, tc, device)  # fused on a GPU, as the trainer's
    dtype = autocast_dtype(tc.precision, device)  # bf16 on a GPU, as the trainer's
    amp = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
    order = BatchOrder(len(data.train), cfg["train"]["batch_size"], 0, data.train.image_rows)
    batches = [data.train.batch(order.indices(j)).to(device) for j in range(steps)]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for b in batches:
        with amp:
            logits = model.decode(encode_batch(model, b), b.inputs)
            loss = mle_loss(logits, b.labels, 0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return steps / (time.perf_counter() - t0)


def train_steps_per_s(cfg: dict, data: RunData) -> float:
    run = RunConfig.from_effective({k: v for k, v in cfg.items() if k != "device"})
    result = train(run, RunPaths(), resolve_device(cfg["device"]), data)
    return result.steps / result.train_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=None, help="default 64, COCO 50")
    parser.add_argument("--coco", action="store_true", help="config.coco.yaml's captioner")
    parser.add_argument("--images", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    captioner = COCO_CAPTIONER if args.coco else CAPTIONER
    args.batch_size = args.batch_size or (50 if args.coco else 64)
    sizes = {"grid": (49, 768), "pooled": 512, "vocab": 10000, "max_len": 22} if args.coco else {}
    data = shapes_like_data(args.images, **sizes)
    cfg = {
        "name": "bench",
        "method": "mle",
        "seed": 0,
        "device": args.device,
        "captioner": captioner,
        "train": {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "warmup_steps": 10,
            "val_every": 0,
            "checkpoint_every": 0,
            "log_every": 25,
        },
    }
    bare_steps_per_s(cfg, data, 5)  # warm-up
    ratios = []
    for rep in range(args.reps):
        bare = bare_steps_per_s(cfg, data, args.steps)
        trained = train_steps_per_s(cfg, data)
        ratios.append(trained / bare)
        print(
            f"rep {rep}: bare {bare:.2f} steps/s, train {trained:.2f} steps/s, "
            f"ratio {trained / bare:.3f}",
            flush=True,
        )
    device = resolve_device(args.device)
    print(
        f"trainer/bare steps/s ratio (median of {args.reps}): {statistics.median(ratios):.3f} "
        f"on {device} ({args.threads} threads), batch {args.batch_size}, "
        f"{'COCO' if args.coco else 'shapes'} captioner, goal >= 0.85"
    )


if __name__ == "__main__":
    main()
