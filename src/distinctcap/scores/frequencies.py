"""CIDEr-D's document frequencies of whitespace-tokenised sentences, held compactly.

df_k counts the documents (images) whose captions hold n-gram k, once per document (CIDEr-D,
Vedantam et al. 2015, eq. 2; pycocoevalcap's `CiderScorer.compute_doc_freq`). An evaluation's
corpus is the training captions: 591,753 of them for COCO, some millions of distinct 1-4-grams.
A Counter of word tuples holds each in ~140 bytes (440 MB for 175,000 COCO-like captions); here
each n-gram is one int64 key (its words' ids packed base `base`, every id >= 1, so n-grams of
different lengths never share a key) in a sorted array beside its count: 12 bytes. Counting
goes a chunk of documents at a time (`add`), so the transient arrays are bounded by the chunk
and the documents themselves can stream in (evaluate.metrics.training: the training captions
are tokenised a part at a time, never held whole). The base is the largest whose n-th power
fits 63 bits, fixed before the first word is seen, so a chunk's new words never re-key the
table. The counts are exact either way; a vocabulary too large for n ids in 63 bits (a word id
reaching the base) turns the table into the Counter and goes on there.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import numpy as np

CHUNK_DOCUMENTS = 8192  # documents counted at a time
NEVER = np.iinfo(np.int64).max  # a lookup key no query reaches: ends every sorted table


class DocumentFrequencies:
    """df of every 1..n-gram of `documents` (each a sequence of sentences) and of those
    `add`ed after; `of(grams)`; `documents`: how many were counted."""

    def __init__(self, documents: Sequence[Sequence[str]] = (), n: int = 4):
        self.n = n
        self.words: dict[str, int] = {}  # word -> its id, in order of first appearance
        self.base = packable_base(n)
        self.counter: Counter[tuple[str, ...]] | None = None
        self.documents = 0
        self.keys = np.array([NEVER], np.int64)  # sorted, always ending in NEVER
        self.counts = np.zeros(1, np.int32)  # at most the documents
        for start in range(0, len(documents), CHUNK_DOCUMENTS):
            self.add(documents[start : start + CHUNK_DOCUMENTS])

    def add(self, documents: Sequence[Sequence[str]]) -> None:
        """Count a chunk of documents: the counts are those of all documents counted at once
        (each n-gram once per document, whatever the chunks)."""
        self.documents += len(documents)
        for sentence in itertools.chain.from_iterable(documents):
            for word in sentence.split():
                self.words.setdefault(word, len(self.words) + 1)
        if self.counter is None and len(self.words) >= self.base:  # an id no longer packs
            self.counter = self.as_counter()
            self.keys, self.counts = self.keys[-1:], self.counts[-1:]
        if self.counter is not None:
            for document in documents:
                self.counter.update(document_ngrams(document, self.n))
            return
        for start in range(0, len(documents), CHUNK_DOCUMENTS):
            keys, counts = self._count(documents[start : start + CHUNK_DOCUMENTS])
            self.keys, self.counts = merge_counts(self.keys, self.counts, keys, counts)

    def _count(self, documents: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """Sorted keys of the chunk's n-grams and how many of its documents hold each."""
        ids, caption_doc, lengths = [], [], []
        for d, document in enumerate(documents):
            for sentence in document:
                words = sentence.split()
                ids += [self.words[w] for w in words]
                caption_doc.append(d)
                lengths.append(len(words))
        flat = np.array(ids, np.int64)
        caption = np.repeat(np.arange(len(lengths)), lengths)
        doc = np.array(caption_doc, np.int64)[caption]
        keys, docs = [], []
        key = np.zeros(len(flat), np.int64)
        for k in range(1, self.n + 1):  # the k-gram starting at each position
            key = key[: len(flat) - k + 1] * self.base + flat[k - 1 :]
            within = caption[: len(key)] == caption[k - 1 :]
            keys.append(key[within])
            docs.append(doc[: len(key)][within])
        key, doc = np.concatenate(keys), np.concatenate(docs)
        order = np.lexsort((doc, key))
        key, doc = key[order], doc[order]
        first = starts(key) | starts(doc)  # of a run of one (n-gram, document)
        return distinct_sorted(key[first], counts=True)

    def of(self, grams: Sequence[tuple[str, ...]]) -> np.ndarray:
        """df of each n-gram (a tuple of words), 0 for one no document holds: (G,) int64."""
        if self.counter is not None:
            return np.fromiter(map(self.counter.get, grams, itertools.repeat(0)), np.int64,
                               len(grams))  # fmt: skip
        keys = np.fromiter(map(self._key, grams), np.int64, len(grams))
        return counts_of(self.keys, self.counts, keys).astype(np.int64)

    def _key(self, gram: tuple[str, ...]) -> int:
        """The n-gram's key, -1 (no key) where a word is not in the corpus or the gram is
        longer than n (its key would not fit 63 bits)."""
        if len(gram) > self.n:
            return -1
        key = 0
        for word in gram:
            index = self.words.get(word)
            if index is None:
                return -1
            key = key * self.base + index
        return key

    def as_counter(self) -> Counter[tuple[str, ...]]:
        """The frequencies as a Counter of word tuples (tests, benchmarks)."""
        if self.counter is not None:
            return Counter(self.counter)
        names = {i: w for w, i in self.words.items()}
        out: Counter[tuple[str, ...]] = Counter()
        for key, count in zip(self.keys[:-1].tolist(), self.counts[:-1].tolist(), strict=True):
            words = []
            while key:
                key, index = divmod(key, self.base)
                words.append(names[index])
            out[tuple(reversed(words))] = count
        return out


def packable_base(n: int) -> int:
    """The largest base b with b**n < 2**63: n ids below it pack into one int64 key."""
    base = round(2 ** (63 / n))
    while base**n >= 2**63:
        base -= 1
    while (base + 1) ** n < 2**63:
        base += 1
    return base


def document_ngrams(captions: Sequence[str], n: int) -> set[tuple[str, ...]]:
    """The set of 1..n-grams of a document's (an image's) captions: what its document
    frequency counts once."""
    grams: set[tuple[str, ...]] = set()
    for sentence in captions:
        words = sentence.split()
        for k in range(1, n + 1):
            grams.update(zip(*(words[i:] for i in range(k)), strict=False))  # shifted views
    return grams


def merge_counts(
    keys: np.ndarray, counts: np.ndarray, new_keys: np.ndarray, new_counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (keys, counts) with a sorted chunk's added: a key already there gains its count,
    a new one is inserted in place (one copy of the table, never a sort of it)."""
    pos = np.searchsorted(keys, new_keys)
    found = pos < len(keys)
    found[found] = keys[pos[found]] == new_keys[found]
    counts[pos[found]] += new_counts[found]
    new = ~found
    return np.insert(keys, pos[new], new_keys[new]), np.insert(counts, pos[new], new_counts[new])


def counts_of(table_keys: np.ndarray, table_counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The count of each of `keys` in a sorted table ending in NEVER, 0 for one not in it."""
    pos = np.searchsorted(table_keys, keys)
    return np.where(table_keys[pos] == keys, table_counts[pos], 0)


def distinct_sorted(x: np.ndarray, counts: bool = False):
    """The sorted distinct values of an int array (and the count of each): by np.sort, where
    np.unique hashes (numpy 2.4), many times slower on millions of n-grams."""
    x = np.sort(x)
    start = np.flatnonzero(starts(x))
    return (x[start], np.diff(np.append(start, len(x)))) if counts else x[start]


def starts(x: np.ndarray) -> np.ndarray:
    """Where a run of equal values of x begins (bool)."""
    start = np.ones(len(x), dtype=bool)
    start[1:] = x[1:] != x[:-1]
    return start
