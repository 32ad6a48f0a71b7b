"""The default config's training step rates against a bare loop, as ratios, in one process.

    PYTHONPATH=src python bench/bench_step_rate.py [--steps 10] [--reps 3] [--threads 1]
        [--methods mle,unkt,cl,smile,specificity] [--device cpu]

Each method runs the real trainer step (`Trainer.train_step`, through bench_steps.BenchTrainer:
its frozen teacher / reference a random captioner, specificity's CLIP a random shapes-vit-tiny)
with the run's effective config from config.yaml (reference for MLE, unkt, cl, smile,
specificity: their options, batch size and precision) on bench_trainer's shapes-sized
synthetic data, uncompiled. The bare loop is the same captioner's forward, token
cross-entropy, backward and AdamW step on the same batches, precomputed on the device, with
no distinctcap trainer around it. Windows alternate bare / methods so a busy machine slows all
alike; per method the median ms/step (process time on the CPU, wall time on a GPU) and
`rate <method> = bare ms / method ms` (1.0: as fast as the bare loop). Issue 46: a number to
compare across commits on one box, not a test; the work budget (distinctcap.runs.budget)
catches added work without a clock.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from bench_steps import METHODS, BenchTrainer, clip_parts, ms_per_step
from bench_trainer import CAPTIONER, shapes_like_data

from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.config.check import load_schema, validate
from distinctcap.config.rungraph import effective_run_config
from distinctcap.core.configfile import read_configs
from distinctcap.core.devices import resolve_device
from distinctcap.core.run import RunConfig
from distinctcap.features.batches import encode_batch
from distinctcap.methods.losses import mle_loss
from distinctcap.train.schedule import make_optimizer

ROOT = Path(__file__).resolve().parents[1]
RUN_OF = {"mle": "reference", "unkt": "unkt", "cl": "cl", "smile": "smile",
          "specificity": "specificity"}  # fmt: skip
# no validation, checkpoint or curve row inside the timed steps, and no compile
BENCH_TRAIN = {"steps": 100_000, "val_every": 0, "checkpoint_every": 0, "checkpoint_minutes": 0,
               "log_every": 1_000_000, "compile": False}  # fmt: skip


def default_run(method: str, vocab: int) -> RunConfig:
    """The default config's run of `method`, its edges the bench's in-memory frozen model."""
    schema = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")
    config = validate(read_configs([ROOT / "config.yaml"]), schema)
    run = effective_run_config(config, RUN_OF[method], schema)
    run.pop("init", None)  # the bench starts from random weights
    for edge in ("teacher", "reference"):
        if edge in run:
            run[edge] = "frozen"
    run["train"] = {**run["train"], **BENCH_TRAIN}
    run["captioner"] = {**run["captioner"], "vocab_size": vocab}
    return RunConfig.from_effective(run)


def bare_ms(model: Captioner, batches: list, steps: int, device: torch.device, tc) -> float:
    """ms/step of the bare loop over the first `steps` of `batches` (clock as ms_per_step),
    with the trainer's AdamW of train config `tc`."""
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    opt = make_optimizer(model, tc, device)
    model.train()
    sync()
    start = clock()
    for b in batches[:steps]:
        loss = mle_loss(model.decode(encode_batch(model, b), b.inputs), b.labels, 0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return (clock() - start) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="steps per timed window")
    ap.add_argument("--reps", type=int, default=3, help="timed windows (alternating)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    methods = [m for m in args.methods.split(",") if m]
    if set(methods) - set(METHODS):
        ap.error(f"--methods: choose from {list(METHODS)}")
    vocab = CAPTIONER["vocab_size"]
    parts = clip_parts(False, device, vocab) if "specificity" in methods else {}
    data = shapes_like_data(args.images, **({"pooled": parts["pooled"]} if parts else {}))
    data.tokenizer = parts.get("tokenizer")
    feats = data.train.features
    if parts:
        from distinctcap.features.neighbours import NeighbourTable, top_neighbours

        parts["neighbours"] = NeighbourTable(
            feats.image_ids, top_neighbours(feats.pooled, 2).numpy(), np.asarray(feats.image_ids)
        )
    runs = {m: default_run(m, vocab) for m in methods}
    dims = {"visual_dim": feats.grid.shape[-1], "pooled_dim": feats.pooled.shape[-1]}
    torch.manual_seed(1)
    parts["frozen"] = Captioner(CaptionerConfig(**dims, **runs[methods[0]].captioner))
    trainers = {m: BenchTrainer(runs[m], device, data, parts, host_batches=False)
                for m in methods}  # fmt: skip
    reference = runs.get("mle", runs[methods[0]])
    torch.manual_seed(0)
    bare = Captioner(CaptionerConfig(**dims, **reference.captioner)).to(device)
    order = trainers[methods[0]].order
    windows = args.warmup + args.steps * args.reps
    batches = [data.train.batch(order.indices(j)).to(device) for j in range(windows)]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    bare_ms(bare, batches, args.warmup, device, reference.train)
    for trainer in trainers.values():
        ms_per_step(trainer, args.warmup, sync)
    print(f"bench_step_rate: default config on {device} ({torch.get_num_threads()} threads), "
          f"{args.steps} steps x {args.reps} windows, batch {reference.train.batch_size}, "
          f"median ms/step", flush=True)  # fmt: skip
    ms: dict[str, list[float]] = {"bare": [], **{m: [] for m in methods}}
    for _ in range(args.reps):
        ms["bare"].append(bare_ms(bare, batches, args.steps, device, reference.train))
        for m, trainer in trainers.items():
            ms[m].append(ms_per_step(trainer, args.steps, sync))
    median = {k: statistics.median(v) for k, v in ms.items()}
    for key, value in median.items():
        print(f"{key}: {value:.1f} ms/step")
    for m in methods:
        print(f"rate {m} = {median['bare'] / median[m]:.2f} of the bare loop's")


if __name__ == "__main__":
    main()
