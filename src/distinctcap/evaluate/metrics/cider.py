"""CIDEr-D with explicit document frequencies, numerically equal to pycocoevalcap's `Cider`.

pycocoevalcap computes the document frequencies from the references of the very call it scores
and recomputes every reference vector for every (candidate, reference) pair. SelfCIDEr, oracle
scoring and consensus re-ranking need the same CIDEr-D with a document-frequency corpus chosen
by the caller and many pairs, so this module separates the two and caches sentence vectors.
Inputs are whitespace-tokenised (PTB-tokenised) strings.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from distinctcap.core.errors import DistinctcapError

Vector = tuple[list[dict[tuple[str, ...], float]], list[float], int]


def ngram_counts(sentence: str, n: int = 4) -> Counter[tuple[str, ...]]:
    """Counts of every 1..n-gram of a whitespace-tokenised sentence (pycocoevalcap `precook`)."""
    words = sentence.split()
    return Counter(
        tuple(words[i : i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1)
    )


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
        self.df: Counter[tuple[str, ...]] = Counter()
        count = 0
        for doc in documents:
            count += 1
            self.df.update({g for sentence in doc for g in ngram_counts(sentence, n)})
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
