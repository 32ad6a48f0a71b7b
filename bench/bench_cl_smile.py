"""Cost of a CL and a SMILE training step as ratios to an MLE step of the same model and batch.

    PYTHONPATH=src python bench/bench_cl_smile.py [--device cuda] [--reps 7] [--negatives 5]

A "step" is the objective's forward plus backward on one micro-batch of B captions (the
optimiser update is the same for every method and left out). Budgets (issue 6): a CL step with
K negatives at most (1 + K) x 1.2 MLE steps, a SMILE step at most 1.1 MLE steps. Methods are
timed interleaved (MLE, CL, SMILE, MLE, ...) so load drift on a shared machine hits all alike,
and the fastest repetition of each is reported (as timeit advises: slower ones measure
interference, not the code). On CPU the clock is the process's CPU time with one torch thread
(default `--threads 1`), which a busy shared machine disturbs little; on GPU it is wall time
between synchronisations. Random weights and random captions (lengths 8-16 tokens):
the costs do not depend on what the model has learnt.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import numpy as np
import torch

from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.core.run import RunConfig
from distinctcap.features.batches import CaptionData
from distinctcap.features.read import ImageFeatures
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext


def make_data(images: int, per_image: int, grid: int, dv: int, dp: int, vocab: int, max_len: int):
    g = torch.Generator().manual_seed(0)
    feats = ImageFeatures(
        np.arange(images),
        torch.nn.functional.normalize(torch.randn(images, dp, generator=g), dim=-1),
        torch.randn(images, grid, dv, generator=g).half(),
    )
    n = images * per_image
    lengths = torch.randint(8, 17, (n,), generator=g).tolist()
    tokens = [torch.randint(4, vocab, (k,), generator=g).tolist() for k in lengths]
    image_ids = np.repeat(np.arange(images), per_image)
    return CaptionData(feats, np.arange(n), image_ids, tokens, max_len)


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The options every captioner step benchmark here shares (bench_scst.py too)."""
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--grid", type=int, default=64, help="CLIP grid tokens per image")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = default)")


def setup(args) -> tuple[torch.device, Callable[[], None], Callable[[], float]]:
    """(device, sync, clock): wall time on a GPU, process time on the CPU; threads set, seed 0."""
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    clock = time.perf_counter if dev.type == "cuda" else time.process_time
    torch.manual_seed(0)
    return dev, sync, clock


def model_and_data(args, dev: torch.device) -> tuple[Captioner, CaptionData]:
    """A random captioner of the asked size in train mode, and 400 images x 5 captions."""
    cfg = CaptionerConfig(
        args.vocab, 128, 128, width=args.width, enc_layers=args.layers,
        dec_layers=args.layers, heads=4, ffn=4 * args.width, max_len=20,
    )  # fmt: skip
    model = Captioner(cfg).to(dev).train()
    return model, make_data(400, 5, args.grid, 128, 128, args.vocab, cfg.max_len)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=32, help="captions per micro-batch")
    ap.add_argument("--negatives", type=int, default=5, help="CL's K")
    add_model_args(ap)
    args = ap.parse_args()
    dev, sync, clock = setup(args)
    model, data = model_and_data(args, dev)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    ctx = TrainContext(dev, data, {"reference": reference})
    batch = data.batch(torch.arange(args.batch)).to(dev)
    k = args.negatives

    def objective(method: str, **options):
        return METHODS[method](RunConfig(name=method, options=options), ctx)

    variants: dict[str, tuple[object, float | None]] = {
        "mle": (objective("mle"), None),
        f"cl K={k}": (objective("cl", negatives=k), (1 + k) * 1.2),
        "cl(P)": (objective("cl", negatives=k, constraints="positive"), None),
        f"cl(N) K={k}": (objective("cl", negatives=k, constraints="negative"), None),
        "smile": (objective("smile"), 1.1),
        "smile mle_weight=0.01": (objective("smile", mle_weight=0.01), 1.1),
        "smile random": (objective("smile", subset="random"), None),
        "smile reverse": (objective("smile", subset="reverse"), None),
    }

    def step_fn(obj) -> Callable[[int], None]:
        def run(step: int) -> None:
            loss, _ = obj.loss(model, batch, step, 1000)
            loss.backward()
            model.zero_grad(set_to_none=True)

        return run

    fns = {name: step_fn(obj) for name, (obj, _) in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rep in range(args.reps + 1):  # rep 0 warms up
        for name, fn in fns.items():
            sync()
            start = clock()
            fn(rep)
            sync()
            if rep:
                times[name].append(clock() - start)

    med = {name: min(t) for name, t in times.items()}
    print(
        f"device {dev}, threads {torch.get_num_threads()}, batch {args.batch} captions, "
        f"{model.num_params() / 1e6:.2f} M params (width {args.width}, {args.layers}+"
        f"{args.layers} layers, vocab {args.vocab}, grid {args.grid}), best of {args.reps}, "
        f"{'CPU' if dev.type == 'cpu' else 'wall'} time"
    )
    base = med["mle"]
    for name, (_, budget) in variants.items():
        ratio = med[name] / base
        verdict = (
            ""
            if budget is None
            else f"  budget {budget:.2f}: " + ("ok" if ratio <= budget else "OVER")
        )
        print(
            f"{name:>22}: {med[name] * 1e3:8.1f} ms/step  ratio to MLE step {ratio:6.3f}{verdict}"
        )


if __name__ == "__main__":
    main()
