"""Caption metrics against hand-computed values and pycocoevalcap's own scorers."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pycocoevalcap.cider.cider import Cider

from distinctcap.core.errors import DistinctcapError
from distinctcap.evaluate.metrics import (
    CocoTools,
    best_k,
    cider_vs_n,
    clipscore,
    consensus_rerank,
    distinct_share,
    div_n,
    evaluate_captions,
    gpt2_perplexity,
    mbleu,
    mean_length,
    mean_rank,
    model_self_retrieval,
    novelty,
    oracle_scores,
    quality_scores,
    recall_at_k,
    refclipscores,
    retrieval_scores,
    self_cider,
    spice_unavailable_reason,
    vocab_size,
)
from distinctcap.evaluate.metrics.diversity import self_cider_kernel, self_cider_score
from distinctcap.evaluate.metrics.ptb import PTB_JAR
from distinctcap.scores.cider import CiderD
from distinctcap.scores.ranks import retrieval_ranks

ROOT = Path(__file__).resolve().parents[1]
PKG = PTB_JAR.parents[1]  # the installed pycocoevalcap folder

GTS = {
    1: ["A man riding a horse on the beach.", "A person rides a brown horse along the shore."],
    2: ["Two dogs are playing with a red ball!", "Dogs play in the green grass."],
    3: ["A plate of food with broccoli and rice.", "A white plate holding some vegetables."],
}


@pytest.fixture(scope="module")
def tools():
    """One Java session for the module: METEOR starts once (~10 CPU-seconds)."""
    with CocoTools() as session:
        yield session


# ---------------------------------------------------------------- diversity (pure Python)


def test_div_n_is_distinct_ngrams_over_words_averaged_over_images():
    assert div_n({1: ["a b c", "a b d"]}, 1) == pytest.approx(4 / 6)
    assert div_n({1: ["a b c", "a b d"]}, 2) == pytest.approx(3 / 6)
    two = {1: ["a b c", "a b d"], 2: ["x x", "x x"]}
    assert div_n(two, 1) == pytest.approx((4 / 6 + 1 / 4) / 2)


def test_mbleu_is_mean_over_rounds_of_corpus_bleu4():
    # Round 0 and round 1 both pool A: 4/4, 3/3, 2/2, 1/1 and B: 3/4, 2/3, 1/2, 0/1 matches.
    caps = {"A": ["a b c d", "a b c d"], "B": ["e f g h", "e f g x"]}
    expected = (7 / 8 * 5 / 6 * 3 / 4 * 1 / 2) ** 0.25
    assert mbleu(caps) == pytest.approx(expected, rel=1e-6)
    assert mbleu({"A": ["a b c d"] * 3}) == pytest.approx(1.0, rel=1e-6)


def test_self_cider_is_0_for_identical_and_1_for_disjoint_captions():
    same = {1: ["a b c d"] * 3}
    disjoint = {2: ["e f g h", "i j k l", "m n o p"]}
    corpus = [same[1], disjoint[2]]  # two documents, so every n-gram has idf log 2
    assert self_cider(same, df_corpus=corpus) == pytest.approx(0.0, abs=1e-9)
    assert self_cider(disjoint, df_corpus=corpus) == pytest.approx(1.0, abs=1e-9)
    assert self_cider({**same, **disjoint}) == pytest.approx(0.5, abs=1e-9)
    partial = self_cider({3: ["a b c d", "a b c x", "q r s t"]}, df_corpus=corpus)
    assert 0.0 < partial < 1.0
    with pytest.raises(DistinctcapError, match="at least 2"):
        self_cider(same)  # one image as its own idf corpus: every n-gram would weigh 0


def clipped_eigen_score(kernel):
    """The rule self_cider followed before issue 45 (eigenvalues clipped at 0), for contrast."""
    lam = np.clip(np.linalg.eigvalsh(kernel), 0.0, None)
    roots = np.sqrt(lam)
    return -math.log(roots.max() / roots.sum()) / math.log(len(kernel))


def test_self_cider_takes_singular_values_of_a_kernel_that_is_not_psd():
    """Wang & Chan's code: singular values. K's eigenvalues are 1 + √2, 1 and 1 - √2 < 0, so
    its singular values are 1 + √2, 1, √2 - 1 where clipping would keep 1 + √2, 1, 0."""
    kernel = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    top, low = math.sqrt(1 + math.sqrt(2)), math.sqrt(math.sqrt(2) - 1)
    authors = -math.log(top / (top + 1 + low)) / math.log(3)  # 0.65687
    assert self_cider_score(kernel) == pytest.approx(authors, rel=1e-12)
    assert self_cider_score(10 * kernel) == pytest.approx(authors, rel=1e-12)  # scale-free
    clipped = -math.log(top / (top + 1)) / math.log(3)  # 0.45228
    assert clipped_eigen_score(kernel) == pytest.approx(clipped, rel=1e-12)
    assert authors - clipped == pytest.approx(0.20458, abs=1e-5)


def test_self_cider_of_captions_whose_mirrored_kernel_is_not_psd():
    """"a a", "a d", "a a" with the corpus {these, "c d"}: idf log 2 for a, a a, a d, and 0 for
    d; every caption has one bigram (no length penalty). By hand, with the clipped overlap
    Σ min(h, r) r / (|h| |r|) per order and 10 / 4 x the sum over orders 1 and 2:
    K[0, 0] = K[1, 1] = K[0, 2] = K[2, 2] = 5 (orders 1 and 2 match fully),
    K[0, 1] = CIDEr-D("a a" | "a d") = 2.5 x (2 ∧ 1) x 1 / (2 x 1) = 1.25,
    K[1, 2] = CIDEr-D("a d" | "a a") = 2.5 x (1 ∧ 2) x 2 / (1 x 2) = 2.5.
    K = 1.25 M, M = [[4, 1, 4], [1, 4, 2], [4, 2, 4]]: det(M - λI) = -(λ³ - 12λ² + 27λ + 4),
    whose roots are 8.92434, 3.21507 and -0.13941."""
    caps = ["a a", "a d", "a a"]
    scorer = CiderD([caps, ["c d"]])
    hand = 1.25 * np.array([[4.0, 1.0, 4.0], [1.0, 4.0, 2.0], [4.0, 2.0, 4.0]])
    assert self_cider_kernel(scorer, caps) == pytest.approx(hand, rel=1e-12)
    roots = np.sqrt(np.abs(np.roots([1.0, -12.0, 27.0, 4.0])))
    authors = -math.log(roots.max() / roots.sum()) / math.log(3)
    assert authors == pytest.approx(0.496393, abs=1e-6)
    assert self_cider({1: caps}, df_corpus=[caps, ["c d"]]) == pytest.approx(authors, rel=1e-12)
    assert clipped_eigen_score(hand) == pytest.approx(0.427938, abs=1e-6)  # what it was


def test_self_cider_of_a_psd_kernel_is_unchanged():
    """Where K is positive semi-definite its singular values are its eigenvalues: the score
    is the one eigenvalues clipped at 0 gave (regression)."""
    kernel = np.array([[2.0, 1.0], [1.0, 2.0]])  # eigenvalues 3 and 1
    expected = -math.log(math.sqrt(3) / (math.sqrt(3) + 1)) / math.log(2)
    assert self_cider_score(kernel) == pytest.approx(expected, rel=1e-12)
    caps = ["a b c d", "a b c x", "q r s t"]
    scorer = CiderD([caps, ["e f g h"]])
    kernel = self_cider_kernel(scorer, caps)
    assert np.linalg.eigvalsh(kernel).min() > 0
    assert self_cider_score(kernel) == pytest.approx(clipped_eigen_score(kernel), rel=1e-12)


def test_cider_d_equals_pycocoevalcap_per_item():
    gts = {
        1: ["a man riding a horse on the beach", "a person rides a brown horse"],
        2: ["two dogs are playing with a red ball", "dogs play in the grass"],
        3: ["a plate of food with broccoli", "a white plate holding vegetables and a fork"],
    }
    res = {1: ["a man riding a brown horse"], 2: ["a dog with a ball"], 3: ["a plate"]}
    _, expected = Cider().compute_score(gts, res)
    scorer = CiderD(gts.values())
    assert [scorer.score(res[i][0], gts[i]) for i in gts] == pytest.approx(list(expected))


def test_share_novelty_vocab_and_length():
    caps = {1: ["a cat", "a cat", "a dog"], 2: ["a cat", "the red bird", "a bird"]}
    assert distinct_share(caps) == pytest.approx((2 / 3 + 3 / 3) / 2)
    assert distinct_share(caps, scope="corpus") == pytest.approx(4 / 6)
    assert novelty(caps, ["a cat", "a bird"]) == pytest.approx(2 / 6)
    assert vocab_size(caps) == 6  # a cat dog the red bird
    assert mean_length(caps) == pytest.approx(13 / 6)


# ---------------------------------------------------------------- retrieval


def test_clipscore_is_w_times_clipped_cosine():
    text = np.array([[1.0, 0.0], [3.0, 4.0], [1.0, 0.0]])
    image = np.array([[2.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    assert clipscore(text, image) == pytest.approx((2.5 + 2.5 * 0.6 + 0.0) / 3)
    torch = pytest.importorskip("torch")
    as_tensors = torch.tensor(text, dtype=torch.float16), torch.tensor(image)
    assert clipscore(*as_tensors, w=1.0) == pytest.approx((1.0 + 0.6 + 0.0) / 3, rel=1e-3)


def test_refclipscore_is_the_harmonic_mean_of_clipscore_and_the_best_reference():
    """Hessel et al. 2021 eq. 2 on hand-made 2-d embeddings (unnormalised: rows are scaled
    to unit length first): H-Mean(2.5 max(cos(c, v), 0), max(max_r cos(c, r), 0))."""
    text = np.array([[1.0, 0.0], [3.0, 4.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    image = np.array([[2.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    refs = np.array([[0.0, 1.0], [4.0, 3.0], [1.0, 1.0], [1.0, 0.0], [0.0, -1.0], [0.0, -2.0]])
    owner = [0, 1, 0, 2, 3, 4]  # candidate 0 has two references, in no particular order
    expected = [
        2 * 2.5 * 2**-0.5 / (2.5 + 2**-0.5),  # CLIPScore 2.5, best reference cos 1/√2
        2 * 1.5 * 0.96 / (1.5 + 0.96),  # cos(c, v) = 0.6 -> 1.5; cos(c, r) = 0.96
        0.0,  # the image side is 0 (cos -1 clipped): H-Mean(0, 1) = 0
        0.0,  # the only reference has cos -1, clipped to 0: H-Mean(2.5, 0) = 0
        0.0,  # both sides 0: 0, not 0 / 0
    ]
    scores = refclipscores(text, image, refs, owner)
    assert scores.dtype == np.float32
    assert scores.tolist() == pytest.approx(expected, rel=1e-6)
    assert expected[:2] == pytest.approx([1.102406, 48 / 41], abs=1e-6)
    with pytest.raises(DistinctcapError, match=r"candidates \[4\] have no reference"):
        refclipscores(text, image, refs[:5], owner[:5])


def test_retrieval_ranks_recall_and_hard_pool():
    images = np.eye(3)
    texts = np.array([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.5, 0.3, 0.1]])
    ranks = retrieval_ranks(texts, images, [0, 1, 2])
    assert ranks.tolist() == [1, 2, 3]
    assert recall_at_k(ranks) == pytest.approx({"r_at_1": 1 / 3, "r_at_5": 1.0, "r_at_10": 1.0})
    assert mean_rank(ranks) == 2.0
    assert retrieval_scores(texts, images, [0, 1, 2]).values == pytest.approx(
        {"r_at_1": 1 / 3, "r_at_5": 1.0, "r_at_10": 1.0, "mean_rank": 2.0}
    )
    # A hard pool appends look-alike images; a tie counts against the caption.
    pool = np.vstack([images, [[1.0, 0.01, 0.0], [2.0, 0.0, 0.0]]])
    assert retrieval_ranks(texts, pool, [0, 1, 2]).tolist() == [2, 4, 5]


def test_model_self_retrieval_ranks_own_image_column():
    logp = np.array([[-1.0, -2.0, -3.0], [-5.0, -1.0, -9.0], [-2.0, -2.0, -2.0]])
    out = model_self_retrieval(logp)  # own image in column 0
    assert out.values == pytest.approx(
        {"self_r_at_1": 1 / 3, "self_r_at_5": 1.0, "self_r_at_10": 1.0, "self_mean_rank": 2.0}
    )
    assert model_self_retrieval(logp, target=[0, 1, 0])["self_r_at_1"] == pytest.approx(2 / 3)


# ---------------------------------------------------------------- Java tools


def test_ptb_tokenizer_lowercases_and_drops_punctuation(tools):
    got = tools.tokenize(["A man, riding a horse.", "", 'the dog\'s "ball"\nnext line'])
    assert got == ["a man riding a horse", "", "the dog 's ball next line"]


def test_quality_scores_perfect_match_and_spice_skipped_not_zero(tools):
    res = {i: caps[:1] for i, caps in GTS.items()}
    out = quality_scores(GTS, res, tools=tools)
    for name in ("bleu1", "bleu2", "bleu3", "bleu4", "rouge_l"):
        assert out[name] == pytest.approx(1.0, abs=1e-6), name
    assert out["meteor"] > 0.9  # METEOR's fragmentation penalty keeps an exact match below 1
    gts_t, res_t = tools.tokenize_groups(GTS, res)
    assert out["cider"] == pytest.approx(Cider().compute_score(gts_t, res_t)[0])
    if spice_unavailable_reason() is None:
        assert 0.0 < out["spice"] <= 1.0
    else:
        assert math.isnan(out["spice"]) and "CoreNLP" in out.skipped["spice"]


def test_oracle_takes_each_images_best_sample(tools):
    samples = {
        1: ["a dog", "a man riding a horse on the beach", "a horse"],
        2: ["two dogs are playing with a red ball", "a ball", "grass"],
        3: ["a fork", "a table", "a plate of food with broccoli and rice"],
    }
    out = oracle_scores(GTS, samples, 3, tools=tools)
    assert out["oracle_bleu4_3"] == pytest.approx(1.0, abs=1e-6)
    assert out["oracle_rouge_l_3"] == pytest.approx(1.0)
    # The one-call scoring equals the usual protocol: one evaluation per sample index, max.
    gts_t, samples_t = tools.tokenize_groups(GTS, samples)
    per_index = [
        Cider().compute_score(gts_t, {i: [s[j]] for i, s in samples_t.items()})[1] for j in range(3)
    ]
    assert out["oracle_cider_3"] == pytest.approx(np.max(per_index, axis=0).mean())
    curve = cider_vs_n(gts_t, samples_t, [1, 2, 3], tokenized=True, tools=tools)
    assert curve[1] == pytest.approx(np.mean(per_index[0]))
    assert curve[1] <= curve[2] <= curve[3] == pytest.approx(out["oracle_cider_3"])
    if spice_unavailable_reason() is not None:
        assert math.isnan(out["oracle_spice_3"]) and "oracle_spice_3" in out.skipped
    with pytest.raises(DistinctcapError, match="fewer"):
        oracle_scores(GTS, samples, 4, tokenized=True, tools=tools)


def test_consensus_rerank_prefers_candidates_like_the_neighbours_captions():
    samples = {
        1: ["a cat on a mat", "a dog in a park", "a red car"],
        2: ["a boat", "a ship at sea"],
    }
    neighbours = {
        1: ["a dog in the park", "a dog running in a park"],
        2: ["a large ship at sea", "a ship sailing at sea"],
    }
    ranked = consensus_rerank(samples, neighbours)
    assert ranked[1][0] == "a dog in a park" and ranked[2][0] == "a ship at sea"
    assert best_k(ranked, 1) == {1: ["a dog in a park"], 2: ["a ship at sea"]}


def test_evaluate_captions_launches_each_java_tool_once(tools):
    samples = {
        1: ["A man riding a horse.", "A horse on the beach.", "A man."],
        2: ["Two dogs with a ball.", "Dogs in the grass.", "A red ball."],
        3: ["A plate of food.", "Broccoli and rice on a plate.", "A white plate."],
    }
    neighbours = {i: GTS[j] for i, j in ((1, 1), (2, 2), (3, 1))}
    train = {10: ["a man riding a horse"], 11: ["a dog"], 12: ["a plate of food"]}
    before = tools.launches["ptb"]
    out = evaluate_captions(
        GTS,
        samples,
        train_refs=train,
        oracle_ns=(1, 3),
        neighbour_captions=neighbours,
        best_of=2,
        tools=tools,
    )
    # the decoding's captions in one launch, the training captions streamed in one part
    assert tools.launches["ptb"] == before + 2 and tools.launches["meteor"] == 1
    for name in (
        "bleu4",
        "cider",
        "div1",
        "div2",
        "mbleu4",
        "self_cider",
        "distinct",
        "novelty",
        "vocab",
        "length",
        "oracle_cider_3",
        "consensus_cider",
        "consensus_div1",
    ):
        assert math.isfinite(out[name]), name
    assert out["novelty"] == pytest.approx(1 / 3)  # two first samples are training captions
    assert out["oracle_cider_1"] == pytest.approx(out["cider"])
    assert set(out.skipped) <= {"spice", "oracle_spice_1", "oracle_spice_3", "consensus_spice"}


def _parallel_job(seed: int) -> str:
    return f"""
import json
from distinctcap.evaluate.metrics import quality_scores
gts = {json.dumps({str(k): v for k, v in GTS.items()})}
res = {{k: [v[{seed}]] for k, v in gts.items()}}
print(json.dumps(quality_scores(gts, res).values))
"""


def test_two_evaluations_in_parallel_processes_do_not_collide(tools):
    def listing():
        return sorted(str(p) for p in PKG.rglob("*") if "__pycache__" not in p.parts)

    before = listing()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _parallel_job(seed)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (0, 1)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    for seed, (stdout, _) in zip((0, 1), outputs, strict=True):
        got = json.loads(stdout.strip().splitlines()[-1])
        res = {str(k): [v[seed]] for k, v in GTS.items()}
        gts = {str(k): v for k, v in GTS.items()}
        expected = quality_scores(gts, res, tools=tools).values
        assert got == pytest.approx(expected, nan_ok=True)
    assert listing() == before  # nothing written into (or left in) the package folder


# ---------------------------------------------------------------- fluency


def test_gpt2_perplexity_skips_without_local_weights(tmp_path):
    for path in (tmp_path / "no-such-model", None):
        out = gpt2_perplexity(["a man riding a horse"], path)
        assert math.isnan(out["ppl"]) and "no local GPT-2" in out.skipped["ppl"]


def test_gpt2_perplexity_of_a_tiny_local_model_matches_per_caption_losses(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = ["a man riding a horse", "two dogs play with a red ball on the grass"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    eot = "<|endoftext|>"
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot)
    fast.save_pretrained(tmp_path)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_positions=32,
        n_embd=16,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(tmp_path)

    nll, count = 0.0, 0
    with torch.no_grad():
        for text in texts:  # one caption at a time: no padding involved
            ids = torch.tensor([[0, *fast(text)["input_ids"]]])
            nll += float(model(input_ids=ids, labels=ids).loss) * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    out = gpt2_perplexity(texts, tmp_path, batch_size=2)  # padded batch
    assert out.skipped == {}
    assert out["ppl"] == pytest.approx(math.exp(nll / count), rel=1e-5)
