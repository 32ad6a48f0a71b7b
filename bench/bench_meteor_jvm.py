"""METEOR's JVM options, side by side in one run: the server's start (its paraphrase table)
and the scoring of n distinct pairs, wall and CPU seconds, and the same scores.

    PYTHONPATH=src python bench/bench_meteor_jvm.py [--pairs 300 8000 30000]

Pairs come from bench_metrics' shapes grammar (5 references each). Compares the options the
evaluation uses (`METEOR_JVM_OPTIONS`) with the client compiler only (what the tokenizer
uses) and prints new/old ratios.
"""

from __future__ import annotations

import argparse
import os
import random
import time

from bench_metrics import caption

from distinctcap.evaluate.metrics.java import java_executable
from distinctcap.evaluate.metrics.meteor import METEOR_JVM_OPTIONS, MeteorServer

CANDIDATES = {
    "client compiler only": ("-XX:TieredStopAtLevel=1", *METEOR_JVM_OPTIONS),
    "default (METEOR_JVM_OPTIONS)": METEOR_JVM_OPTIONS,
}


def jvm_cpu(server: MeteorServer) -> float:
    """CPU seconds of the running server (Linux /proc)."""
    fields = open(f"/proc/{server.proc.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_gib(server: MeteorServer) -> float:
    status = open(f"/proc/{server.proc.pid}/status").read().split("\n")
    (line,) = [line for line in status if line.startswith("VmHWM:")]
    return int(line.split()[1]) / 2**20


def measure(options: tuple[str, ...], pairs: list) -> dict[str, float]:
    """Start wall/CPU (up to the first pair's score), then all pairs' wall/CPU and scores."""
    server = MeteorServer(java_executable(), "2G", options)
    try:
        start = time.perf_counter()
        server.score(pairs[:1])
        row = {"start_wall": time.perf_counter() - start, "start_cpu": jvm_cpu(server)}
        start = time.perf_counter()
        corpus, per_pair = server.score(pairs)
        row |= {"pairs_wall": time.perf_counter() - start,
                "pairs_cpu": jvm_cpu(server) - row["start_cpu"],
                "corpus": corpus, "segment_sum": sum(per_pair),
                "peak_rss_gib": peak_rss_gib(server)}  # fmt: skip
        return row
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[300, 8000])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for n in args.pairs:
        pairs = [(caption(rng), [caption(rng) for _ in range(5)]) for _ in range(n)]
        rows = {name: measure(opts, pairs) for name, opts in CANDIDATES.items()}
        old, new = rows.values()
        for name, r in rows.items():
            print(f"{n:6d} pairs  {name:30s} start {r['start_wall']:5.1f} s wall "
                  f"{r['start_cpu']:5.1f} CPU s | pairs {r['pairs_wall']:6.1f} s wall "
                  f"{r['pairs_cpu']:6.1f} CPU s | peak {r['peak_rss_gib']:.2f} GiB")  # fmt: skip
        ratio = {
            s: (new[f"start_{s}"] + new[f"pairs_{s}"]) / (old[f"start_{s}"] + old[f"pairs_{s}"])
            for s in ("wall", "cpu")
        }
        same = (old["corpus"], old["segment_sum"]) == (new["corpus"], new["segment_sum"])
        print(f"{n:6d} pairs  new/old, start + pairs: wall {ratio['wall']:.2f}, "
              f"CPU {ratio['cpu']:.2f}; same scores: {same}")


if __name__ == "__main__":
    main()
