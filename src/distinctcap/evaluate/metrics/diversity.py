"""Diversity of the n captions of each image (UNKT §4.1 "Diversity metrics", Table 2) and
corpus-level lexical statistics (SMILE §4: caption length, lexical diversity).

Every function takes image id -> captions that are already PTB-tokenised (see
`CocoTools.tokenize_groups`); words are whitespace tokens.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Literal

import numpy as np
from pycocoevalcap.bleu.bleu_scorer import BleuScorer, precook

from distinctcap.core.errors import DistinctcapError
from distinctcap.evaluate.metrics.parallel import fork_map
from distinctcap.scores.cider import CiderD

Captions = Mapping[Hashable, Sequence[str]]


def _need_images(caps_by_image: Captions, min_captions: int = 1) -> None:
    if not caps_by_image:
        raise DistinctcapError("no images to evaluate")
    few = [i for i, caps in caps_by_image.items() if len(caps) < min_captions]
    if few:
        raise DistinctcapError(
            f"image ids {few[:5]} have fewer than {min_captions} captions; this metric compares "
            "the captions of one image with each other"
        )


def div_n(caps_by_image: Captions, n: int) -> float:
    """Div-n (Li et al. 2015, as in UNKT Table 2): distinct n-grams / words, mean over images.

    Per image: the number of distinct n-grams across all its captions divided by the total
    number of words in them ("a b c" + "a b d": Div-1 = 4/6, Div-2 = 3/6). An image whose
    captions are all empty counts as 0.
    """
    _need_images(caps_by_image)
    values = []
    for caps in caps_by_image.values():
        words = [c.split() for c in caps]
        grams = {tuple(w[i : i + n]) for w in words for i in range(len(w) - n + 1)}
        total = sum(len(w) for w in words)
        values.append(len(grams) / total if total else 0.0)
    return float(np.mean(values))


def mbleu(caps_by_image: Captions, workers: int = 1) -> float:
    """mBLEU-4 (UNKT Table 2, lower = more diverse), in corpus rounds as Shetty et al. 2017
    compute it (rakshithShetty/captionGAN, computeDivStats.py): not per image, as Wang &
    Chan's DiversityMetrics `mBLEU` does (BLEU of each image on its own, averaged).

    For each i: corpus BLEU-4 (pycocoevalcap `Bleu(4)`) of every image's i-th caption against
    that image's other captions; the mean over i. Images with fewer than i+1 captions sit out
    round i. Each caption's n-grams are counted once (`_leave_one_out`) instead of once per
    round, and the integer counts go into pycocoevalcap's own `BleuScorer`, so the number is
    `Bleu(4)`'s to the last digit; images are split over `workers` forked processes.
    """
    _need_images(caps_by_image, 2)
    per_image = fork_map(_leave_one_out, list(caps_by_image.values()), workers)
    rounds = []
    for i in range(max(len(c) for c in caps_by_image.values())):
        scorer = BleuScorer(n=4)
        scorer.ctest = [comps[i] for comps in per_image if len(comps) > i]
        scorer.crefs = [None] * len(scorer.ctest)
        rounds.append(scorer.compute_score(option="closest", verbose=0)[0][3])
    return float(np.mean(rounds))


def _leave_one_out(captions: Sequence[str]) -> list[dict]:
    """`cook_test`'s statistics of each caption against the image's other captions (the
    reference lengths, the clipped n-gram matches), from one count of every caption."""
    cooked = [precook(c, 4) for c in captions]
    top: dict[tuple[str, ...], list[int]] = {}  # n-gram -> [best count, its caption, 2nd best]
    for j, (_, counts) in enumerate(cooked):
        for gram, count in counts.items():
            best = top.setdefault(gram, [0, -1, 0])
            if count > best[0]:
                best[:] = [count, j, best[0]]
            elif count > best[2]:
                best[2] = count
    lengths = [length for length, _ in cooked]
    out = []
    for j, (length, counts) in enumerate(cooked):
        correct = [0] * 4
        for gram, count in counts.items():
            best = top[gram]
            others = best[2] if best[1] == j else best[0]
            correct[len(gram) - 1] += min(others, count)
        out.append(
            {
                "reflen": lengths[:j] + lengths[j + 1 :],
                "testlen": length,
                "guess": [max(0, length - k + 1) for k in range(1, 5)],
                "correct": correct,
            }
        )
    return out


def self_cider(
    caps_by_image: Captions,
    df_corpus: Iterable[Sequence[str]] | None = None,
    *,
    scorer: CiderD | None = None,
    workers: int = 1,
) -> float:
    """SelfCIDEr (Wang & Chan 2019, UNKT Table 2): 0 = all captions alike, 1 = all unrelated.

    As the authors' code computes it (qingzwang/DiversityMetrics,
    pycocoevalcap/diversity_eval.py, `SelfCider`): per image, the kernel of its n captions
    (`self_cider_kernel`) scored by `self_cider_score`; the mean over images.

    Document frequencies: the authors' code takes them from a fixed corpus (COCO train);
    pass `df_corpus` (one caption group per image, e.g. the training references) or its
    prebuilt `scorer` (CocoTools.cider_d) to do the same, which keeps runs comparable.
    Default: the evaluated caption sets, one document per image (pycocoevalcap's corpus
    mode). Images are split over `workers` forked processes.
    """
    _need_images(caps_by_image, 2)
    if scorer is None:
        scorer = CiderD(caps_by_image.values() if df_corpus is None else df_corpus)
    values = fork_map(
        lambda caps: self_cider_score(self_cider_kernel(scorer, caps)),
        caps_by_image.values(),
        workers,
    )
    return float(np.mean(values))


def self_cider_score(kernel: np.ndarray) -> float:
    """One image's SelfCIDEr from its n x n kernel K, as Wang & Chan's code computes it
    (DiversityMetrics, pycocoevalcap/diversity_eval.py): the singular values s of K
    (`np.linalg.svd`), r = max √s / Σ √s, score = -log r / log n.

    The mirrored kernel is not positive semi-definite when captions repeat words; its
    singular values are then the absolute eigenvalues, not the eigenvalues clipped at 0 that
    another code base (and this function before issue 45) took. The scale of K does not
    matter (their code keeps CIDEr's x10). One departure, at round-off level: singular
    values below numpy's rank tolerance (s_max · n · eps, `np.linalg.matrix_rank`) count as
    0, so n identical captions score 0 (the authors' code gives ~1e-8). K = 0 (every n-gram
    has idf 0: no measurable diversity) scores 0 where their code divides 0 by 0.
    """
    n = len(kernel)
    s = np.linalg.svd(kernel, compute_uv=False)
    s[s <= s.max(initial=0.0) * n * np.finfo(s.dtype).eps] = 0.0
    roots = np.sqrt(s)
    total = roots.sum()
    return 0.0 if total <= 0 else -math.log(roots.max() / total) / math.log(n)


def self_cider_kernel(scorer: CiderD, caps: Sequence[str]) -> np.ndarray:
    """K[i, j] = CIDEr-D(c_i | c_j) for i <= j, mirrored: Wang & Chan's kernel (their
    `SelfCider.evaluate` scores caption i against caption j as its one reference with the
    CIDEr of their pycocoevalcap copy, which clips and length-penalises: CIDEr-D, not the
    original CIDEr; x10 as it returns), from one `CiderD.pair_matrix`."""
    pairs = scorer.pair_matrix(caps, caps)
    upper = np.triu(np.ones((len(caps), len(caps)), dtype=bool))
    return np.where(upper, pairs, pairs.T)


def distinct_share(caps_by_image: Captions, scope: Literal["image", "corpus"] = "image") -> float:
    """Share of distinct captions: per image among its n captions (mean over images), or over
    all captions of all images (`scope="corpus"`: low when one generic caption serves many
    images). A fraction in [0, 1]."""
    _need_images(caps_by_image)
    if scope == "image":
        return float(np.mean([len(set(c)) / len(c) for c in caps_by_image.values()]))
    if scope == "corpus":
        flat = [c for caps in caps_by_image.values() for c in caps]
        return len(set(flat)) / len(flat)
    raise DistinctcapError(f"distinct_share scope must be 'image' or 'corpus', got {scope!r}")


def novelty(caps_by_image: Captions, train_captions: Iterable[str] | KnownCaptions) -> float:
    """Share of generated captions that are not an exact copy of a training caption (both in
    the same tokenisation): the training captions, or their `KnownCaptions`. A fraction in
    [0, 1]; x100 for the usual percentage."""
    _need_images(caps_by_image)
    known = isinstance(train_captions, KnownCaptions)
    train = train_captions if known else set(train_captions)
    flat = [c for caps in caps_by_image.values() for c in caps]
    return sum(c not in train for c in flat) / len(flat)


def vocab_size(caps_by_image: Captions) -> float:
    """Lexical diversity (SMILE Table 1): the number of distinct words over all captions."""
    return float(len({w for caps in caps_by_image.values() for c in caps for w in c.split()}))


def mean_length(caps_by_image: Captions) -> float:
    """Caption length (SMILE Table 1): mean number of words per caption."""
    _need_images(caps_by_image)
    return float(np.mean([len(c.split()) for caps in caps_by_image.values() for c in caps]))


class KnownCaptions:
    """Which captions are among a corpus's (novelty's training captions), held as the sorted
    distinct 64-bit BLAKE2b hashes of their texts: 8 bytes a caption where a set of COCO's
    591,753 training captions takes ~70 MB, and filled a part at a time (`add`) as the
    captions stream by (evaluate.metrics.training). A caption outside the corpus is taken for
    one of its captions only if its hash equals one of theirs: with N distinct corpus captions
    that has probability at most N / 2**64 per caption asked (COCO: 3.2e-14; a decoding's
    1,000 first captions: 3.2e-11), so novelty is a set's to that probability."""

    def __init__(self, captions: Iterable[str] = ()):
        self.hashes = np.zeros(0, np.uint64)
        self.add(captions)

    def add(self, captions: Iterable[str]) -> None:
        self.hashes = np.union1d(self.hashes, caption_hashes(captions))

    def __contains__(self, caption: str) -> bool:
        h = caption_hashes([caption])
        pos = np.searchsorted(self.hashes, h)
        return bool(pos[0] < len(self.hashes) and self.hashes[pos[0]] == h[0])

    def __len__(self) -> int:
        return len(self.hashes)


def caption_hashes(captions: Iterable[str]) -> np.ndarray:
    """64-bit BLAKE2b of each caption's UTF-8 text (the same in every process and run)."""
    digests = (hashlib.blake2b(c.encode(), digest_size=8).digest() for c in captions)
    return np.fromiter((int.from_bytes(d, "little") for d in digests), np.uint64)
