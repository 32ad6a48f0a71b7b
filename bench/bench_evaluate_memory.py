"""Peak memory of an evaluate job's text metrics against the number of training images.

    PYTHONPATH=src python bench/bench_evaluate_memory.py [--train 5000 35000 118287]

The evaluate stage's work is per test image, but its text metrics read the training captions:
CIDEr-D's document frequencies (SelfCIDEr's idf, the consensus re-ranking's scorer), novelty,
and the consensus neighbours' captions among the training images nearest by pooled CLIP
features, found as the job finds them: the training features a block at a time
(evaluate.nearest). This bench holds COCO's 1,000 test images (greedy, and 5 samples an
image) and grows only the training set, as the rehearsal's sizes do (10,000 / 40,000 /
123,287 images keep 4,000 val and 1,000 test images: 5,000 / 35,000 / 118,287 training
images). Captions are bench/coco_evaluate.py's COCO-like ones (Zipf words over 10,000, shared
phrases per image), the pooled features random unit vectors of width 512.

Each size runs in a fresh process: it builds its inputs, then finds the consensus neighbours
and runs the stage's `text_metrics` for both decodings in one COCO tools session, as a job
does, while a thread samples the RSS of the process and its children (the Java tools) every
0.1 s. It prints per size the RSS once the inputs are built, the peak during the metrics
(own + children), the growth the metrics add, and each size's peak against the smallest's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coco_evaluate import VOCAB, _caption, _phrases  # noqa: E402

N_TEST = 1000
DECODINGS = {"greedy": 1, "sample5": 5}
POOLED_WIDTH = 512


def tree_rss_mb(process: psutil.Process) -> float:
    """RSS of a process and all its children, MB."""
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


class PeakSampler:
    """The highest tree RSS seen by a background thread since `reset`."""

    def __init__(self, every: float = 0.1):
        self.process, self.every, self.peak = psutil.Process(), every, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mb(self.process))
            time.sleep(self.every)

    def reset(self) -> float:
        self.peak = tree_rss_mb(self.process)
        return self.peak

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, tree_rss_mb(self.process))


def unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random unit vectors of POOLED_WIDTH, float32 (stand-ins for pooled CLIP features)."""
    rows = rng.standard_normal((n, POOLED_WIDTH)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def training_blocks(n_train: int, seed: int = 1):
    """The training images' pooled features, a store block at a time, as the job reads them."""
    from distinctcap.evaluate.nearest import POOL_BLOCK

    rng = np.random.default_rng(seed)
    for s in range(0, n_train, POOL_BLOCK):
        yield unit_rows(rng, min(POOL_BLOCK, n_train - s))


def inputs(n_train: int, seed: int = 0) -> dict:
    """gts and samples of N_TEST images, the training references of n_train, pooled vectors
    of the test images."""
    rng = np.random.default_rng(seed)
    names = [f"w{i}" for i in range(VOCAB)]
    names[:6] = ["a", "on", "of", "the", "in", "with"]

    def image_captions(ids: range, per_image: int) -> dict[int, list[str]]:
        return {i: [_caption(rng, _phrases(i), names) for _ in range(per_image)] for i in ids}

    test = range(N_TEST)
    return {
        "gts": image_captions(test, 5),
        "samples": {name: image_captions(test, n) for name, n in DECODINGS.items()},
        "train_refs": image_captions(range(10_000_000, 10_000_000 + n_train), 5),
        "pooled": unit_rows(rng, N_TEST),
    }


def child(n_train: int) -> dict:
    """One size, in this process: the RSS with the inputs built and the peak of the metrics."""
    from distinctcap.core.settings import EvalSettings
    from distinctcap.evaluate.metrics import CocoTools
    from distinctcap.evaluate.nearest import nearest_in_blocks
    from distinctcap.evaluate.stage import neighbour_captions, text_metrics

    sampler = PeakSampler()
    data = inputs(n_train)
    base = sampler.reset()
    wall = time.perf_counter()
    settings = EvalSettings(seed=0, device="cpu", spice=False)
    train = data["train_refs"]
    near = nearest_in_blocks(data["pooled"], training_blocks(n_train),
                             settings.consensus_neighbours)  # fmt: skip
    neighbours = neighbour_captions(list(data["gts"]), near, list(train), train)
    with CocoTools(spice=False, meteor_memory=settings.meteor_memory) as tools:
        for name, n in DECODINGS.items():
            text_metrics(data["gts"], data["samples"][name], n, train, neighbours, settings,
                         tools)  # fmt: skip
    peak = sampler.stop()
    return {"train": n_train, "inputs_mb": base, "peak_mb": peak,
            "wall_s": time.perf_counter() - wall}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, nargs="+", default=[5000, 35000, 118_287])
    args = parser.parse_args()
    rows = []
    for n in args.train:
        out = subprocess.run([sys.executable, __file__, "--child", str(n)], check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(f"{n:>8,} training images: inputs {rows[-1]['inputs_mb']:,.0f} MB, peak "
              f"{rows[-1]['peak_mb']:,.0f} MB, {rows[-1]['wall_s']:.0f} s", flush=True)  # fmt: skip
    first = rows[0]
    print("| training images | RSS with inputs MB | peak MB | metrics add MB | peak / smallest |")
    print("|---|---|---|---|---|")
    for r in rows:
        added, ratio = r["peak_mb"] - r["inputs_mb"], r["peak_mb"] / first["peak_mb"]
        print(f"| {r['train']:,} | {r['inputs_mb']:,.0f} | {r['peak_mb']:,.0f} | "
              f"{added:,.0f} | {ratio:.2f} |")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(int(sys.argv[2]))))
    else:
        main()
