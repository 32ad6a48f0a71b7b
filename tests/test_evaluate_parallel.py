"""An evaluate job on all its cores gives today's serial numbers to the last digit: the forked
n-gram metrics, the METEOR servers and tokenizer JVMs side by side, the reference tokens kept
by content hash, the document frequencies counted once, and mBLEU-4 from one n-gram count."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu

from distinctcap.evaluate.metrics import CocoTools, evaluate_captions, mbleu
from distinctcap.evaluate.metrics import coco as coco_module
from distinctcap.evaluate.metrics.parallel import chunk_bounds, fork_map

WORDS = "a man dog riding horse on the beach two red ball plate of food with white".split()


def sentence(rng: random.Random, punctuation: bool = False) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 9))]
    return " ".join(words).capitalize() + ("." if punctuation else "")


def mbleu_by_rounds(caps_by_image) -> float:
    """mBLEU-4 as today's code computes it: one pycocoevalcap Bleu(4) call per round."""
    rounds = []
    for i in range(max(len(c) for c in caps_by_image.values())):
        ids = [k for k, caps in caps_by_image.items() if len(caps) > i]
        res = {k: [caps_by_image[k][i]] for k in ids}
        gts = {k: [c for j, c in enumerate(caps_by_image[k]) if j != i] for k in ids}
        rounds.append(Bleu(4).compute_score(gts, res, verbose=0)[0][3])
    return float(np.mean(rounds))


def test_mbleu_from_one_count_is_pycocoevalcaps_to_the_last_digit():
    rng = random.Random(0)
    for _ in range(20):  # ragged images, repeated captions, short ones
        caps = {i: [sentence(rng) for _ in range(rng.randint(2, 7))] for i in range(6)}
        caps[0] = caps[0][:1] * 3 + ["a"]
        assert mbleu(caps) == mbleu_by_rounds(caps)
        assert mbleu(caps, workers=2) == mbleu_by_rounds(caps)


def test_fork_map_returns_the_serial_results_in_order():
    items = list(range(37))
    assert fork_map(lambda x: x * x / 7, items, 2) == [x * x / 7 for x in items]
    assert chunk_bounds(5, 8) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a
    )


@pytest.fixture(scope="module")
def case():
    rng = random.Random(1)
    gts = {i: [sentence(rng, True) for _ in range(5)] for i in range(8)}
    samples = {i: [sentence(rng) for _ in range(6)] for i in gts}
    train = {100 + i: [sentence(rng, True) for _ in range(5)] for i in range(30)}
    neighbours = {i: train[100 + i] + train[101 + i] for i in gts}
    return {
        "gts": gts,
        "samples": samples,
        "train_refs": train,
        "oracle_ns": (1, 3, 6),
        "neighbour_captions": neighbours,
        "best_of": 2,
    }


def test_a_parallel_job_gives_the_serial_numbers_and_reuses_reference_tokens(
    case, tmp_path, monkeypatch
):
    # the thresholds shrunk, so this small case uses two tokenizer JVMs and METEOR servers
    monkeypatch.setattr(coco_module, "PTB_LINES_PER_JVM", 50)
    monkeypatch.setattr(coco_module, "METEOR_PAIRS_PER_SERVER", 10)
    with CocoTools(workers=1, cache_dir=tmp_path) as job:  # one session: METEOR starts twice
        expected = evaluate_captions(**case, tools=job)
        assert job.launches["meteor"] == 1 and job.launches["ptb"] == 1
        job.workers = 2
        assert same(evaluate_captions(**case, tools=job).values, expected.values)
        assert job.launches["meteor"] == 2 and job.launches["ptb"] == 3  # samples, neighbours
    assert len(list(tmp_path.glob("ptb-*.txt.gz"))) == 2  # gts and the training captions
    with CocoTools(workers=2, cache_dir=tmp_path) as later:  # the next job or run
        refs = (case["gts"], case["train_refs"])
        assert later.tokenize_groups(*refs, keep=(0, 1)) == job.tokenize_groups(*refs)
        assert later.launches["ptb"] == 0


def test_document_frequencies_are_counted_once_per_job(case):
    with CocoTools() as tools:
        train = tools.tokenize_groups(case["train_refs"], keep=(0,))[0]
        assert tools.cider_d(train) is tools.cider_d(dict(train))
        again = tools.tokenize_groups(case["train_refs"], keep=(0,))[0]
        assert again == train and tools.launches["ptb"] == 1


def test_spice_gets_threads_and_a_cache_in_the_results_folder(tmp_path):
    options = coco_module.spice_speed_options(3, tmp_path, "/unused")
    assert options == ["-threads", "3", "-cache", str(tmp_path / "spice")]
    assert (tmp_path / "spice").is_dir()
