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
from collections import defaultdict
from contextlib import contextmanager

import numpy as np

from distinctcap.metrics import (
    CocoTools,
    best_k,
    clipscore,
    consensus_rerank,
    div_n,
    mbleu,
    quality_scores,
    recall_at_k,
    retrieval_ranks,
    self_cider,
)
from distinctcap.metrics.multisample import oracle_from_table, sample_score_table

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


@contextmanager
def timed(times: dict[str, float], name: str, cpu: dict[str, float]):
    """Wall seconds, and CPU seconds of this Python process (Java's are counted at exit)."""
    start, start_cpu = time.perf_counter(), time.process_time()
    yield
    times[name] += time.perf_counter() - start
    cpu[name] += time.process_time() - start_cpu


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
    times: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    load = os.getloadavg()[0]

    with CocoTools() as tools:
        with timed(times, "java: PTB tokenizer (gts, samples, train)", cpu):
            gts_t, samples_t, train_t = tools.tokenize_groups(gts, samples, train)
        with timed(times, "java: METEOR start (paraphrase table)", cpu):
            tools.meteor([("a red circle", ["a red circle"])])
        first = {i: caps[:1] for i, caps in samples_t.items()}
        pairs_first = [(first[i][0], gts_t[i]) for i in gts_t]
        with timed(times, f"java: METEOR {m} pairs (quality)", cpu):
            tools.meteor(pairs_first)
        with timed(times, f"java: METEOR {m * n} pairs (oracle)", cpu):
            tools.meteor([(s, gts_t[i]) for i, caps in samples_t.items() for s in caps])
        with timed(times, "python: quality BLEU/ROUGE-L/CIDEr-D (METEOR cached)", cpu):
            quality_scores(gts_t, first, tokenized=True, tools=tools)
        with timed(times, f"python: oracle over {n} samples (METEOR cached)", cpu):
            table, skipped = sample_score_table(gts_t, samples_t, n, tokenized=True, tools=tools)
            oracle_from_table(table, skipped, n)
        with timed(times, "python: Div-1, Div-2", cpu):
            div_n(samples_t, 1), div_n(samples_t, 2)
        with timed(times, "python: mBLEU-4", cpu):
            mbleu(samples_t)
        with timed(times, "python: SelfCIDEr (train idf)", cpu):
            self_cider(samples_t, train_t.values())
        neighbours = {
            i: [c for j in rng.sample(train_ids, args.neighbours) for c in train_t[j]]
            for i in samples_t
        }
        with timed(times, f"python: consensus re-ranking ({args.neighbours} neighbours)", cpu):
            best = best_k(consensus_rerank(samples_t, neighbours, train_t.values()), 5)
        with timed(times, "python: diversity of best-5", cpu):
            div_n(best, 1), mbleu(best), self_cider(best, train_t.values())
        print(f"launches: {dict(tools.launches)}")

    gen = np.random.default_rng(0)
    images = gen.standard_normal((m * 6, 512)).astype(np.float32)  # test images + hard pool
    texts = images[np.repeat(np.arange(m), n)] + 2.0 * gen.standard_normal((m * n, 512))
    target = np.repeat(np.arange(m), n)
    with timed(times, f"retrieval: ranks of {m * n} captions in a {m * 6}-image pool", cpu):
        ranks = retrieval_ranks(texts, images, target)
        recall_at_k(ranks)
    with timed(times, f"retrieval: CLIPScore of {m * n} pairs", cpu):
        clipscore(texts, images[target])

    total = sum(times.values())
    java_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\n{m} images x {n} samples, 5 references each; {len(train)} training images")
    print(f"{os.cpu_count()} CPUs, load average {load:.1f} at start")
    print("   wall s  wall %   py CPU s  part")
    for name, sec in times.items():
        print(f"  {sec:7.2f}  {100 * sec / total:5.1f}   {cpu[name]:8.2f}  {name}")
    for group in ("java", "python", "retrieval"):
        sec = sum(v for k, v in times.items() if k.startswith(group))
        print(f"{group:>10}: {sec:7.2f} s wall  {100 * sec / total:5.1f} %")
    print(f"{'total':>10}: {total:7.2f} s wall")
    print(f"Java child processes: {java_cpu.ru_utime + java_cpu.ru_stime:.1f} CPU s in all")


if __name__ == "__main__":
    main()
