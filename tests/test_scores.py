"""CIDEr-D written once (distinctcap.scores.cider): every value of both forms, sentences (the
metric) and token ids (the SCST reward), is pycocoevalcap's per-pair loop to the last digit,
the reward equals the metric on the same captions, and both agree with pycocoevalcap's own
Cider."""

import itertools
import math
import random
from collections import Counter

import numpy as np
import pytest
from pycocoevalcap.cider.cider import Cider

from distinctcap.core.errors import DistinctcapError
from distinctcap.scores import cider as cider_module
from distinctcap.scores import frequencies
from distinctcap.scores.cider import CiderD, TokenCiderD, ngram_counts
from distinctcap.scores.frequencies import DocumentFrequencies, document_ngrams

PAD, EOS = 0, 2  # as data.tokenizer; scores may not import it
STOPS = (PAD, EOS)
WORDS = "a the red blue green dog cat on mat sits big small runs".split()
VOCAB = {w: i + 4 for i, w in enumerate(WORDS)}  # one id per word: texts map 1:1 to ids
V = len(WORDS) + 4


def ids_of(texts, width=16, eos=True) -> np.ndarray:
    out = np.full((len(texts), width), PAD)
    for i, text in enumerate(texts):
        row = [VOCAB[w] for w in text.split()] + ([EOS] if eos else [])
        out[i, : len(row)] = row
    return out


def as_ids(text: str) -> str:
    """A caption as the sentence of its token ids (the reward's words)."""
    return " ".join(str(VOCAB[w]) for w in text.split())


def corpus(n_images=30, seed=0):
    rng = random.Random(seed)
    return [
        [" ".join(rng.choices(WORDS, k=rng.randint(1, 12))) for _ in range(rng.randint(1, 5))]
        for _ in range(n_images)
    ]


def candidates(docs, count=80, seed=1):
    """Random captions, an empty one, repeated words and references themselves, each with the
    image it is scored against."""
    rng = random.Random(seed)
    cands = [" ".join(rng.choices(WORDS, k=rng.randint(0, 14))) for _ in range(count)]
    cands += [docs[3][0], "", "a", "a a a a a a", docs[5][0] + " " + docs[5][0]]
    images = [rng.randrange(len(docs)) for _ in cands[:-5]] + [3, 0, 1, 2, 5]
    return cands, images


def loop_cider_d(docs, candidate, references, key_order=False, n=4, sigma=6.0):
    """pycocoevalcap's CiderScorer (`precook`, `counts2vec`, `sim`) for one candidate, one
    pair at a time in plain Python, with the document frequencies of `docs`: a caption's
    n-grams in first-occurrence order, or sorted (key order, for word ids of one width)."""
    df = Counter(g for doc in docs for g in document_ngrams(doc, n))
    log_docs = math.log(len(docs))

    def vector(sentence):
        counts = ngram_counts(sentence, n)
        items = counts.items()
        if key_order:
            items = sorted(items, key=lambda item: [int(w) for w in item[0]])
        vec, norm = [{} for _ in range(n)], [0.0] * n
        for gram, tf in items:
            w = tf * (log_docs - math.log(max(1.0, df[gram])))
            vec[len(gram) - 1][gram] = w
            norm[len(gram) - 1] += w * w
        length = sum(tf for gram, tf in counts.items() if len(gram) == 2)
        return vec, [math.sqrt(x) for x in norm], length

    def pair(reference):
        (vec_c, norm_c, len_c), (vec_r, norm_r, len_r) = vector(candidate), vector(reference)
        penalty = math.exp(-((len_c - len_r) ** 2) / (2 * sigma**2))
        total = 0.0
        for k in range(n):
            val = 0.0
            for gram, w in vec_c[k].items():
                val += min(w, vec_r[k].get(gram, 0.0)) * vec_r[k].get(gram, 0.0)
            if norm_c[k] != 0 and norm_r[k] != 0:
                val /= norm_c[k] * norm_r[k]
            total += val * penalty
        return 10.0 * total / n

    return sum(pair(r) for r in references) / len(references)


def test_sentences_are_pycocoevalcaps_loop_to_the_last_digit(monkeypatch):
    docs = corpus()
    scorer = CiderD(docs)
    cands, images = candidates(docs)
    expected = [loop_cider_d(docs, c, docs[i]) for c, i in zip(cands, images, strict=True)]
    assert [scorer.score(c, docs[i]) for c, i in zip(cands, images, strict=True)] == expected
    assert scorer.score_each(cands, [docs[i] for i in images]).tolist() == expected
    monkeypatch.setattr(cider_module, "BLOCK_TERMS", 50)  # many blocks per call
    refs = docs[7] + docs[8] + [""]
    matrix = scorer.pair_matrix(cands, refs)
    assert matrix.tolist() == [[loop_cider_d(docs, c, [r]) for r in refs] for c in cands]
    assert scorer.scores(cands, refs).tolist() == [loop_cider_d(docs, c, refs) for c in cands]


def test_a_full_memo_starts_afresh_with_the_same_scores(monkeypatch):
    """A scorer keeps at most MEMO_SENTENCES sentence vectors between calls (an evaluate job's
    training scorer kept every sample of every decoding, issue 55); past it the memo and the
    n-gram keys start afresh and every score is the same to the last digit."""
    docs = corpus()
    cands, images = candidates(docs)
    expected = [loop_cider_d(docs, c, docs[i]) for c, i in zip(cands, images, strict=True)]
    monkeypatch.setattr(cider_module, "MEMO_SENTENCES", 10)
    scorer, kept = CiderD(docs), []
    for c, i in zip(cands, images, strict=True):
        assert scorer.score(c, docs[i]) == expected[len(kept)]
        kept.append(len(scorer._cache))
    assert max(kept) <= 10 and min(kept[10:]) < max(kept)  # it filled and started afresh
    assert scorer.score_each(cands, [docs[i] for i in images]).tolist() == expected
    assert len(scorer._cache) > 10  # one call's sentences, whatever their number


def test_token_ids_are_pycocoevalcaps_loop_in_key_order_to_the_last_digit(monkeypatch):
    docs = corpus(seed=2)
    refs = [c for doc in docs for c in doc]
    groups = np.array([i for i, doc in enumerate(docs) for _ in doc])
    order = np.random.default_rng(0).permutation(len(refs))  # references in any order
    reward = TokenCiderD(ids_of(refs)[order], groups[order], V, STOPS)
    cands, images = candidates(docs, seed=3)
    id_docs = [[as_ids(c) for c in doc] for doc in docs]
    given = [[as_ids(refs[j]) for j in order if groups[j] == i] for i in range(len(docs))]
    expected = [
        loop_cider_d(id_docs, as_ids(c), given[i], key_order=True)
        for c, i in zip(cands, images, strict=True)
    ]
    assert reward.score(ids_of(cands), np.array(images)).tolist() == expected
    monkeypatch.setattr(cider_module, "BLOCK_TERMS", 50)
    assert reward.score(ids_of(cands), np.array(images)).tolist() == expected
    # document frequencies counted a few images' references at a time, from int32 ids
    monkeypatch.setattr(cider_module, "DF_BLOCK", 7)
    blocks = TokenCiderD(ids_of(refs)[order].astype(np.int32), groups[order], V, STOPS)
    np.testing.assert_array_equal(blocks.df_keys, reward.df_keys)
    np.testing.assert_array_equal(blocks.df_counts, reward.df_counts)
    assert blocks.score(ids_of(cands), np.array(images)).tolist() == expected


def test_the_reward_equals_the_metric_on_the_same_captions():
    """Same captions, same document frequencies (the references' images), same tokens: the
    token-id CIDEr-D of SCST is the evaluation's, to rounding (a caption's n-grams are summed
    in key order there, in first-occurrence order here)."""
    docs = corpus()
    refs = [c for doc in docs for c in doc]
    groups = np.array([i for i, doc in enumerate(docs) for _ in doc])
    reward = TokenCiderD(ids_of(refs), groups, V, STOPS)
    evaluation = CiderD(docs)
    cands, images = candidates(docs)
    got = reward.score(ids_of(cands), np.array(images))
    expected = [evaluation.score(c, docs[i]) for c, i in zip(cands, images, strict=True)]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert got[-5] > 1.0 and got[-4] == 0.0  # a reference itself scores high, the empty one 0
    # a caption that hit max_len (no eos) ends where its row ends
    no_eos = reward.score(ids_of(cands[:5], width=14, eos=False), np.array(images[:5]))
    np.testing.assert_allclose(no_eos, expected[:5], rtol=1e-12, atol=1e-12)


def test_both_forms_are_pycocoevalcaps_cider():
    """pycocoevalcap's Cider with the scored images' references as the corpus: the metric on
    the words, the reward on the ids as strings (ruotianluo/ImageCaptioning.pytorch's way)."""
    docs = corpus(n_images=12, seed=4)
    cands, _ = candidates(docs, count=12, seed=5)
    cands, images = cands[:12], list(range(12))  # one candidate an image, every image scored
    gts = {i: docs[i] for i in images}
    _, expected = Cider().compute_score(gts, {i: [c] for i, c in zip(images, cands, strict=True)})
    metric = CiderD(gts.values())
    assert [metric.score(c, docs[i]) for c, i in zip(cands, images, strict=True)] == (
        pytest.approx(list(expected), rel=1e-12)
    )
    refs = [c for i in images for c in docs[i]]
    groups = np.array([i for i in images for _ in docs[i]])
    reward = TokenCiderD(ids_of(refs), groups, V, STOPS).score(ids_of(cands), np.array(images))
    assert reward.tolist() == pytest.approx(list(expected), rel=1e-12)


def test_an_end_token_is_one_argument():
    """`end=EOS`: the end token is a word of every candidate and reference and counts in the
    document frequencies, as ruotianluo/ImageCaptioning.pytorch scores (the metric on the
    captions with the end id appended)."""
    docs = corpus(seed=6)
    refs = [c for doc in docs for c in doc]
    groups = np.array([i for i, doc in enumerate(docs) for _ in doc])
    cands, images = candidates(docs, seed=7)
    with_end = TokenCiderD(ids_of(refs), groups, V, STOPS, end=EOS)
    got = with_end.score(ids_of(cands), np.array(images))
    id_docs = [[f"{as_ids(c)} {EOS}" for c in doc] for doc in docs]
    metric = CiderD(id_docs)
    scored = list(zip(cands, images, strict=True))
    expected = [metric.score(f"{as_ids(c)} {EOS}", id_docs[i]) for c, i in scored]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    without = TokenCiderD(ids_of(refs), groups, V, STOPS).score(ids_of(cands), np.array(images))
    assert (got != without).any()
    # a row cut at max_len has no end token to count
    cut = with_end.score(ids_of(cands[:5], width=14, eos=False), np.array(images[:5]))
    plain = [metric.score(as_ids(c), id_docs[i]) for c, i in scored[:5]]
    np.testing.assert_allclose(cut, plain, rtol=1e-12, atol=1e-12)


def test_cider_d_needs_two_documents_known_images_and_int64_keys():
    with pytest.raises(DistinctcapError, match="at least 2 images"):
        TokenCiderD(ids_of(["a dog", "the dog"]), np.array([0, 0]), 20, STOPS)
    with pytest.raises(DistinctcapError, match="at least 2 images"):
        CiderD([["a dog", "the dog"]])
    reward = TokenCiderD(ids_of(["a dog", "a cat"]), np.array([0, 2]), 20, STOPS)
    with pytest.raises(DistinctcapError, match="no reference"):
        reward.score(ids_of(["a dog"]), np.array([1]))
    with pytest.raises(DistinctcapError, match="no reference"):
        reward.score(ids_of(["a dog"]), np.array([3]))
    with pytest.raises(DistinctcapError, match="does not fit"):
        TokenCiderD(ids_of(["a dog", "a cat"]), np.array([0, 1]), 60_000, STOPS)
    with pytest.raises(DistinctcapError, match="at least one reference"):
        CiderD([["a dog"], ["a cat"]]).score("a dog", [])


@pytest.mark.parametrize("chunk", [1, 7, 8192])
def test_packed_document_frequencies_are_the_counter_of_word_tuples(chunk, monkeypatch):
    monkeypatch.setattr(frequencies, "CHUNK_DOCUMENTS", chunk)
    docs = corpus(60, seed=4) + [[], ["dog"], ["dog dog", "dog"]]  # an empty document, repeats
    expected = Counter(g for doc in docs for g in document_ngrams(doc, 4))
    df = DocumentFrequencies(docs, 4)
    assert df.counter is None and df.as_counter() == expected
    grams = [*expected, ("unicorn",), ("red", "unicorn"), ("a",) * 5]
    assert df.of(grams).tolist() == [expected.get(g, 0) for g in grams]
    # n ids that do not fit 63 bits keep the Counter, with the same counts
    wide = DocumentFrequencies(docs, 20)
    assert wide.counter is not None
    assert wide.of(grams).tolist() == [wide.counter.get(g, 0) for g in grams]


def test_document_frequencies_streamed_in_parts_are_those_of_the_whole_corpus():
    """The training captions stream in a part at a time (evaluate.metrics.training): each
    part's new words never re-key the table, a part that takes the vocabulary past the packed
    base turns it into the Counter, and a scorer on the streamed counts scores as one built on
    the whole list."""
    docs = [["dog dog", "dog"]] + corpus(60, seed=4) + [[]]
    whole, wide_whole = DocumentFrequencies(docs, 4), DocumentFrequencies(docs, 20)
    streamed, wide = DocumentFrequencies(n=4), DocumentFrequencies(n=20)
    bounds = [0, 1, 8, 30, 61, len(docs)]  # uneven parts, the last with the empty document
    for a, b in itertools.pairwise(bounds):
        for df in (streamed, wide):
            df.add(docs[a:b])
        assert (wide.counter is None) == (b == 1)  # packed until the words pass base 8
    assert wide.counter is not None and wide.counter == wide_whole.counter
    assert streamed.counter is None and streamed.documents == len(docs) == whole.documents
    assert streamed.keys.tolist() == whole.keys.tolist()
    assert streamed.counts.tolist() == whole.counts.tolist()
    assert streamed.base == frequencies.packable_base(4) and streamed.base**4 < 2**63
    assert (streamed.base + 1) ** 4 >= 2**63
    cands, images = candidates(docs[1:-1])
    refs = [docs[1 + i] for i in images]
    expected = CiderD(docs).score_each(cands, refs).tolist()
    assert CiderD(streamed).score_each(cands, refs).tolist() == expected


def test_document_frequencies_take_16_bytes_an_ngram():
    """COCO's 591,753 training captions hold millions of distinct n-grams: a Counter of word
    tuples took ~140 bytes each (1.3 GB in an evaluate job at COCO's size)."""
    import tracemalloc

    rng = random.Random(9)
    words = [f"w{i}" for i in range(3000)]
    docs = [[" ".join(rng.choices(words, k=10)) for _ in range(5)] for _ in range(2000)]
    tracemalloc.start()
    df = DocumentFrequencies(docs, 4)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(df.keys) > 150_000 and held / len(df.keys) < 24
