"""COCO caption quality metrics (UNKT §4.1): BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE.

pycocoevalcap's own wrappers write temporary files into its package folder (tokenizer, SPICE)
and start one Java process per scorer object. Here one `CocoTools` session runs the same jars
with private temporary folders, so evaluations work from a read-only venv and in parallel:
the PTB tokenizer (`metrics.ptb`) runs once per `tokenize` call (over `workers` JVMs side by
side for a long list), METEOR (`metrics.meteor`) is one long-lived `-stdio` server per
session (started on first use; per-pair scores of many pairs go over `workers` servers), and
SPICE (`metrics.spice`) runs once over a batch of (candidate, refs) pairs with `-threads` and
a `-cache`; `metrics.java` finds the `java` they run on. A session is one evaluate job: it
tokenises a reference set once (and, with a `cache_dir`, once for every later job and run:
the tokens are stored by content hash), builds CIDEr-D's document frequencies of a
corpus once (`cider_d`) and streams the training captions through their document
frequencies and caption set once (`training`).
BLEU, ROUGE-L and CIDEr-D are pycocoevalcap's pure-Python scorers, here over the session's
forked workers.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.bleu.bleu_scorer import BleuScorer, cook_refs, cook_test
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from distinctcap.core import work
from distinctcap.core.errors import DistinctcapError
from distinctcap.evaluate.metrics import ptb
from distinctcap.evaluate.metrics.java import Pair, java_executable
from distinctcap.evaluate.metrics.meteor import MeteorServers
from distinctcap.evaluate.metrics.parallel import (
    CHUNKS_PER_WORKER,
    chunk_bounds,
    fork_map_beside,
)
from distinctcap.evaluate.metrics.spice import SpiceScores, spice_unavailable_reason
from distinctcap.evaluate.metrics.training import TrainingCorpus, training_corpus
from distinctcap.scores.cider import CiderD
from distinctcap.scores.result import MetricResult

Captions = Mapping[Hashable, Sequence[str]]

ROUGE_BETA = 1.2  # pycocoevalcap Rouge's beta
QUALITY_METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge_l", "cider", "spice")


class CocoTools:
    """One evaluate job's Java tools and shared work; use as a context manager so METEOR
    is stopped.

    `workers`: the job's cores, for the tokenizer's and METEOR's JVMs and the forked n-gram
    metrics (distinctcap.evaluate.metrics.parallel). `cache_dir`: where reference sets'
    tokens are kept by content hash for later jobs (the experiment's results folder), or
    None. `launches` counts Java process starts per tool, so callers and tests can check
    that an evaluation starts each tool once (or once per worker), never once per image.
    """

    def __init__(
        self,
        spice: bool = True,
        meteor_memory: str = "2G",
        spice_memory: str = "8G",
        workers: int = 1,
        cache_dir: str | Path | None = None,
    ):
        self.workers = max(1, int(workers))
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.spice_skip_reason = "SPICE disabled by the caller" if not spice else None
        self.spice_skip_reason = self.spice_skip_reason or spice_unavailable_reason()
        self.launches: Counter[str] = Counter()
        self._meteors = MeteorServers(meteor_memory, self.launches)
        self._spice = SpiceScores(spice_memory, self.cache_dir, self.launches)
        self._tokens = ptb.TokenCache(self.cache_dir)  # this job's sets, and the cache's
        self._scorers: dict[str, CiderD] = {}  # content hash of a corpus -> its CIDEr-D
        self._training: dict[str, TrainingCorpus] = {}  # ptb.stream_key -> its corpus

    @property
    def java(self) -> str:
        """The `java` executable, looked up when a tool first needs it."""
        return java_executable()

    def __enter__(self) -> CocoTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._meteors.close()

    def tokenize(self, texts: Sequence[str], then: str | None = None) -> list[str]:
        """PTB tokens of `texts` (`ptb.tokenize`: over up to `workers` JVMs; `then`, the
        text that follows them in the one file a serial run would tokenise)."""
        return ptb.tokenize(texts, self.workers, self.launches, then)

    def tokenize_groups(
        self, *groups: Captions, keep: Collection[int] = (), then: str | None = None
    ) -> list[dict[Hashable, list[str]]]:
        """Tokenise several {id: captions} mappings as one file of all their captions in
        order (the tokens a single tokenizer launch gives), followed by the line `then` (None:
        the file's end). The groups at the positions in `keep` (reference sets) are tokenised
        once per session and, with a `cache_dir`, found there by content hash (with the line
        that follows them) by later sessions."""
        return ptb.tokenize_groups(groups, keep, self.tokenize, self._tokens, then)

    def training(self, train_refs: Captions) -> TrainingCorpus:
        """The training captions' CIDEr-D and caption set (metrics.training), from their tokens
        streamed a part at a time (`ptb.stream_tokens`: found in or written to the cache
        folder like a reference set's): counted once per session for the same captions, and
        their tokens never held whole."""
        key = ptb.stream_key(train_refs)
        if key not in self._training:
            lines = ptb.STREAM_LINES_PER_WORKER * max(self.workers, 4)
            parts = ptb.stream_tokens(train_refs, self.tokenize, self._tokens, lines, key)
            self._training[key] = training_corpus(parts)
        return self._training[key]

    def cider_d(self, documents: Captions) -> CiderD:
        """CIDEr-D with the document frequencies of `documents` (tokenised, one caption
        group per image), built once per session for the same corpus."""
        key = ptb.content_key(["\x1f".join(caps) for caps in documents.values()])
        if key not in self._scorers:
            self._scorers[key] = CiderD(documents.values())
        return self._scorers[key]

    def start_meteor(self) -> None:
        """Start the first METEOR server now, so that its paraphrase table (~15 CPU s) loads
        while the tokenizer and the n-gram metrics run."""
        self._meteors.server(0)

    def meteor(self, pairs: Sequence[Pair]) -> tuple[float, list[float]]:
        """Corpus METEOR and per-pair scores over (candidate, references) pairs."""
        return self._meteors.server(0).score(pairs)

    def meteor_segments(self, pairs: Sequence[Pair]) -> list[float]:
        """Per-pair METEOR of many pairs over up to half the `workers` servers side by side
        (`MeteorServers.segments`: the same digits as one server)."""
        return self._meteors.segments(pairs, self.workers)

    def spice(self, pairs: Sequence[Pair]) -> list[float] | None:
        """Per-pair SPICE F-scores (one Java run for the pairs not seen yet); None if skipped."""
        if self.spice_skip_reason is not None:
            return None
        return self._spice.of(pairs, self.workers)


@contextmanager
def coco_session(tools: CocoTools | None) -> Iterator[CocoTools]:
    """`tools` itself, or a fresh session closed on exit."""
    if tools is not None:
        yield tools
        return
    with CocoTools() as fresh:
        yield fresh


def check_references(gts: Captions, ids: Sequence[Hashable]) -> None:
    missing = [i for i in ids if i not in gts]
    if missing:
        raise DistinctcapError(f"no reference captions for image ids {missing[:5]}")
    empty = [i for i in ids if not gts[i]]
    if empty:
        raise DistinctcapError(f"image ids {empty[:5]} have an empty reference list")


def quality_scores(
    gts: Captions, res: Captions, *, tokenized: bool = False, tools: CocoTools | None = None
) -> MetricResult:
    """COCO caption metrics of one caption per image (UNKT §4.1 "Quality metrics").

    `gts`: image id -> reference captions; `res`: image id -> [the one candidate caption],
    same ids. Texts are PTB-tokenised here (one tokenizer launch) unless `tokenized`. BLEU-n is
    corpus BLEU ("closest" reference length), METEOR the corpus score from summed statistics,
    ROUGE-L and CIDEr-D (pycocoevalcap `Cider`, idf from `gts`) means over images, SPICE the
    mean F-score, or NaN with a reason in `skipped` when its CoreNLP jars are absent.
    Returns bleu1..bleu4, meteor, rouge_l, cider, spice on pycocoevalcap's scale (papers print
    them x100).
    """
    ids = list(res)
    if set(ids) != set(gts):
        extra = sorted(set(ids) ^ set(gts), key=str)[:5]
        raise DistinctcapError(f"gts and res must have the same image ids; differing: {extra}")
    bad = [i for i in ids if len(res[i]) != 1]
    if bad:
        raise DistinctcapError(f"res must hold exactly one caption per image; ids {bad[:5]} do not")
    check_references(gts, ids)
    with coco_session(tools) as t:
        if not tokenized:
            gts, res = t.tokenize_groups({i: gts[i] for i in ids}, {i: res[i] for i in ids})
        gts = {i: list(gts[i]) for i in ids}
        res = {i: list(res[i]) for i in ids}
        out = MetricResult()
        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
        out.values.update({f"bleu{k + 1}": float(b) for k, b in enumerate(bleu)})
        pairs = [(res[i][0], gts[i]) for i in ids]
        out.values["meteor"] = t.meteor(pairs)[0]
        out.values["rouge_l"] = float(Rouge().compute_score(gts, res)[0])
        out.values["cider"] = float(Cider().compute_score(gts, res)[0])
        spice = t.spice(pairs)
        if spice is None:
            out.skip("spice", t.spice_skip_reason)
        else:
            out.values["spice"] = float(np.mean(spice))
    count_scored([m for m in QUALITY_METRICS if m in out.values], len(pairs))
    return out


def count_scored(metrics: Sequence[str], pairs: int) -> None:
    """The work record's `<metric>_scored` (distinctcap.core.work): the pairs each metric was
    asked to score, before the caches and deduplication (which depend on what ran before), so
    the count is the same whatever order the jobs ran in."""
    for m in metrics:
        work.count(f"{m}_scored", pairs)


def per_item_scores(
    pairs: Sequence[Pair],
    documents: Sequence[Sequence[str]],
    metrics: Sequence[str],
    tools: CocoTools,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Each pair's sentence-level score for every metric.

    Pairs are tokenised (candidate, references). CIDEr-D takes its idf from `documents` (the
    reference sets of the distinct images), so scoring many samples of one image at once gives
    the same number as scoring them one evaluation at a time. BLEU, ROUGE-L and CIDEr-D score
    parts of the pairs in the session's forked workers while METEOR's servers score theirs
    (a pair's sentence-level score depends on that pair only, so the parts change no digit).
    Returns ({metric: (P,)}, skipped).
    """
    unknown = set(metrics) - set(QUALITY_METRICS)
    if unknown:
        raise DistinctcapError(f"unknown metrics {sorted(unknown)}; allowed: {QUALITY_METRICS}")
    python = [m for m in metrics if m.startswith("bleu") or m in ("rouge_l", "cider")]
    cider = CiderD(documents) if "cider" in metrics else None
    bounds = chunk_bounds(len(pairs), tools.workers * CHUNKS_PER_WORKER) if pairs else []

    def java() -> list[float] | None:
        return tools.meteor_segments(pairs) if "meteor" in metrics else None

    parts, meteor = fork_map_beside(
        lambda b: _python_scores(pairs[b[0] : b[1]], python, cider), bounds, tools.workers, java
    )
    scores = {m: np.concatenate([p[m] for p in parts]) for m in python} if parts else {}
    if meteor is not None:
        scores["meteor"] = np.asarray(meteor, dtype=float)
    skipped: dict[str, str] = {}
    if "spice" in metrics:
        spice = tools.spice(pairs)
        if spice is None:
            skipped["spice"] = tools.spice_skip_reason
            scores["spice"] = np.full(len(pairs), math.nan)
        else:
            scores["spice"] = np.asarray(spice, dtype=float)
    count_scored([m for m in metrics if m not in skipped], len(pairs))
    return {m: scores.get(m, np.zeros(0)) for m in metrics}, skipped


def _python_scores(
    pairs: Sequence[Pair], metrics: Sequence[str], cider: CiderD | None
) -> dict[str, np.ndarray]:
    """BLEU-1..4, ROUGE-L and CIDEr-D (those in `metrics`) of each pair: one scorer call per
    metric."""
    scores: dict[str, np.ndarray] = {}
    if any(m.startswith("bleu") for m in metrics):
        bleu = _bleu_scores(pairs)
        scores.update({f"bleu{k + 1}": np.asarray(b, dtype=float) for k, b in enumerate(bleu)})
    if "rouge_l" in metrics:
        scores["rouge_l"] = np.array([rouge_l(h, refs) for h, refs in pairs], dtype=float)
    if cider is not None:
        scores["cider"] = _cider_scores(pairs, cider)
    return {m: scores[m] for m in metrics}


def _bleu_scores(pairs: Sequence[Pair]) -> list[list[float]]:
    """Bleu(4).compute_score's per-pair BLEU-1..4 lists, by its own BleuScorer, with each run
    of pairs with the same references (an image's samples) cooking them once."""
    scorer = BleuScorer(n=4)
    for refs, run in itertools.groupby(pairs, key=lambda pair: tuple(pair[1])):
        cooked = cook_refs(refs)
        scorer.ctest.extend(cook_test(hyp, cooked) for hyp, _ in run)
    scorer.crefs = [None] * len(scorer.ctest)
    return scorer.compute_score(option="closest", verbose=0)[1]


def rouge_l(candidate: str, references: Sequence[str]) -> float:
    """pycocoevalcap's `Rouge().calc_score([candidate], references)`, the same float, with
    the longest common subsequence counted bit-parallel (Hyyrö 2004) instead of by its
    per-cell Python table; words are split on single spaces, as there."""
    words = candidate.split(" ")
    masks: dict[str, int] = {}
    for k, word in enumerate(words):
        masks[word] = masks.get(word, 0) | 1 << k
    prec, rec = [], []
    for reference in references:
        ref_words = reference.split(" ")
        lcs = _lcs_length(ref_words, masks, len(words))
        prec.append(lcs / float(len(words)))
        rec.append(lcs / float(len(ref_words)))
    prec_max, rec_max = max(prec), max(rec)
    if prec_max == 0 or rec_max == 0:
        return 0.0
    beta = ROUGE_BETA
    return ((1 + beta**2) * prec_max * rec_max) / float(rec_max + beta**2 * prec_max)


def _lcs_length(words: Sequence[str], masks: dict[str, int], length: int) -> int:
    """Length of the longest common subsequence of `words` and the `length` words whose
    positions `masks` holds (word -> bit set of its positions)."""
    row = (1 << length) - 1
    for word in words:
        match = row & masks.get(word, 0)
        row = (row + match) | (row - match)
    return length - (row & ((1 << length) - 1)).bit_count()


def _cider_scores(pairs: Sequence[Pair], cider: CiderD) -> np.ndarray:
    """CIDEr-D of each pair; a run of pairs with the same references (an image's samples) is
    scored by one `CiderD.scores` call."""
    runs = itertools.groupby(pairs, key=lambda pair: tuple(pair[1]))
    parts = [cider.scores([h for h, _ in run], refs) for refs, run in runs]
    return np.concatenate(parts) if parts else np.zeros(0)
