"""The COCO-size text-metrics benchmark behind `bench/bench_evaluate.py --coco`.

`make_data` writes synthetic COCO-like inputs of one run's evaluation: 1,000 test images x 5
references, greedy, greedy_norepeat and beam3 (one caption an image) and sample100 (100 an
image), 118,287 training images x 5 references for the document frequencies and novelty, and
random unit CLIP vectors for the consensus neighbours; all times `scale`. Words follow a
Zipf law over a 10,000-word vocabulary (COCO's training captions use ~10k words); 60 % of a
caption's pieces are one of its image's 8 phrases of 2-4 words (so captions of one image
share n-grams as COCO's do: BLEU-4 of the first caption ~0.3, CIDEr-D ~1.2), lengths are
COCO's (mean ~10.5 words, sd ~2.4), with a capital and a full stop for the PTB tokenizer.

`python bench/coco_evaluate.py child DATA WORKERS OUT` runs the stage's `text_metrics` for
the four decodings with one COCO tools session, as an evaluate job does, with whatever
`distinctcap` PYTHONPATH finds (today's serial code or the new one), and writes every
metric value and per-metric wall and CPU seconds (own + finished children: Java and forked
workers) to OUT as JSON. Only names both versions have are used.
"""

from __future__ import annotations

import functools
import inspect
import json
import pickle
import resource
import sys
import time
from pathlib import Path

import numpy as np

DECODINGS = {"greedy": 1, "greedy_norepeat": 1, "beam3": 1, "sample100": 100}
VOCAB = 10_000
TOPIC_WORDS = 30


_ZIPF = np.cumsum(np.arange(1, VOCAB + 1, dtype=float) ** -1.1)
_ZIPF /= _ZIPF[-1]


def _words(rng: np.random.Generator, n: int) -> np.ndarray:
    """n word ids from a Zipf(1.1) law over the vocabulary (rank 0 = 'a')."""
    return np.minimum(np.searchsorted(_ZIPF, rng.random(n)), VOCAB - 1)


def _caption(rng: np.random.Generator, phrases: list[list[int]], names: list[str]) -> str:
    """COCO-like length; 60 % of the pieces are one of the image's phrases, the rest single
    Zipf words."""
    length = int(np.clip(round(rng.normal(10.5, 2.4)), 6, 24))
    ids: list[int] = []
    while len(ids) < length:
        if rng.random() < 0.6:
            ids += phrases[int(rng.integers(len(phrases)))]
        else:
            ids.append(int(_words(rng, 1)[0]))
    words = [names[i] for i in ids[:length]]
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


def _phrases(seed: int) -> list[list[int]]:
    """An image's 8 phrases of 2-4 words: its own content words among common ones."""
    rng = np.random.default_rng(seed)
    topic = rng.choice(VOCAB, TOPIC_WORDS)
    out = []
    for _ in range(8):
        words = _words(rng, int(rng.integers(2, 5)))
        own = rng.random(len(words)) < 0.5
        words[own] = rng.choice(topic, size=int(own.sum()))
        out.append([int(w) for w in words])
    return out


def make_data(path: Path, scale: float, seed: int = 0) -> None:
    """Write the benchmark's inputs (a pickle) to `path`."""
    rng = np.random.default_rng(seed)
    names = [f"w{i}" for i in range(VOCAB)]
    names[:6] = ["a", "on", "of", "the", "in", "with"]
    n_test, n_train = max(2, round(1000 * scale)), max(2, round(118_287 * scale))

    def image_captions(n_images: int, per_image: int, offset: int) -> dict[int, list[str]]:
        out = {}
        for i in range(n_images):
            phrases = _phrases(offset + i)
            out[offset + i] = [_caption(rng, phrases, names) for _ in range(per_image)]
        return out

    gts = image_captions(n_test, 5, 0)
    train = image_captions(n_train, 5, 10_000_000)
    samples = {name: image_captions(n_test, n, 0) for name, n in DECODINGS.items()}
    dim = 64
    pooled = rng.standard_normal((n_test + n_train, dim)).astype(np.float32)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    data = {
        "gts": gts,
        "train_refs": train,
        "samples": samples,
        "pooled": pooled[:n_test],
        "train_pooled": pooled[n_test:],
    }
    path.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))


# ---------------------------------------------------------------- the child process


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# (module, attribute, row): the parts timed in both versions; CIDEr-D's document
# frequencies are timed inside the metrics that build them (a nested row). A module named
# "a|b" is a since issue 56 moved it there, b before.
PARTS = (
    ("distinctcap.evaluate.metrics.coco", "CocoTools.tokenize_groups", "PTB tokenizer"),
    ("distinctcap.evaluate.metrics.text", "quality_scores", "quality (BLEU, METEOR, ...)"),
    ("distinctcap.evaluate.metrics.text", "novelty", "novelty"),
    ("distinctcap.evaluate.metrics.text", "mbleu", "mBLEU-4"),
    ("distinctcap.evaluate.metrics.text", "self_cider", "SelfCIDEr"),
    ("distinctcap.evaluate.metrics.text", "consensus_rerank", "consensus re-ranking"),
    ("distinctcap.evaluate.metrics.text", "sample_score_table", "oracle per-sample scores"),
    ("distinctcap.scores.cider|distinctcap.evaluate.metrics.cider", "CiderD.__init__",
     "  of which CIDEr-D df"),
)  # fmt: skip


def _first_module(names: list[str]):
    """The first of the named modules that this version has."""
    for name in names[:-1]:
        try:
            return __import__(name, fromlist=["_"])
        except ModuleNotFoundError:
            continue
    return __import__(names[-1], fromlist=["_"])


def _instrument(timings: dict[str, list[float]]) -> None:
    """Wrap each part so its wall and CPU seconds add up into `timings`."""
    for module_name, attr, row in PARTS:
        module = _first_module(module_name.split("|"))
        owner, name = module, attr
        if "." in attr:
            cls, name = attr.split(".")
            owner = getattr(module, cls)
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, _f=original, _row=row, **kwargs):
            wall, cpu = time.perf_counter(), _cpu()
            try:
                return _f(*args, **kwargs)
            finally:
                spent = timings.setdefault(_row, [0.0, 0.0])
                spent[0] += time.perf_counter() - wall
                spent[1] += _cpu() - cpu

        setattr(owner, name, wrapper)


def consensus_neighbours(data: dict, k: int) -> dict[int, list[str]]:
    """Each test image's consensus references (evaluate.stage.consensus_captions's captions)."""
    from distinctcap.evaluate.nearest import nearest
    from distinctcap.evaluate.stage import neighbour_captions

    near = nearest(data["pooled"], data["train_pooled"], k)
    refs = data["train_refs"]
    return neighbour_captions(list(data["gts"]), near, list(refs), refs)


def child(data_path: str, workers: int, out_path: str) -> None:
    from distinctcap.core.settings import EvalSettings
    from distinctcap.evaluate.metrics import CocoTools
    from distinctcap.evaluate.stage import text_metrics

    timings: dict[str, list[float]] = {}
    _instrument(timings)
    data = pickle.loads(Path(data_path).read_bytes())
    settings = EvalSettings(oracle_ns=[20, 100], seed=0, device="cpu")
    options = {"spice": settings.spice, "meteor_memory": settings.meteor_memory}
    parallel = "workers" in inspect.signature(CocoTools).parameters
    if parallel:  # the new code: the job's cores and the results folder's token cache
        options |= {"workers": workers, "cache_dir": str(Path(out_path).parent / "cache")}
    train_refs = data["train_refs"]
    values = {}
    wall0, cpu0 = time.perf_counter(), _cpu()
    if "neighbours" in inspect.signature(text_metrics).parameters:  # the caller finds them
        consensus = (consensus_neighbours(data, settings.consensus_neighbours),)
    else:  # before issue 55's evaluate memory fix, text_metrics found them
        consensus = (list(train_refs), data["pooled"], data["train_pooled"])
    with CocoTools(**options) as tools:
        for name, samples in data["samples"].items():
            out = text_metrics(
                data["gts"], samples, DECODINGS[name], train_refs, *consensus, settings, tools
            )
            values[name] = out.values
        close = time.perf_counter(), _cpu()
    wall1, cpu1 = time.perf_counter(), _cpu()
    timings["Java servers (CPU at their close)"] = [wall1 - close[0], cpu1 - close[1]]
    result = {"values": values, "timings": timings, "wall": wall1 - wall0, "cpu": cpu1 - cpu0}
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
