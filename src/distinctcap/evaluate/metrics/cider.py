"""CIDEr-D with explicit document frequencies, numerically equal to pycocoevalcap's `Cider`.

pycocoevalcap computes the document frequencies from the references of the very call it scores
and recomputes every reference vector for every (candidate, reference) pair. SelfCIDEr, oracle
scoring and consensus re-ranking need the same CIDEr-D with a document-frequency corpus chosen
by the caller and many pairs, so this module separates the two and caches sentence vectors.
Inputs are whitespace-tokenised (PTB-tokenised) strings. `pair_matrix` and `scores` score many
pairs at once with numpy, adding the same floats in the same order as `pair`, so every value
is `pair`'s to the last digit.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from distinctcap.core.errors import DistinctcapError

# n-gram overlap terms one numpy block holds at most in `pair_matrix` (~32 MB)
BLOCK_TERMS = 1 << 22
Vector = tuple[list[dict[tuple[str, ...], float]], list[float], int]


def ngram_counts(sentence: str, n: int = 4) -> Counter[tuple[str, ...]]:
    """Counts of every 1..n-gram of a whitespace-tokenised sentence (pycocoevalcap `precook`)."""
    words = sentence.split()
    return Counter(
        tuple(words[i : i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1)
    )


def document_ngrams(captions: Sequence[str], n: int = 4) -> set[tuple[str, ...]]:
    """The set of 1..n-grams of a document's (an image's) captions: what its document
    frequency counts once."""
    grams: set[tuple[str, ...]] = set()
    for sentence in captions:
        words = sentence.split()
        for k in range(1, n + 1):
            grams.update(zip(*(words[i:] for i in range(k)), strict=False))  # shifted views
    return grams


class CiderD:
    """CIDEr-D (Vedantam et al. 2015): tf-idf n-gram cosine with clipping and length penalty.

    `documents` is the document-frequency corpus: one document per image, the set of its
    captions (pycocoevalcap uses the references of the scored images). An n-gram's weight is
    tf * (log |documents| - log max(1, df)), so an n-gram found in every document weighs 0.
    Score of a candidate against references = 10 * mean over refs of mean over n of the
    clipped, length-penalised cosine, exactly as pycocoevalcap's CiderScorer (sigma = 6).
    """

    def __init__(self, documents: Iterable[Sequence[str]], n: int = 4, sigma: float = 6.0):
        self.n, self.sigma = n, sigma
        documents = list(documents)
        grams = itertools.chain.from_iterable(document_ngrams(doc, n) for doc in documents)
        self.df: Counter[tuple[str, ...]] = Counter(grams)  # counted in C
        count = len(documents)
        if count < 2:
            raise DistinctcapError(
                f"CIDEr-D needs a document-frequency corpus of at least 2 images, got {count}: "
                "with one document every n-gram has idf 0"
            )
        self.log_docs = math.log(count)
        self._cache: dict[str, Vector] = {}

    def vector(self, sentence: str) -> Vector:
        """tf-idf vector per n-gram order, its norms, and the length used by the penalty.

        The length is the number of bigrams, as in pycocoevalcap (its `n == 1` test), which
        only matters through length differences.
        """
        if sentence not in self._cache:
            vec: list[dict[tuple[str, ...], float]] = [{} for _ in range(self.n)]
            norm = [0.0] * self.n
            length = 0
            for gram, tf in ngram_counts(sentence, self.n).items():
                w = tf * (self.log_docs - math.log(max(1.0, self.df[gram])))
                vec[len(gram) - 1][gram] = w
                norm[len(gram) - 1] += w * w
                length += tf if len(gram) == 2 else 0
            self._cache[sentence] = (vec, [math.sqrt(x) for x in norm], length)
        return self._cache[sentence]

    def pair(self, candidate: str, reference: str) -> float:
        """CIDEr-D of one candidate against one reference (already x10)."""
        vec_h, norm_h, len_h = self.vector(candidate)
        vec_r, norm_r, len_r = self.vector(reference)
        penalty = math.exp(-((len_h - len_r) ** 2) / (2 * self.sigma**2))
        total = 0.0
        for k in range(self.n):
            ref_k, val = vec_r[k], 0.0
            for gram, w in vec_h[k].items():
                r = ref_k.get(gram)
                if r:  # clipped overlap min(w_hyp, w_ref) * w_ref
                    val += min(w, r) * r
            if norm_h[k] != 0 and norm_r[k] != 0:
                val /= norm_h[k] * norm_r[k]
            total += val * penalty
        return 10.0 * total / self.n

    def score(self, candidate: str, references: Sequence[str]) -> float:
        """CIDEr-D of a candidate against its references: the mean of `pair` over them."""
        if not references:
            raise DistinctcapError(f"CIDEr-D of {candidate!r} needs at least one reference")
        return sum(self.pair(candidate, r) for r in references) / len(references)

    def scores(self, candidates: Sequence[str], references: Sequence[str]) -> np.ndarray:
        """[self.score(c, references) for c in candidates], from one `pair_matrix`: each row
        summed left to right (as `sum` does), so the floats are `score`'s exactly."""
        if not references:
            raise DistinctcapError(f"CIDEr-D of {candidates[:1]!r} needs at least one reference")
        pairs = self.pair_matrix(candidates, references)
        return np.add.accumulate(pairs, axis=1)[:, -1] / len(references)

    def pair_matrix(self, candidates: Sequence[str], references: Sequence[str]) -> np.ndarray:
        """[[self.pair(c, r) for r in references] for c in candidates] without a Python loop
        per pair: the same products, sums in the candidate's n-gram order (np.add.accumulate
        is sequential; a gram the reference lacks adds an exact 0.0 where `pair` skips it)
        and the same divisions, so every entry equals `pair`'s float."""
        cands = [self.vector(c) for c in candidates]
        refs = [self.vector(r) for r in references]
        total = np.zeros((len(cands), len(refs)))
        if not cands or not refs:
            return total
        penalty = self._penalties([v[2] for v in cands], [v[2] for v in refs])
        for k in range(self.n):
            val = self._overlaps([v[0][k] for v in cands], [v[0][k] for v in refs])
            norm_c = np.array([v[1][k] for v in cands])
            norm_r = np.array([v[1][k] for v in refs])
            both = (norm_c != 0)[:, None] & (norm_r != 0)[None, :]
            np.divide(val, norm_c[:, None] * norm_r[None, :], out=val, where=both)
            total = total + val * penalty
        return 10.0 * total / self.n

    def _penalties(self, len_c: list[int], len_r: list[int]) -> np.ndarray:
        """`pair`'s length penalty of every (candidate, reference), by math.exp itself (numpy's
        exp may differ in the last bit), once per distinct length difference."""
        diff = np.subtract.outer(np.asarray(len_c), np.asarray(len_r))
        values, where = np.unique(diff, return_inverse=True)
        table = np.array([math.exp(-(int(d) ** 2) / (2 * self.sigma**2)) for d in values])
        return table[where].reshape(diff.shape)

    @staticmethod
    def _overlaps(cands: list[dict], refs: list[dict]) -> np.ndarray:
        """sum over a candidate's grams, in its dict order, of min(w_c, w_r) * w_r: one
        n-gram order's clipped overlap of every (candidate, reference)."""
        columns: dict[tuple[str, ...], int] = {}
        for vec in refs:
            for gram in vec:
                columns.setdefault(gram, len(columns))
        absent = len(columns)  # an all-zero column: grams no reference has
        ref_w = np.zeros((len(refs), absent + 1))
        for j, vec in enumerate(refs):
            ref_w[j, [columns[g] for g in vec]] = list(vec.values())
        width = max(1, max(len(vec) for vec in cands))
        index = np.full((len(cands), width), absent)
        cand_w = np.zeros((len(cands), width))
        for i, vec in enumerate(cands):
            index[i, : len(vec)] = [columns.get(g, absent) for g in vec]
            cand_w[i, : len(vec)] = list(vec.values())
        by_ref = ref_w.T  # (columns, refs)
        out = np.empty((len(cands), len(refs)))
        step = max(1, BLOCK_TERMS // (len(refs) * width))
        for a in range(0, len(cands), step):
            r = by_ref[index[a : a + step].T]  # (width, block, refs)
            terms = np.minimum(cand_w[a : a + step].T[:, :, None], r) * r
            acc = out[a : a + step]
            acc[:] = terms[0]
            for term in terms[1:]:  # in the candidate's gram order, one gram at a time
                acc += term
        return out
