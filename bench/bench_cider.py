"""CIDEr-D's costs, the SCST reward's and the metric's, against a git revision's code (issue 56:
one CIDEr-D for both, the reward at most ~10 % slower than its own vectorised code was).

    PYTHONPATH=src python bench/bench_cider.py [--before 525445b] [--reps 20]

The reward: bench_scst.py's training captions (400 images x 5, random tokens of a 1,000-id
vocabulary, 8-16 long) give the document frequencies; a step scores K = 5 samples of 10 (a
CPU micro-batch) or 100 images that run to max_len 20 (a random model's worst case). The
metric: Zipf captions of a 3,000-word vocabulary; SelfCIDEr's kernels (10 captions of an
image), one caption an image against the image's 5 references (report.versus, CIDEr
selection: `score_each`, before it a loop of `score`), each with the document frequencies of
500 or 1,000 images, and the document frequencies of 5,000 images.

`--before REV` loads REV's methods/cider_reward.py and evaluate/metrics/cider.py (the two
implementations before issue 56: `git show`) beside distinctcap.scores.cider, times both
interleaved (the fastest repetition, process CPU time, one torch thread) and counts the
values that differ (the reward's in the last bits where torch's float64 sqrt and log are not
correctly rounded; the metric's never).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from distinctcap.data.tokenizer import EOS, PAD
from distinctcap.scores.cider import CiderD, TokenCiderD

ROOT = Path(__file__).resolve().parents[1]


def load_revision(rev: str, path: str, name: str):
    """The module at `path` of git revision `rev`, imported as `name`."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def fastest(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """The fastest of `reps` process-CPU times of each call, the calls interleaved."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            start = time.process_time()
            call()
            times[name].append(time.process_time() - start)
    return {name: min(t) for name, t in times.items()}


def reward_cases(before) -> dict[str, dict[str, Callable[[], np.ndarray]]]:
    g = torch.Generator().manual_seed(0)
    images, per, vocab = 400, 5, 1000
    refs = torch.full((images * per, 21), PAD)
    for i, k in enumerate(torch.randint(8, 17, (images * per,), generator=g).tolist()):
        refs[i, :k] = torch.randint(4, vocab, (k,), generator=g)
        refs[i, k] = EOS
    groups = torch.arange(images).repeat_interleave(per)
    now = TokenCiderD(refs.numpy(), groups.numpy(), vocab, (PAD, EOS))
    old = before.CiderDReward(refs, groups, vocab) if before else None
    cases = {}
    for scored in (10, 100):
        samples = torch.randint(4, vocab, (scored * 5, 20), generator=g)
        rows = torch.arange(scored).repeat_interleave(5) * 3
        case = {"now": lambda s=samples, r=rows: now.score(s.numpy(), r.numpy())}
        if old:
            case["before"] = lambda s=samples, r=rows: old.score(s, r).numpy()
        cases[f"reward, {scored} images x 5 samples"] = case
    return cases


def metric_cases(before) -> dict[str, dict[str, Callable[[], object]]]:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)]
    zipf = [1 / (i + 1) ** 1.1 for i in range(3000)]

    def caption() -> str:
        return " ".join(rng.choices(words, zipf, k=rng.randint(6, 16)))

    docs = [[caption() for _ in range(5)] for _ in range(5000)]
    samples = [[caption() for _ in range(10)] for _ in range(300)]

    def kernels(scorer) -> list[np.ndarray]:
        return [scorer.pair_matrix(s, s) for s in samples]

    def per_image(scorer) -> list[float]:
        cands = [samples[i % 300][0] for i in range(1000)]
        if hasattr(scorer, "score_each"):  # since issue 56: all pairs in one pass
            return list(scorer.score_each(cands, docs[:1000]))
        return [scorer.score(c, refs) for c, refs in zip(cands, docs, strict=False)]

    kinds = {"now": CiderD, **({"before": before.CiderD} if before else {})}
    return {  # a new scorer each call: no sentence's vector is cached from a repetition before
        "SelfCIDEr kernels, 300 images x 10": {
            k: lambda c=c: kernels(c(docs[:500])) for k, c in kinds.items()
        },
        "per-image scores, 1,000 images x 5 refs": {
            k: lambda c=c: per_image(c(docs[:1000])) for k, c in kinds.items()
        },
        "document frequencies, 5,000 images": {
            k: lambda c=c: counter(c(docs).df) for k, c in kinds.items()
        },
    }


def counter(df: object) -> object:
    """Document frequencies as a Counter of word tuples, whichever version made them."""
    return df.as_counter() if hasattr(df, "as_counter") else df


def differing(now: object, old: object) -> int:
    """How many values differ (a table of document frequencies counts as one)."""
    if isinstance(now, dict):
        return int(now != old)
    return int(np.sum(np.asarray(now) != np.asarray(old)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a git revision with methods/cider_reward.py, e.g. 525445b")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    reward = metric = None
    if args.before:
        reward = load_revision(args.before, "src/distinctcap/methods/cider_reward.py", "reward0")
        metric = load_revision(args.before, "src/distinctcap/evaluate/metrics/cider.py", "cider0")
    print(f"CIDEr-D, best of {args.reps} (reward) / 3 (metric), process CPU time")
    for cases, reps in ((reward_cases(reward), args.reps), (metric_cases(metric), 3)):
        for name, calls in cases.items():
            best = fastest(calls, reps)
            line = f"  {name:42s} now {best['now'] * 1e3:8.1f} ms"
            if "before" in best:
                now, old = calls["now"](), calls["before"]()
                ratio = best["now"] / best["before"]
                line += f"  before {best['before'] * 1e3:8.1f} ms  ratio {ratio:.2f}"
                line += f"  values differing {differing(now, old)}"
            print(line)


if __name__ == "__main__":
    main()
