"""Benchmark of distinctcap.features.entropy.retrieval_entropy (UNKT eq. 3); prints ratios.

1. Achieved FLOP/s of retrieval_entropy as a fraction of a plain dense matmul of the same
   shapes (text (Nt, D) @ images (Ni, D).T, full output) on the same device, in the same run;
   best of --reps each, interleaved. Goal >= 0.6 on CPU.
2. Peak memory of the entropy computation beyond its inputs at two N_images (fresh subprocess
   each; CPU: peak RSS via /proc/self/status VmHWM after resetting it; CUDA: max allocated).
   It must stay flat as N_images grows.

    python bench/bench_entropy.py [--n-text 4096 --n-images 32768 --dim 512 --device cpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from distinctcap.features.entropy import retrieval_entropy


def inputs(n_text: int, n_images: int, dim: int, device: str):
    g = torch.Generator().manual_seed(0)
    text = F.normalize(torch.randn(n_text, dim, generator=g), dim=1).to(device)
    images = F.normalize(torch.randn(n_images, dim, generator=g), dim=1).to(device)
    return text, images


def timed(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def throughput(args) -> dict:
    text, images = inputs(args.n_text, args.n_images, args.dim, args.device)
    half = torch.float16 if args.device == "cuda" else torch.float32
    t16, i16 = text.to(half), images.to(half)
    flops = 2.0 * args.n_text * args.n_images * args.dim
    dense, ent = [], []
    for _ in range(args.reps):
        dense.append(timed(lambda: t16 @ i16.T, args.device))
        ent.append(
            timed(
                lambda: retrieval_entropy(
                    text, images, 100.0, chunk=args.chunk, text_chunk=args.text_chunk
                ),
                args.device,
            )
        )
    dense_fs, ent_fs = flops / min(dense), flops / min(ent)
    return {
        "shapes": f"{args.n_text} x {args.n_images} x {args.dim}",
        "device": args.device,
        "threads": torch.get_num_threads(),
        "dense_GFLOP/s": round(dense_fs / 1e9, 1),
        "entropy_GFLOP/s": round(ent_fs / 1e9, 1),
        "ratio": round(ent_fs / dense_fs, 3),
    }


def peak_memory(args) -> dict:
    """Run in a fresh process: peak bytes allocated by the entropy call beyond its inputs."""
    text, images = inputs(args.n_text, args.n_images, args.dim, args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        retrieval_entropy(text, images, 100.0, chunk=args.chunk, text_chunk=args.text_chunk)
        return {"peak_MiB": (torch.cuda.max_memory_allocated() - base) / 2**20}
    lock_memory()  # no page-out of the inputs mid-measurement (proactive reclaim)
    base = rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    retrieval_entropy(text, images, 100.0, chunk=args.chunk, text_chunk=args.text_chunk)
    return {"peak_MiB": (rss_kib("VmHWM") - base) / 1024}


def lock_memory() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mlockall(3) != 0:  # MCL_CURRENT | MCL_FUTURE
        print("warning: mlockall failed; RSS may be noisy", file=sys.stderr)


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-text", type=int, default=4096)
    p.add_argument("--n-images", type=int, default=32768)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--chunk", type=int, default=8192)
    p.add_argument("--text-chunk", type=int, default=1024)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_only:
        print(json.dumps(peak_memory(args)))
        return
    print(json.dumps(throughput(args)))
    for n_images in (args.n_images, 4 * args.n_images):
        cmd = [
            sys.executable,
            __file__,
            "--memory-only",
            "--n-text",
            str(args.n_text),
            "--n-images",
            str(n_images),
            "--dim",
            str(args.dim),
            "--chunk",
            str(args.chunk),
            "--text-chunk",
            str(args.text_chunk),
            "--device",
            args.device,
        ]
        out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        inputs_mib = (args.n_text + n_images) * args.dim * 4 / 2**20
        print(
            json.dumps(
                {
                    "n_images": n_images,
                    "inputs_MiB": round(inputs_mib, 1),
                    "entropy_peak_beyond_inputs_MiB": round(out["peak_MiB"], 1),
                }
            )
        )


if __name__ == "__main__":
    main()
