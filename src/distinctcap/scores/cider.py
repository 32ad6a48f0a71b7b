"""CIDEr-D (Vedantam et al. 2015, §3 eq. 2-5 with the D changes of §3.4), written once: the
evaluation's metric, SelfCIDEr's kernel, CIDEr checkpoint selection and the reward of
self-critical training all score with this module.

The definition is pycocoevalcap's CIDEr-D (its `Cider`, cider/cider_scorer.py: `precook`,
`counts2vec`, `sim`, `compute_cider`; Gaussian length penalty sigma = 6, clipped n-gram
counts, x10):

    g_k(s)        = tf_k(s) * (log |D| - log max(1, df_k))             tf-idf of n-gram k (eq. 2)
    sim_n(c, r)   = sum_k min(g_k(c), g_k(r)) g_k(r) / (|g_n(c)| |g_n(r)|)   (a 0 norm: no division)
                    * exp(-(l(c) - l(r))^2 / (2 sigma^2))                l = number of bigrams
    CIDEr-D(c, R) = 10 * mean_{r in R} mean_{n=1..4} sim_n(c, r)

df_k counts the documents (images) whose captions hold n-gram k, once per document.
pycocoevalcap takes the documents from the references of the call it scores; here the caller
chooses them (the scored images' references, the training captions, ...).

Captions come in two forms, each only listing its n-grams (`Grams`); the tf-idf vectors, the
clipped overlaps, the length penalty and the means are `CiderDCore`'s, one code for both:
- `CiderD`: whitespace-tokenised (PTB-tokenised) sentences: the metric, SelfCIDEr's kernel
  and CIDEr selection, each sentence's vector computed once per scorer;
- `TokenCiderD`: rows of token ids grouped by image: the SCST reward, as
  ruotianluo/ImageCaptioning.pytorch scores its samples (its CiderD on the id strings),
  vectorised (numpy sorts and searches, no Python loop over captions).

Float order: every sum runs left to right (np.bincount adds its weights in order) over a
caption's n-grams in the order its `Grams` list them: first occurrence for sentences
(pycocoevalcap's `precook` order), key order for token ids (the reward's order since it was
written); log, exp and sqrt are correctly rounded (math's, once per distinct argument, and
numpy's sqrt). Each value is that of CIDEr-D computed one pair at a time in plain Python in
this order to the last digit (tests/test_scores.py); the two forms, and pycocoevalcap (which
sums the orders over the references first and takes np.e ** x), agree to ~1e-15.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from distinctcap.core.errors import DistinctcapError
from distinctcap.scores.frequencies import (
    NEVER,
    DocumentFrequencies,
    counts_of,
    distinct_sorted,
    starts,
)

ORDERS = 4  # n = 1..4 (pycocoevalcap's n)
SIGMA = 6.0  # the length penalty's sigma (CIDEr-D, §3.4)
BLOCK_TERMS = 1 << 22  # clipped-overlap terms one numpy block holds at most (~32 MB an array)
DF_BLOCK = 1 << 16  # references whose n-grams TokenCiderD's document frequencies count at a time


@dataclass
class Grams:
    """The distinct n-grams of R captions: one entry per (caption, n-gram), grouped by caption
    (`row` ascending), each caption's in the order its sums run (module doc). `key` < `size`
    names the n-gram, the same in every caption of one `Grams`."""

    row: np.ndarray  # (E,) int64
    key: np.ndarray  # (E,) int64
    order: np.ndarray  # (E,) int64: the n-gram's length - 1
    tf: np.ndarray  # (E,) int64: its occurrences in the caption
    bigrams: np.ndarray  # (R,) int64: the caption's length for the penalty
    size: int


@dataclass
class Vectors:
    """tf-idf vectors of R captions: each entry's weight g_k and each caption's norm per order."""

    grams: Grams
    weight: np.ndarray  # (E,) float64
    norm: np.ndarray  # (R, n) float64


class CiderDCore:
    """The arithmetic of CIDEr-D over `Grams`, whatever the captions are made of."""

    def __init__(self, documents: int, n: int = ORDERS, sigma: float = SIGMA):
        if documents < 2:
            raise DistinctcapError(
                f"CIDEr-D needs a document-frequency corpus of at least 2 images, got "
                f"{documents}: with one document every n-gram has idf 0"
            )
        self.n, self.sigma = n, sigma
        self.log_docs = math.log(documents)

    def idf(self, df: np.ndarray) -> np.ndarray:
        """log |D| - log max(1, df) of document frequencies df, float64."""
        values, where = _dense(np.maximum(df, 1))
        table = [self.log_docs - math.log(v) for v in values.tolist()]
        return np.array(table, float)[where]

    def penalties(self, delta: np.ndarray) -> np.ndarray:
        """exp(-delta^2 / (2 sigma^2)) of differences of bigram counts, float64."""
        values, where = _dense(delta)
        table = [math.exp(-(d**2) / (2 * self.sigma**2)) for d in values.tolist()]
        return np.array(table, float)[where]

    def vectors(self, grams: Grams, df: np.ndarray) -> Vectors:
        """tf-idf vectors of the captions of `grams`; df (E,): each entry's document frequency."""
        weight = grams.tf * self.idf(df)
        rows = len(grams.bigrams)
        squares = np.bincount(grams.row * self.n + grams.order, weight * weight, rows * self.n)
        return Vectors(grams, weight, np.sqrt(squares).reshape(rows, self.n))

    def pair_scores(self, vec: Vectors, cand: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """CIDEr-D (x10) of caption cand[i] against the one reference ref[i] (rows of vec): (P,)."""
        val = self._overlaps(vec, cand, ref)
        norm_c, norm_r = vec.norm[cand], vec.norm[ref]
        np.divide(val, norm_c * norm_r, out=val, where=(norm_c != 0) & (norm_r != 0))
        penalty = self.penalties(vec.grams.bigrams[cand] - vec.grams.bigrams[ref])
        total = np.zeros(len(cand))
        for k in range(self.n):
            total = total + val[:, k] * penalty
        return 10.0 * total / self.n

    @staticmethod
    def means(per_pair: np.ndarray, cand: np.ndarray, candidates: int) -> np.ndarray:
        """CIDEr-D of each candidate against its references: the mean of its pairs' scores, (C,)."""
        total = np.bincount(cand, per_pair, candidates)
        return total / np.bincount(cand, minlength=candidates)

    def _overlaps(self, vec: Vectors, cand: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """sum_k min(g_k(c), g_k(r)) g_k(r) per order of each pair (P, n): each n-gram of the
        candidate looked up in the reference, in the candidate's order, a block at a time."""
        grams = vec.grams
        lookup = grams.row * grams.size + grams.key
        sort = np.argsort(lookup, kind="stable")
        table = np.append(lookup[sort], NEVER)
        table_weight = np.append(vec.weight[sort], 0.0)
        count = np.bincount(grams.row, minlength=len(grams.bigrams))
        start = np.cumsum(count) - count
        out = np.empty((len(cand), self.n))
        for a, b in _blocks(count[cand], BLOCK_TERMS):
            terms = count[cand[a:b]]
            pair = np.repeat(np.arange(b - a), terms)
            entry = np.repeat(start[cand[a:b]], terms) + _offsets(terms)
            query = ref[a:b][pair] * grams.size + grams.key[entry]
            pos = np.searchsorted(table, query)
            w_ref = np.where(table[pos] == query, table_weight[pos], 0.0)
            clipped = np.minimum(vec.weight[entry], w_ref) * w_ref
            slots = pair * self.n + grams.order[entry]
            out[a:b] = np.bincount(slots, clipped, (b - a) * self.n).reshape(b - a, self.n)
        return out


# ------------------------------------------------------------------ sentences


def ngram_counts(sentence: str, n: int = ORDERS) -> Counter[tuple[str, ...]]:
    """Counts of every 1..n-gram of a whitespace-tokenised sentence (pycocoevalcap `precook`)."""
    words = sentence.split()
    return Counter(
        tuple(words[i : i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1)
    )


# Sentence vectors a scorer keeps between calls. An evaluate job's session-long training scorer
# saw every sample of every decoding: 100 samples of 999 images were 125,000 sentences and
# 3.4 million n-gram keys, +830 MB that stayed (issue 55).
MEMO_SENTENCES = 20_000


class _Keys(dict):
    """n-gram -> its key: the next integer for an n-gram not seen before."""

    def __missing__(self, gram: tuple[str, ...]) -> int:
        key = self[gram] = len(self)
        return key


class CiderD(CiderDCore):
    """CIDEr-D of whitespace-tokenised sentences (module doc).

    `documents` is the document-frequency corpus: one document per image, the set of its
    captions (pycocoevalcap uses the references of the scored images), or its frequencies
    already counted (a `DocumentFrequencies`, e.g. of documents that streamed by, whose `n` is
    then the scorer's). An n-gram found in every document weighs 0. `score` is pycocoevalcap's
    `Cider` (sigma = 6) with the same document frequencies, to rounding.
    """

    def __init__(
        self,
        documents: Iterable[Sequence[str]] | DocumentFrequencies,
        n: int = ORDERS,
        sigma: float = SIGMA,
    ):
        if not isinstance(documents, DocumentFrequencies):
            documents = DocumentFrequencies(list(documents), n)
        super().__init__(documents.documents, documents.n, sigma)
        self.df = documents
        self._keys = _Keys()  # n-gram -> its key in every `Grams`
        self._cache: dict[str, tuple[np.ndarray, ...]] = {}  # sentence -> its vector's parts

    def pair(self, candidate: str, reference: str) -> float:
        """CIDEr-D of one candidate against one reference (already x10)."""
        return float(self.pair_matrix([candidate], [reference])[0, 0])

    def score(self, candidate: str, references: Sequence[str]) -> float:
        """CIDEr-D of a candidate against its references: the mean of `pair` over them."""
        return float(self.score_each([candidate], [references])[0])

    def scores(self, candidates: Sequence[str], references: Sequence[str]) -> np.ndarray:
        """[self.score(c, references) for c in candidates]: (C,)."""
        return self.score_each(candidates, [references] * len(candidates))

    def score_each(
        self, candidates: Sequence[str], references: Sequence[Sequence[str]]
    ) -> np.ndarray:
        """[self.score(c, refs) for c, refs in zip(candidates, references)] in one pass: (C,)."""
        if len(candidates) != len(references):
            raise DistinctcapError(
                f"CIDEr-D: {len(candidates)} candidates but {len(references)} reference lists"
            )
        for candidate, refs in zip(candidates, references, strict=True):
            if not len(refs):
                raise DistinctcapError(f"CIDEr-D of {candidate!r} needs at least one reference")
        if not len(candidates):
            return np.zeros(0)
        flat = [r for refs in references for r in refs]
        cand = np.repeat(np.arange(len(candidates)), [len(refs) for refs in references])
        per_pair = self._pair_scores([candidates[i] for i in cand], flat)
        return self.means(per_pair, cand, len(candidates))

    def pair_matrix(self, candidates: Sequence[str], references: Sequence[str]) -> np.ndarray:
        """[[self.pair(c, r) for r in references] for c in candidates]: (C, R)."""
        if not len(candidates) or not len(references):
            return np.zeros((len(candidates), len(references)))
        cands = [c for c in candidates for _ in references]
        pairs = self._pair_scores(cands, list(references) * len(candidates))
        return pairs.reshape(len(candidates), len(references))

    def _pair_scores(self, candidates: list[str], references: list[str]) -> np.ndarray:
        """`pair` of candidates[i] and references[i], (P,): each distinct sentence once."""
        rows = {s: i for i, s in enumerate(dict.fromkeys([*candidates, *references]))}
        cand = np.array([rows[c] for c in candidates], np.int64)
        ref = np.array([rows[r] for r in references], np.int64)
        return self.pair_scores(self._vectors(list(rows)), cand, ref)

    def _vectors(self, sentences: list[str]) -> Vectors:
        """The vectors of distinct sentences, from each one's cached parts. The memo starts
        afresh (keys and all) where it would pass MEMO_SENTENCES: a key's number only matches
        n-grams within one call, so the scores are the same."""
        new = [s for s in sentences if s not in self._cache]
        if new and len(self._cache) + len(new) > MEMO_SENTENCES:
            self._keys, self._cache, new = _Keys(), {}, sentences
        self._remember(new)
        parts = [self._cache[s] for s in sentences]
        key, order, tf, weight, norm, bigrams = zip(*parts, strict=True)
        row = np.repeat(np.arange(len(parts)), [len(k) for k in key])
        grams = Grams(row, *map(np.concatenate, (key, order, tf)), np.array(bigrams, np.int64),
                      len(self._keys))  # fmt: skip
        return Vectors(grams, np.concatenate(weight), np.array(norm).reshape(-1, self.n))

    def _remember(self, sentences: list[str]) -> None:
        """Compute and cache the tf-idf vectors of new sentences, all in one `vectors` call."""
        if not sentences:
            return
        counts = [ngram_counts(s, self.n) for s in sentences]
        sizes = [len(c) for c in counts]
        grams = list(itertools.chain.from_iterable(counts))

        def ints(values: Iterable[int]) -> np.ndarray:  # per n-gram, looked up in C
            return np.fromiter(values, np.int64, len(grams))

        keys = ints(map(self._keys.__getitem__, grams))
        order = ints(map(len, grams)) - 1
        tf = ints(itertools.chain.from_iterable(c.values() for c in counts))
        df = self.df.of(grams)
        bigrams = np.array([max(len(s.split()) - 1, 0) for s in sentences], np.int64)
        row = np.repeat(np.arange(len(sentences)), sizes)
        vec = self.vectors(Grams(row, keys, order, tf, bigrams, len(self._keys)), df)
        ends = np.cumsum(sizes)
        for i, (s, a, b) in enumerate(zip(sentences, ends - sizes, ends, strict=True)):
            parts = (keys[a:b], order[a:b], tf[a:b], vec.weight[a:b], vec.norm[i], bigrams[i])
            self._cache[s] = parts


# ------------------------------------------------------------------ token ids


def token_lengths(ids: np.ndarray, stops: Sequence[int], end: int | None = None) -> np.ndarray:
    """Words of each row of ids (R, T): its tokens before the first stop id (eos, pad), (R,).

    `end`: an id that counts as the caption's last word where it ends it, as
    ruotianluo/ImageCaptioning.pytorch counts its end token 0 (`array_to_str`) in candidates
    and references (so in the document frequencies too); None: the caption ends before it.
    """
    ids = np.asarray(ids)
    is_tok = ~np.isin(ids, stops)
    lengths = np.where(is_tok.all(axis=1), ids.shape[1], np.argmin(is_tok, axis=1))
    if end is not None and ids.shape[1]:
        at = ids[np.arange(len(ids)), np.minimum(lengths, ids.shape[1] - 1)]
        lengths = lengths + ((lengths < ids.shape[1]) & (at == end))
    return lengths.astype(np.int64)


def ngram_keys(ids: np.ndarray, lengths: np.ndarray, base: int, last: int, first: int = 1):
    """Every `first`..`last`-gram of each row of ids (R, T) within its first `lengths`
    tokens: (row (E,), key (E,), order (E,) in 0..last-1), one entry per occurrence.

    An n-gram's key is the int64 `(((t1 * base) + t2) * base + t3) ...` of its ids (all >= 1
    within a caption, so keys of different orders never collide)."""
    rows, keys, orders = [], [], []
    r, t = ids.shape
    key = np.zeros((r, t), dtype=np.int64)
    for k in range(1, min(last, t) + 1):
        key = key[:, : t - k + 1] * base + ids[:, k - 1 :]  # the k-gram starting at each position
        if k < first:
            continue
        row, pos = np.nonzero(np.arange(t - k + 1)[None, :] + k <= lengths[:, None])
        rows.append(row)
        keys.append(key[row, pos])
        orders.append(np.full_like(row, k - 1))
    if not rows:
        return (np.zeros(0, np.int64),) * 3
    return np.concatenate(rows), np.concatenate(keys), np.concatenate(orders)


class TokenCiderD(CiderDCore):
    """CIDEr-D of token-id captions against the references of their image: the SCST reward as
    ruotianluo/ImageCaptioning.pytorch computes it (rewards.py, `get_self_critical_reward`:
    the CiderD of its pyciderevalcap on the id strings, document frequencies of the training
    captions), vectorised.

    refs (C, T): the references' ids (stop ids after the tokens), groups (C,): each
    reference's image (any int >= 0, e.g. its feature row), one document each; vocab_size V:
    ids are < V; stops: the ids that end a caption; `end`: see `token_lengths`.
    `score(candidates, groups)` -> (N,) float64: candidate i against every reference of image
    groups[i]."""

    def __init__(self, refs: np.ndarray, groups: np.ndarray, vocab_size: int,
                 stops: Sequence[int], end: int | None = None, n: int = ORDERS,
                 sigma: float = SIGMA):  # fmt: skip
        if vocab_size**n >= 2**63:
            raise DistinctcapError(
                f"CIDEr-D: a vocabulary of {vocab_size} ids does not fit a {n}-gram in int64"
            )
        refs, groups = np.asarray(refs), np.asarray(groups, np.int64)
        if not np.issubdtype(refs.dtype, np.integer):
            raise DistinctcapError(f"CIDEr-D: reference ids are {refs.dtype}, not integers")
        self.base, self.stops, self.end = vocab_size, tuple(stops), end
        order = np.argsort(groups, kind="stable")
        self.refs = refs[order]  # their own width of int: 590,855 COCO references (issue 55)
        self.ref_lengths = token_lengths(self.refs, self.stops, end)
        self.ref_count = np.bincount(groups)
        self.ref_start = np.cumsum(self.ref_count) - self.ref_count
        super().__init__(int((self.ref_count > 0).sum()), n, sigma)
        self.df_keys, self.df_counts = self._document_frequencies(groups[order])

    def _document_frequencies(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sorted n-gram keys (ending in `NEVER`) and the number of images whose references
        hold each, one order and one block of whole images' references (about DF_BLOCK) at a
        time, so the memory is a block's n-grams: over COCO's 590,855 references at once, an
        SCST job peaked 1,963 MB against 1,039 at 10,000 images (issue 55)."""
        if not len(groups):
            return np.array([NEVER], np.int64), np.zeros(1, np.int64)
        first_refs = np.flatnonzero(starts(groups))  # each image's first reference
        at = np.searchsorted(first_refs, np.arange(0, len(groups), DF_BLOCK))
        bounds = np.append(np.unique(first_refs[np.minimum(at, len(first_refs) - 1)]), len(groups))
        keys, counts = [], []
        for k in range(1, self.n + 1):
            for a, b in itertools.pairwise(bounds):
                grams, df = self._block_frequencies(groups[a:b], slice(a, b), k)
                keys.append(grams)
                counts.append(df)
        keys_all, counts_all = np.concatenate(keys), np.concatenate(counts)
        grams, inverse = np.unique(keys_all, return_inverse=True)  # blocks share n-grams
        df = np.bincount(inverse, weights=counts_all, minlength=len(grams)).astype(np.int64)
        return np.append(grams, NEVER), np.append(df, 0)

    def _block_frequencies(
        self, groups: np.ndarray, refs: slice, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k-grams of references `refs` (whole images', `groups` theirs) and the number
        of images whose references hold each."""
        row, key, _ = ngram_keys(self.refs[refs], self.ref_lengths[refs], self.base, k, k)
        by_gram = np.argsort(key, kind="stable")  # each n-gram's occurrences by image
        key, image = key[by_gram], groups[row[by_gram]]
        first = starts(key) | starts(image)  # of a run of one (n-gram, image)
        return distinct_sorted(key[first], counts=True)

    def document_frequency(self, keys: np.ndarray) -> np.ndarray:
        """df of n-gram keys (G,), 0 for one no reference holds."""
        return counts_of(self.df_keys, self.df_counts, keys)

    def grams(self, ids: np.ndarray, lengths: np.ndarray) -> tuple[Grams, np.ndarray]:
        """The n-grams of rows ids (R, T), in key order, and the key of each of `Grams.key`."""
        row, key, order = ngram_keys(ids, lengths, self.base, self.n)
        distinct, dense = _dense(key)
        size = max(len(distinct), 1)
        entry, tf = distinct_sorted(row * size + dense, counts=True)
        gram_order = np.zeros(len(distinct), np.int64)
        gram_order[dense] = order
        key_e = entry % size
        bigrams = np.maximum(lengths - 1, 0)
        return Grams(entry // size, key_e, gram_order[key_e], tf, bigrams, size), distinct

    def score(self, candidates: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """CIDEr-D of each candidate row (N, T) against the references of image groups[i]."""
        candidates, groups = np.asarray(candidates, np.int64), np.asarray(groups, np.int64)
        known = self.ref_count[np.minimum(groups, len(self.ref_count) - 1)] > 0
        if len(groups) and (groups.max() >= len(self.ref_count) or not known.all()):
            raise DistinctcapError("CIDEr-D: a candidate's image has no reference")
        n = len(candidates)
        images, local = _dense(groups)
        ref_rows = _ranges(self.ref_start[images], self.ref_count[images])
        refs = self.refs[ref_rows]
        width = max(candidates.shape[1], refs.shape[1])
        ids = np.concatenate([_pad(candidates, width), _pad(refs, width)])
        lengths = np.concatenate(
            [token_lengths(candidates, self.stops, self.end), self.ref_lengths[ref_rows]]
        )
        grams, keys = self.grams(ids, lengths)
        vec = self.vectors(grams, self.document_frequency(keys)[grams.key])
        # pairs: candidate i with each reference of its image (rows n.. of ids)
        per_image = self.ref_count[images]
        count = per_image[local]
        cand = np.repeat(np.arange(n), count)
        ref = (n + np.cumsum(per_image) - per_image)[local][cand] + _offsets(count)
        return self.means(self.pair_scores(vec, cand, ref), cand, n)


# ------------------------------------------------------------------ index helpers


def _dense(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct values of an int array and the index of each element's among them."""
    values = distinct_sorted(x)
    return values, np.searchsorted(values, x)


def _offsets(count: np.ndarray) -> np.ndarray:
    """cat(arange(c) for c in count)."""
    starts = np.cumsum(count) - count
    return np.arange(int(count.sum())) - np.repeat(starts, count)


def _ranges(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """cat(arange(s, s + c) for s, c in zip(start, count))."""
    return np.repeat(start, count) + _offsets(count)


def _pad(ids: np.ndarray, width: int) -> np.ndarray:
    """ids (R, T) padded with zeros to width columns (read only up to each row's length)."""
    return np.pad(ids, ((0, 0), (0, width - ids.shape[1])))


def _blocks(terms: np.ndarray, limit: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive pairs holding at most `limit` terms (one pair at least)."""
    ends = np.cumsum(terms)
    a = 0
    while a < len(terms):
        done = int(ends[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(ends, done + limit, side="right")))
        yield a, b
        a = b
