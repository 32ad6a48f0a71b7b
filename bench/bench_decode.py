"""Decoding throughput (captions/s) of beam search and sampling, as ratios to a bare
teacher-forced forward of the same model and batch, measured in the same run.

    PYTHONPATH=src python bench/bench_decode.py [--device cuda] [--reps 5]

The model is untrained (random weights): captions rarely end before max_len, so every caption
takes all max_len steps. This is the worst case for decoding, and it makes runs comparable.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.captioner.search import beam_search, greedy, sample


def measure(
    fns: dict[str, Callable[[], int]], reps: int, sync: Callable[[], None]
) -> dict[str, list[float]]:
    """captions/s of each fn (which returns how many captions it made) per repetition; the fns
    take turns within a repetition, so a busy machine slows them alike and ratios hold."""
    for fn in fns.values():
        fn()  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            count = fn()
            sync()
            rates[name].append(count / (time.perf_counter() - start))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64, help="images per call")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    torch.manual_seed(0)
    cfg = CaptionerConfig(300, 64, 64, width=128, enc_layers=2, dec_layers=2, heads=4, ffn=512)
    model = Captioner(cfg).to(dev).eval()
    grid = torch.randn(args.batch, 64, 64, device=dev)
    pooled = torch.randn(args.batch, 64, device=dev)
    tokens = torch.randint(4, cfg.vocab_size, (args.batch, cfg.max_len), device=dev)
    gen = torch.Generator(dev).manual_seed(0)

    def forward() -> int:
        with torch.no_grad():
            model(grid, pooled, tokens)
        return args.batch

    rates = measure(
        {
            "teacher-forced forward": forward,
            "greedy": lambda: len(greedy(model, grid, pooled)),
            "beam k=3": lambda: len(beam_search(model, grid, pooled, k=3)),
            "sample n=20": lambda: 20 * len(sample(model, grid, pooled, n=20, generator=gen)),
        },
        args.reps,
        sync,
    )
    mean_len = statistics.mean(len(c.tokens) for c in greedy(model, grid, pooled))
    print(
        f"device {dev}, threads {torch.get_num_threads()}, batch {args.batch} images, "
        f"{model.num_params() / 1e6:.2f} M params, mean greedy length {mean_len:.1f} tokens"
    )
    base = rates["teacher-forced forward"]
    for name, r in rates.items():
        ratio = statistics.median(a / b for a, b in zip(r, base, strict=True))
        print(
            f"{name:>24}: {statistics.median(r):9.1f} captions/s (median of {len(r)})"
            f"   ratio to forward {ratio:.3f}"
        )


if __name__ == "__main__":
    main()
