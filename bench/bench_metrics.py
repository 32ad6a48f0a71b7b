"""Time one full evaluation's parts on generated caption sets of the shapes-default size.

    PYTHONPATH=src python bench/bench_metrics.py [--images 200] [--samples 20]

Captions come from a small shapes-world grammar (5 references and n samples per image);
embeddings are random unit vectors (CLIP width 512, a hard pool of 5x extra images). Prints
seconds per part and the split between the Java tools (PTB tokenizer, METEOR), the Python
n-gram metrics (BLEU, ROUGE-L, CIDEr-D, diversity, consensus) and retrieval.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import time
from contextlib import contextmanager

import numpy as np

from distinctcap.evaluate.metrics import (
    CocoTools,
    best_k,
    clipscore,
    consensus_rerank,
    div_n,
    mbleu,
    quality_scores,
    recall_at_k,
    self_cider,
)
from distinctcap.evaluate.metrics.multisample import oracle_from_table, sample_score_table
from distinctcap.scores.ranks import retrieval_ranks

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"]
SHAPES = ["circle", "square", "triangle", "star", "cross", "hexagon"]
SIZES = ["small", "large", "tiny", "big"]
RELATIONS = ["left of", "right of", "above", "below", "next to"]
GENERIC = ["a picture of some shapes", "some shapes on a background", "an image with shapes"]


def caption(rng: random.Random) -> str:
    """A caption at mixed specificity, from generic to two described shapes and a relation."""
    if rng.random() < 0.2:
        return rng.choice(GENERIC)

    def thing() -> str:
        words = [rng.choice(SIZES)] if rng.random() < 0.6 else []
        words += [rng.choice(COLOURS)] if rng.random() < 0.8 else []
        return " ".join(["a", *words, rng.choice(SHAPES)])

    if rng.random() < 0.4:
        return f"{thing()} on a {rng.choice(COLOURS)} background"
    return f"{thing()} {rng.choice(RELATIONS)} {thing()}"


def child_cpu(tools: CocoTools | None = None) -> float:
    """CPU seconds of finished child processes plus the running METEOR server (Linux /proc)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = usage.ru_utime + usage.ru_stime
    meteor = getattr(tools, "_meteor", None)
    if meteor is not None:
        fields = open(f"/proc/{meteor.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@contextmanager
def timed(times: dict[str, list[float]], name: str, tools: CocoTools | None = None):
    """Wall seconds, CPU seconds of this process, CPU seconds of the Java tools."""
    start, py, java = time.perf_counter(), time.process_time(), child_cpu(tools)
    yield
    times[name] = [
        time.perf_counter() - start,
        time.process_time() - py,
        child_cpu(tools) - java,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--neighbours", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    m, n = args.images, args.samples
    gts = {i: [caption(rng) for _ in range(5)] for i in range(m)}
    samples = {i: [caption(rng) for _ in range(n)] for i in range(m)}
    train = {10_000 + j: [caption(rng) for _ in range(5)] for j in range(5 * m)}
    train_ids = list(train)
    times: dict[str, list[float]] = {}
    load = os.getloadavg()[0]

    with CocoTools() as tools:
        with timed(times, "java: PTB tokenizer (gts, samples, train)", tools):
            gts_t, samples_t, train_t = tools.tokenize_groups(gts, samples, train)
        with timed(times, "java: METEOR start (paraphrase table)", tools):
            tools.meteor([("a red circle", ["a red circle"])])
        first = {i: caps[:1] for i, caps in samples_t.items()}
        pairs_first = [(first[i][0], gts_t[i]) for i in gts_t]
        with timed(times, f"java: METEOR {m} pairs (quality)", tools):
            tools.meteor(pairs_first)
        with timed(times, f"java: METEOR {m * n} pairs (oracle)", tools):
            tools.meteor([(s, gts_t[i]) for i, caps in samples_t.items() for s in caps])
        with timed(times, "python: quality BLEU/ROUGE-L/CIDEr-D (METEOR cached)", tools):
            quality_scores(gts_t, first, tokenized=True, tools=tools)
        with timed(times, f"python: oracle over {n} samples (METEOR cached)", tools):
            table, skipped = sample_score_table(gts_t, samples_t, n, tokenized=True, tools=tools)
            oracle_from_table(table, skipped, n)
        with timed(times, "python: Div-1, Div-2", tools):
            div_n(samples_t, 1), div_n(samples_t, 2)
        with timed(times, "python: mBLEU-4", tools):
            mbleu(samples_t)
        with timed(times, "python: SelfCIDEr (train idf)", tools):
            self_cider(samples_t, train_t.values())
        neighbours = {
            i: [c for j in rng.sample(train_ids, args.neighbours) for c in train_t[j]]
            for i in samples_t
        }
        with timed(times, f"python: consensus re-ranking ({args.neighbours} neighbours)", tools):
            best = best_k(consensus_rerank(samples_t, neighbours, train_t.values()), 5)
        with timed(times, "python: diversity of best-5", tools):
            div_n(best, 1), mbleu(best), self_cider(best, train_t.values())
        print(f"launches: {dict(tools.launches)}")

    gen = np.random.default_rng(0)
    images = gen.standard_normal((m * 6, 512)).astype(np.float32)  # test images + hard pool
    texts = images[np.repeat(np.arange(m), n)] + 2.0 * gen.standard_normal((m * n, 512))
    target = np.repeat(np.arange(m), n)
    with timed(times, f"retrieval: ranks of {m * n} captions in a {m * 6}-image pool", tools):
        ranks = retrieval_ranks(texts, images, target)
        recall_at_k(ranks)
    with timed(times, f"retrieval: CLIPScore of {m * n} pairs", tools):
        clipscore(texts, images[target])

    print(f"\n{m} images x {n} samples, 5 references each; {len(train)} training images")
    print(f"{os.cpu_count()} CPUs, load average {load:.1f} at start")
    print("   wall s   py CPU s  Java CPU s  part")
    for name, (wall, py, java) in times.items():
        print(f"  {wall:7.2f}  {py:9.2f}  {java:10.2f}  {name}")
    total = sum(py + java for _, py, java in times.values())
    print("CPU seconds by group (Python + Java), share of all:")
    for group in ("java", "python", "retrieval"):
        sec = sum(py + java for k, (_, py, java) in times.items() if k.startswith(group))
        print(f"{group:>10}: {sec:7.2f} s  {100 * sec / total:5.1f} %")
    print(f"{'total':>10}: {total:7.2f} s CPU, {sum(t[0] for t in times.values()):.2f} s wall")


if __name__ == "__main__":
    main()
