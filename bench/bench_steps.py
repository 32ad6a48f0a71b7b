"""Step time of every training method, before and after issue 30's changes, in one run.

    PYTHONPATH=src python bench/bench_steps.py --coco [--device cuda] [--steps 30] [--reps 3]
        [--methods mle,unkt,cl,smile,specificity,scst] [--backend inductor] [--no-compile]

Each method's objective (distinctcap.methods) runs inside the real trainer step
(`Trainer.train_step`: gather, autocast, loss, backward, clipping, AdamW, schedule) on the
synthetic data of bench_trainer.py (`shapes_like_data`); a teacher or reference is a random
captioner of the same shape, specificity's CLIP a random open_clip model (ViT-B-32 with
--coco, shapes-vit-tiny otherwise), its contrastive images the pooled features' neighbours.
Runs as config.coco.yaml sets them: batch 50 grouped by image, specificity batch 2 shuffled
(loss ccos), SCST 5 samples of each of the batch's 10 images with the CIDEr-D reward over the
synthetic training captions (issue 49; a random model rarely emits eos, so its samples run to
max_len, the worst case); every other option the method's default.

Variants per method, each a fresh trainer, built, warmed up and timed in turn:
  before    the host data path (gather on the host, copy each batch: train.data.to_device), eager
  data      the batch gathered on the device (train.data.DeviceCaptions), eager
  compiled  `data` with train.compile (the blocks of the model and of its frozen models)
The host syncs the change removed (the objectives' extras, the index copies of encode_batch,
decoding's per-token "all done?") are gone in all three, so `before` understates the old step.

Prints as soon as each exists (a lease or `timeout` may stop it at any point): each variant's
ms/step (the median of --reps windows of --steps steps; wall time on a GPU, process time on
the CPU), each compiled variant's compile time (`compile ... s`: the trainer's build, whose
probe compiles the blocks, plus the warm-up steps, which compile the dynamic-length graphs),
each `ratio ... = X` that the variants so far allow, and the peak GPU memory. At the end, or
on SIGTERM, every ratio again and the issue's goals on one card as PASS / FAIL lines: MLE
before/compiled >= 4, specificity before/compiled >= 3, UNKT/MLE (compiled) <= 1.6.
--coco: config.coco.yaml's captioner (6 + 6 layers, width 512) on ViT-B/32-sized features
(49 x 768 grid, pooled 512), vocabulary 10,000; without it the shapes-sized captioner.
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import statistics
import time

import numpy as np
import torch
from bench_trainer import CAPTIONER, COCO_CAPTIONER, shapes_like_data

from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.core.devices import resolve_device
from distinctcap.core.run import RunConfig, RunPaths
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.features.batches import Batch
from distinctcap.train.data import RunData, to_device
from distinctcap.train.trainer import Trainer

METHODS = ("mle", "unkt", "cl", "smile", "specificity", "scst")
EDGES = {"unkt": "teacher", "cl": "reference"}
VARIANTS = ("before", "data", "compiled")
GOALS = (  # (name, ratio key, relation, bound)
    ("MLE step >= 4x today's", "mle before/compiled", ">=", 4.0),
    ("specificity step >= 3x today's", "specificity before/compiled", ">=", 3.0),
    ("UNKT step <= 1.6x an MLE step", "unkt/mle compiled", "<=", 1.6),
)


class BenchTrainer(Trainer):
    """The trainer with in-memory frozen models and CLIP, and optionally the old data path."""

    def __init__(self, run: RunConfig, device: torch.device, data: RunData, parts: dict,
                 host_batches: bool):  # fmt: skip
        self.parts, self.host_batches = parts, host_batches
        super().__init__(run, RunPaths(), device, data)

    def _load_frozen(self, edge: str) -> Captioner:
        model = copy.deepcopy(self.parts["frozen"]).to(self.device)
        return model.eval().requires_grad_(False)

    def _make_objective(self, objective_cls: type) -> object:
        if self.run_config.method != "specificity":
            return super()._make_objective(objective_cls)
        extra = {"clip": self.parts["clip"], "neighbours": self.parts["neighbours"]}
        return objective_cls(self.run_config, self.ctx, **extra)

    def gather(self, idx: torch.Tensor) -> Batch:
        if self.host_batches:
            return to_device(self.data.train.batch(idx), self.device)
        return super().gather(idx)


def clip_parts(coco: bool, device: torch.device, vocab: int) -> dict:
    """A random CLIP, a tokenizer mapping the captioner's vocabulary into CLIP's, and the
    pooled width the features need."""
    import open_clip

    import distinctcap.clip.weights  # noqa: F401  (registers shapes-vit-tiny)

    torch.manual_seed(0)
    clip = open_clip.create_model("ViT-B-32" if coco else "shapes-vit-tiny").to(device)
    g = torch.Generator().manual_seed(0)
    ids = sorted(torch.randperm(40000, generator=g)[: vocab - 4].add(1001).tolist())
    return {"clip": clip, "tokenizer": CaptionTokenizer([0, 49406, 49407, 1000, *ids]),
            "pooled": clip.text_projection.shape[1]}  # fmt: skip


def run_config(method: str, captioner: dict, compiled: bool) -> RunConfig:
    train = {"steps": 100_000, "warmup_steps": 10, "val_every": 0, "checkpoint_every": 0,
             "log_every": 1_000_000, "batch_size": 50, "compile": compiled}  # fmt: skip
    if method == "specificity":
        train |= {"batch_size": 2, "group_by_image": False, "lr": 1e-6, "schedule": "constant"}
    if method == "scst":  # config.coco.yaml's: ruotianluo's new-SCST schedule
        train |= {"lr": 5e-6, "schedule": "constant", "warmup_steps": 0, "weight_decay": 0.0}
    cfg = {"name": method, "method": method, "seed": 0, "captioner": captioner, "train": train}
    if method in EDGES:
        cfg[EDGES[method]] = "frozen"
    return RunConfig.from_effective(cfg)


def ms_per_step(trainer: Trainer, steps: int, sync) -> float:
    """Wall time on a GPU; on the CPU process time (robust on a shared box)."""
    clock = time.perf_counter if trainer.device.type == "cuda" else time.process_time
    sync()
    start = clock()
    for _ in range(steps):
        trainer.stats.add(trainer.train_step())
    trainer.stats.resolve()  # the one read of the steps' numbers, as at a log step
    sync()
    return (clock() - start) / steps * 1e3


def build(method: str, variant: str, args, device, data: RunData, parts: dict, sync):
    """A warmed-up trainer of one variant, and (build s, warm-up s): compiling happens in both."""
    start = time.perf_counter()
    run = run_config(method, args.captioner, variant == "compiled")
    trainer = BenchTrainer(run, device, data, parts, host_batches=variant == "before")
    built = time.perf_counter()
    ms_per_step(trainer, args.warmup, sync)  # compiles (when compiled), allocates
    return trainer, (built - start, time.perf_counter() - built)


def bench_method(method: str, args, device, data: RunData, parts: dict,
                 ms: dict[str, dict[str, float]], printed: set[str]) -> None:  # fmt: skip
    """ms/step of each variant into ms[method], each printed as soon as it is measured, with
    the ratios it completes (`printed`: the ratio keys printed so far)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ms[method] = {}
    for variant in args.variants:
        trainer, (built, warm) = build(method, variant, args, device, data, parts, sync)
        if variant == "compiled":
            print(f"compile {method}: {built + warm:.1f} s (build {built:.1f} s, "
                  f"{args.warmup} warm-up steps {warm:.1f} s)", flush=True)  # fmt: skip
        ms[method][variant] = statistics.median(
            ms_per_step(trainer, args.steps, sync) for _ in range(args.reps)
        )
        print(f"{method} {variant}: {ms[method][variant]:.1f} ms/step", flush=True)
        for key, value in ratios(ms).items():
            if key not in printed:
                printed.add(key)
                print(f"ratio {key} = {value:.2f}", flush=True)
        del trainer
        if device.type == "cuda":
            print(f"peak GPU memory so far: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} "
                  "GiB", flush=True)  # fmt: skip


def ratios(ms: dict[str, dict[str, float]]) -> dict[str, float]:
    out = {}
    for method, t in ms.items():
        for variant in ("data", "compiled"):
            if "before" in t and variant in t:
                out[f"{method} before/{variant}"] = t["before"] / t[variant]
    mle = ms.get("mle", {})
    for method in ms:
        for variant, value in ms[method].items():
            if method != "mle" and variant in mle:
                out[f"{method}/mle {variant}"] = value / mle[variant]
    return out


def goal_lines(values: dict[str, float]) -> list[str]:
    lines = []
    for name, key, relation, bound in GOALS:
        if key not in values:
            lines.append(f"goal {name}: not measured ({key})")
            continue
        ok = values[key] >= bound if relation == ">=" else values[key] <= bound
        lines.append(f"goal {name}: {'PASS' if ok else 'FAIL'} ({key} = {values[key]:.2f}, "
                     f"{relation} {bound})")  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coco", action="store_true", help="config.coco.yaml's captioner")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed window")
    ap.add_argument("--reps", type=int, default=3, help="timed windows per variant")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compiles)")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--backend", default=None, help="torch.compile backend (default inductor)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled variant")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backend:
        os.environ["DISTINCTCAP_COMPILE_BACKEND"] = args.backend
    device = resolve_device(args.device)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        ap.error(f"--methods: unknown {unknown}; choose from {list(METHODS)}")
    args.variants = [v for v in VARIANTS if not (args.no_compile and v == "compiled")]
    args.captioner = dict(COCO_CAPTIONER if args.coco else CAPTIONER)
    vocab = args.captioner["vocab_size"]
    parts = clip_parts(args.coco, device, vocab) if "specificity" in methods else {}
    sizes = {"grid": (49, 768), "pooled": 512, "vocab": vocab, "max_len": 22} if args.coco else {}
    if parts:
        sizes["pooled"] = parts["pooled"]
    data = shapes_like_data(args.images, **sizes)
    data.tokenizer = parts.get("tokenizer")
    if parts:
        from distinctcap.features.neighbours import NeighbourTable, top_neighbours

        f = data.train.features
        parts["neighbours"] = NeighbourTable(
            f.image_ids, top_neighbours(f.pooled, 2).numpy(), np.asarray(f.image_ids)
        )
    torch.manual_seed(1)
    feats = data.train.features
    dims = {"visual_dim": feats.grid.shape[-1], "pooled_dim": feats.pooled.shape[-1]}
    parts["frozen"] = Captioner(CaptionerConfig(**dims, **args.captioner))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"bench_steps: {'COCO' if args.coco else 'shapes'} captioner on {device} ({name}, "
          f"{torch.get_num_threads()} threads), {args.steps} steps x {args.reps} windows, "
          f"median ms/step", flush=True)  # fmt: skip
    ms: dict[str, dict[str, float]] = {}
    printed: set[str] = set()
    signal.signal(signal.SIGTERM, stopped)
    try:
        for method in methods:
            bench_method(method, args, device, data, parts, ms, printed)
    except Stopped:
        print("bench_steps: stopped by SIGTERM; what was measured:", flush=True)
    summary(ms)


class Stopped(Exception):
    """SIGTERM (timeout, a lease's end): print what was measured, then exit."""


def stopped(signum, frame) -> None:
    raise Stopped


def summary(ms: dict[str, dict[str, float]]) -> None:
    for method, variants in ms.items():
        for variant, value in variants.items():
            print(f"{method} {variant}: {value:.1f} ms/step")
    values = ratios(ms)
    for key, value in values.items():
        print(f"ratio {key} = {value:.2f}")
    for line in goal_lines(values):
        print(line, flush=True)


if __name__ == "__main__":
    main()
