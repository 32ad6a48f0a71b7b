"""An evaluate job on all its cores gives today's serial numbers to the last digit: the forked
n-gram metrics, the METEOR servers and tokenizer JVMs side by side, the reference tokens kept
by content hash, the document frequencies counted once, mBLEU-4 from one n-gram count, and
CIDEr-D's many pairs (SelfCIDEr, consensus, oracle) as numpy matrices."""

from __future__ import annotations

import math
import random
import subprocess
from collections import Counter

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.rouge.rouge import Rouge

from distinctcap.evaluate.metrics import (
    CocoTools,
    consensus_rerank,
    evaluate_captions,
    mbleu,
    novelty,
)
from distinctcap.evaluate.metrics import coco as coco_module
from distinctcap.evaluate.metrics import java as java_module
from distinctcap.evaluate.metrics import meteor as meteor_module
from distinctcap.evaluate.metrics import ptb as ptb_module
from distinctcap.evaluate.metrics import spice as spice_module
from distinctcap.evaluate.metrics.diversity import self_cider_kernel
from distinctcap.evaluate.metrics.parallel import chunk_bounds, fork_map
from distinctcap.scores import cider as cider_module
from distinctcap.scores.cider import CiderD, ngram_counts

WORDS = "a man dog riding horse on the beach two red ball plate of food with white".split()
FORCED_WARNING = ("-XX:+UseLargePages",)  # a JVM warning where no large pages are configured


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


def ragged_captions(rng: random.Random, count: int) -> list[str]:
    """Short, long, empty and repeated captions with repeated words."""
    caps = [" ".join(rng.choices(WORDS[:6], k=rng.randint(0, 14))) for _ in range(count)]
    return caps + caps[:2]


def kernel_by_pairs(scorer: CiderD, caps: list[str]) -> np.ndarray:
    """SelfCIDEr's kernel as today's code builds it: `pair` of each i <= j, mirrored."""
    kernel = np.zeros((len(caps), len(caps)))
    for i in range(len(caps)):
        for j in range(i, len(caps)):
            kernel[i, j] = kernel[j, i] = scorer.pair(caps[i], caps[j])
    return kernel


def test_cider_d_matrices_are_the_per_pair_floats_to_the_last_digit(monkeypatch):
    rng = random.Random(2)
    scorer = CiderD([ragged_captions(rng, 5) for _ in range(40)])
    monkeypatch.setattr(cider_module, "BLOCK_TERMS", 300)  # several blocks per matrix
    for _ in range(15):
        hyps = ragged_captions(rng, rng.randint(1, 12))
        refs = ragged_captions(rng, rng.randint(1, 9))
        pairs = scorer.pair_matrix(hyps, refs)
        assert pairs.tolist() == [[scorer.pair(h, r) for r in refs] for h in hyps]
        assert scorer.scores(hyps, refs).tolist() == [scorer.score(h, refs) for h in hyps]
        caps = hyps + refs
        assert (self_cider_kernel(scorer, caps) == kernel_by_pairs(scorer, caps)).all()


def test_document_frequencies_count_each_images_ngrams_once():
    rng = random.Random(5)
    docs = [ragged_captions(rng, rng.randint(0, 4)) for _ in range(30)]
    expected = Counter()
    for doc in docs:
        expected.update({gram for caption in doc for gram in ngram_counts(caption)})
    assert CiderD(iter(docs)).df.as_counter() == expected


def test_consensus_and_oracle_cider_are_the_per_pair_scores():
    rng = random.Random(3)
    samples = {i: ragged_captions(rng, 8) for i in range(5)}
    neighbours = {i: ragged_captions(rng, 6) for i in range(5)}
    scorer = CiderD(neighbours.values())
    ranked = consensus_rerank(samples, neighbours, scorer=scorer, workers=2)
    for i, caps in samples.items():
        scores = [scorer.score(c, neighbours[i]) for c in caps]
        order = sorted(range(len(caps)), key=lambda j, s=scores: -s[j])
        assert ranked[i] == [caps[j] for j in order]
    pairs = [(c, neighbours[i]) for i, caps in samples.items() for c in caps]  # the oracle's
    expected = [scorer.score(c, refs) for c, refs in pairs]
    assert coco_module._cider_scores(pairs, scorer).tolist() == expected


def test_oracle_bleu_and_rouge_are_pycocoevalcaps_to_the_last_digit():
    rng = random.Random(4)
    pairs = []
    for _ in range(12):  # an image's samples share its references; some longer than 64 words
        refs = ragged_captions(rng, rng.randint(1, 4)) + [" ".join(rng.choices(WORDS, k=70))]
        pairs += [(c, refs) for c in ragged_captions(rng, rng.randint(1, 5))]
    gts = {k: list(refs) for k, (_, refs) in enumerate(pairs)}
    res = {k: [hyp] for k, (hyp, _) in enumerate(pairs)}
    assert coco_module._bleu_scores(pairs) == Bleu(4).compute_score(gts, res, verbose=0)[1]
    rouge = [coco_module.rouge_l(hyp, refs) for hyp, refs in pairs]
    assert rouge == [Rouge().calc_score([hyp], refs) for hyp, refs in pairs]


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
    monkeypatch.setattr(ptb_module, "PTB_LINES_PER_JVM", 50)
    monkeypatch.setattr(meteor_module, "METEOR_PAIRS_PER_SERVER", 10)
    with CocoTools(workers=1, cache_dir=tmp_path) as job:  # one session: METEOR starts twice
        expected = evaluate_captions(**case, tools=job)
        # the decoding's captions, then the training captions streamed (here in one part)
        assert job.launches["meteor"] == 1 and job.launches["ptb"] == 2
        job.workers = 4  # two METEOR servers: half the cores
        assert same(evaluate_captions(**case, tools=job).values, expected.values)
        assert job.launches["meteor"] == 2 and job.launches["ptb"] == 5  # the samples cut in 3
    assert len(list(tmp_path.glob("ptb-*.txt.gz"))) == 2  # gts and the training captions
    with CocoTools(workers=2, cache_dir=tmp_path) as later:  # the next job or run
        groups = (case["gts"], case["samples"], case["neighbour_captions"], case["train_refs"])
        assert later.tokenize_groups(*groups, keep=(0, 3)) == job.tokenize_groups(*groups)
        assert later.launches["ptb"] == 2  # the samples and neighbours only, in two parts


def test_tokens_are_the_serial_files_wherever_the_captions_are_cut(tmp_path, monkeypatch):
    """The PTB tokenizer reads past a line's end: a final "a." stays one token at the end of
    the file and is split before a line that starts "A". Parts tokenised side by side and groups
    found in the cache give the tokens of the one serial file (the full-size COCO benchmark
    found one training caption cut at a part's end)."""
    lines = ["A dog with a.", "A man on a.", "Two dogs and a.", "A cat on a."]
    with CocoTools(workers=1) as serial:
        expected = serial.tokenize(lines)
        assert expected[0] == "a dog with a" and serial.tokenize(lines[:1]) == ["a dog with a."]
        before_a_lowercase_line = serial.tokenize([*lines[:2], "the end."])[:2]
    monkeypatch.setattr(ptb_module, "PTB_LINES_PER_JVM", 1)
    with CocoTools(workers=4, cache_dir=tmp_path) as parts:
        assert parts.tokenize(lines) == expected
        groups = ({0: lines[:2]}, {1: lines[2:]})
        assert parts.tokenize_groups(*groups, keep=(0,)) == [{0: expected[:2]}, {1: expected[2:]}]
    with CocoTools(workers=4, cache_dir=tmp_path) as later:  # the first group from the cache
        assert later.tokenize_groups(*groups, keep=(0,))[0] == {0: expected[:2]}
        assert later.launches["ptb"] == 2
        # before another line the same group is tokenised again, as in that serial file
        other = later.tokenize_groups(groups[0], {1: ["the end."]}, keep=(0,))
        assert other[0] == {0: before_a_lowercase_line}
        assert later.launches["ptb"] == 2 + 3  # both groups again, a part a line


def test_meteor_servers_take_half_the_cores_and_score_each_distinct_pair_once(monkeypatch):
    count = meteor_module.meteor_server_count
    assert [count(25_000, w) for w in (1, 2, 3, 4, 16)] == [1, 1, 2, 2, 3]
    assert count(0, 8) == 1
    refs = ("a dog runs on the grass", "a brown dog on a lawn")
    pairs = [("a dog on grass", refs), ("a cat", refs), ("a dog on grass", list(refs))]
    monkeypatch.setattr(meteor_module, "METEOR_PAIRS_PER_SERVER", 1)
    with CocoTools(workers=4) as tools:
        scores = tools.meteor_segments(pairs)
        assert tools.launches["meteor"] == 2  # two distinct pairs
        assert scores[0] == scores[2] and scores == tools.meteor(pairs)[1]


def test_document_frequencies_are_counted_once_per_job(case):
    with CocoTools() as tools:
        train = tools.tokenize_groups(case["train_refs"], keep=(0,))[0]
        assert tools.cider_d(train) is tools.cider_d(dict(train))
        again = tools.tokenize_groups(case["train_refs"], keep=(0,))[0]
        assert again == train and tools.launches["ptb"] == 1
        corpus = tools.training(case["train_refs"])
        assert tools.training(dict(case["train_refs"])) is corpus
        assert tools.launches["ptb"] == 2


def tricky_training_captions(rng: random.Random) -> dict[int, list[str]]:
    """Training captions whose tokens depend on the line after them: "A dog with a." ends the
    first part of 4 captions and is tokenised "a dog with a" before the capitalised line that
    starts the next; the file's last line keeps its "a." (tokenize's test below). An image
    without captions and a repeated caption too."""
    train = {100 + i: [sentence(rng, True), sentence(rng, True)] for i in range(10)}
    train[101] = ["A man.", "A dog with a."]
    train[102][0] = "A cat on a."
    train[105] = []
    train[107] = [train[103][1], "A man."]
    train[109][1] = "Two dogs and a."
    return train


@pytest.mark.parametrize("lines", [1, 10_000])
def test_streamed_training_captions_give_the_whole_files_frequencies_and_novelty(
    lines, case, tmp_path, monkeypatch
):
    """The streamed path (CocoTools.training, parts of `lines` captions and the worker
    count's floor of 4) against the computation it replaced: the training captions
    tokenised as the last group of the decoding's one file, CIDEr-D on their document list,
    novelty against their set; and the decoding's own groups tokenised before the training
    captions' first line, as they were in that file."""
    monkeypatch.setattr(ptb_module, "STREAM_LINES_PER_WORKER", lines)
    train = tricky_training_captions(random.Random(lines))
    groups = ({i: case["gts"][i] for i in case["samples"]}, case["samples"], {0: ["A dog on a."]})
    with CocoTools(cache_dir=tmp_path) as old:
        *old_groups, train_t = old.tokenize_groups(*groups, train, keep=(0, 3))
    old_captions = [c for caps in train_t.values() for c in caps]
    old_cider = CiderD(train_t.values())
    assert old_captions[3] == "a dog with a" and old_captions[-1] == "two dogs and a."
    first = {i: caps[:1] for i, caps in old_groups[1].items()}
    first[0] = [old_captions[0]]  # one first caption is a training caption
    for cache in (None, tmp_path):  # tokenised here, then read from the old job's file
        with CocoTools(cache_dir=cache) as new:
            then = next(c for caps in train.values() for c in caps)
            assert new.tokenize_groups(*groups, keep=(0,), then=then) == old_groups
            corpus = new.training(train)
            parts = len(ptb_module._image_parts(train, 4 * lines))  # none read from a file
            assert new.launches["ptb"] == 1 + (0 if cache else parts)
            assert (parts > 1) == (lines == 1)
        assert corpus.cider.df.as_counter() == old_cider.df.as_counter()
        assert corpus.cider.log_docs == old_cider.log_docs
        assert all(c in corpus.captions for c in old_captions)
        assert len(corpus.captions) == len(set(old_captions))
        assert novelty(first, corpus.captions) == novelty(first, old_captions) < 1
        cands = [c for caps in old_groups[1].values() for c in caps] + old_captions[:3]
        assert (corpus.cider.pair_matrix(cands, old_captions)
                == old_cider.pair_matrix(cands, old_captions)).all()  # fmt: skip


def test_spice_gets_threads_and_a_cache_in_the_results_folder(tmp_path):
    options = spice_module.spice_speed_options(3, tmp_path, "/unused")
    assert options == ["-threads", "3", "-cache", str(tmp_path / "spice")]
    assert (tmp_path / "spice").is_dir()


def test_jvm_warnings_stay_off_the_tokens_and_meteor_scores(monkeypatch):
    """The JVM writes its own warnings to stdout unless told otherwise (a CI run's tokenizer
    gave 242 lines for 241 captions). A warning forced into every JVM of the test (large pages
    asked for where none are configured) leaves the tokens and METEOR's scores unchanged."""
    java = java_module.java_executable()
    probe = subprocess.run([java, *FORCED_WARNING, "-version"], capture_output=True, text=True)
    if "warning" not in probe.stdout:
        pytest.skip("this JVM prints no warning on stdout for large pages (they are configured)")
    lines = ["A dog with a ball.", "Two cats on a sofa."]
    pairs = [("a dog on grass", ("a dog runs on the grass", "a brown dog on a lawn"))]
    with CocoTools(workers=1) as quiet:
        tokens, meteor = quiet.tokenize(lines), quiet.meteor(pairs)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", " ".join(FORCED_WARNING))
    with CocoTools(workers=1) as warned:
        assert warned.tokenize(lines) == tokens
        assert warned.meteor(pairs) == meteor
    java_module.check_java()
