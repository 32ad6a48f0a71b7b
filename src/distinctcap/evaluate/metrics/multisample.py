"""Multi-sample protocols of UNKT §4.2–4.3: oracle ("best-1") quality over n samples per image
(Table 1, Fig. 2) and consensus re-ranking to pick the best captions (Table 2).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from distinctcap.core.errors import DistinctcapError
from distinctcap.evaluate.metrics.coco import (
    QUALITY_METRICS,
    CocoTools,
    check_references,
    coco_session,
    per_item_scores,
)
from distinctcap.evaluate.metrics.parallel import fork_map
from distinctcap.scores.cider import CiderD
from distinctcap.scores.result import MetricResult

Captions = Mapping[Hashable, Sequence[str]]
ORACLE_METRICS = QUALITY_METRICS


def sample_score_table(
    gts: Captions,
    samples_by_image: Captions,
    n: int,
    *,
    metrics: Sequence[str] = ORACLE_METRICS,
    tokenized: bool = False,
    tools: CocoTools | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Sentence-level score of each of the first `n` samples of every image.

    One scorer call per metric over all (image, sample) pairs (METEOR: one server, SPICE: one
    run). CIDEr-D's idf comes from the references of the evaluated images, as in a
    one-sample-per-image evaluation. Returns ({metric: (images, n)} in samples_by_image order,
    {metric: reason} for skipped metrics).
    """
    ids = list(samples_by_image)
    short = [i for i in ids if len(samples_by_image[i]) < n]
    if n < 1 or short:
        raise DistinctcapError(f"oracle over n={n} samples, but image ids {short[:5]} have fewer")
    check_references(gts, ids)
    gts = {i: gts[i] for i in ids}
    samples = {i: list(samples_by_image[i][:n]) for i in ids}
    with coco_session(tools) as t:
        if not tokenized:
            gts, samples = t.tokenize_groups(gts, samples)
        pairs = [(s, gts[i]) for i in ids for s in samples[i]]
        flat, skipped = per_item_scores(pairs, [gts[i] for i in ids], metrics, t)
    return {m: v.reshape(len(ids), n) for m, v in flat.items()}, skipped


def oracle_from_table(
    table: dict[str, np.ndarray], skipped: dict[str, str], n: int
) -> MetricResult:
    """oracle_{metric}_{n}: per image the best score among its first n samples, mean over images."""
    out = MetricResult()
    for metric, scores in table.items():
        name = f"oracle_{metric}_{n}"
        if metric in skipped:
            out.skip(name, skipped[metric])
        else:
            out.values[name] = float(scores[:, :n].max(axis=1).mean())
    return out


def oracle_scores(
    gts: Captions,
    samples_by_image: Captions,
    n: int,
    *,
    metrics: Sequence[str] = ORACLE_METRICS,
    tokenized: bool = False,
    tools: CocoTools | None = None,
) -> MetricResult:
    """Oracle quality (UNKT §4.2, Table 1): the maximum of each metric over the first n
    samples of an image, averaged over images. Keys oracle_{metric}_{n}, e.g. oracle_cider_20.
    """
    table, skipped = sample_score_table(
        gts, samples_by_image, n, metrics=metrics, tokenized=tokenized, tools=tools
    )
    return oracle_from_table(table, skipped, n)


def cider_vs_n(
    gts: Captions,
    samples_by_image: Captions,
    ns: Iterable[int],
    *,
    tokenized: bool = False,
    tools: CocoTools | None = None,
) -> dict[int, float]:
    """Oracle CIDEr-D as the number of samples grows (UNKT Fig. 2): {n: oracle CIDEr}.

    Scores every sample once; the curve is non-decreasing in n.
    """
    ns = sorted(set(ns))
    if not ns:
        raise DistinctcapError("cider_vs_n needs at least one n")
    table, _ = sample_score_table(
        gts, samples_by_image, ns[-1], metrics=("cider",), tokenized=tokenized, tools=tools
    )
    return {n: float(table["cider"][:, :n].max(axis=1).mean()) for n in ns}


def consensus_scores(
    samples_by_image: Captions,
    neighbour_captions_by_image: Captions,
    df_corpus: Iterable[Sequence[str]] | None = None,
    *,
    scorer: CiderD | None = None,
    workers: int = 1,
) -> dict[Hashable, list[float]]:
    """Each candidate's mean CIDEr-D against the captions of its image's nearest training
    images (consensus re-ranking, Devlin et al. 2015 / Mao et al. 2018, used by UNKT §4.3).

    Inputs are tokenised. `neighbour_captions_by_image`: image id -> captions of its k
    nearest training images (the caller finds the neighbours, e.g. by CLIP image similarity).
    `df_corpus`: caption groups for CIDEr-D's idf, e.g. the training references per image;
    default the neighbour caption sets, one document per evaluated image; or a prebuilt
    `scorer` (CocoTools.cider_d). Images are split over `workers` forked processes.
    """
    missing = [i for i in samples_by_image if not neighbour_captions_by_image.get(i)]
    if missing:
        raise DistinctcapError(f"no neighbour captions for image ids {missing[:5]}")
    if scorer is None:
        docs = neighbour_captions_by_image.values() if df_corpus is None else df_corpus
        scorer = CiderD(docs)
    ids = list(samples_by_image)

    def image_scores(i: Hashable) -> list[float]:
        return scorer.scores(samples_by_image[i], neighbour_captions_by_image[i]).tolist()

    return dict(zip(ids, fork_map(image_scores, ids, workers), strict=True))


def consensus_rerank(
    samples_by_image: Captions,
    neighbour_captions_by_image: Captions,
    df_corpus: Iterable[Sequence[str]] | None = None,
    *,
    scorer: CiderD | None = None,
    workers: int = 1,
) -> dict[Hashable, list[str]]:
    """Each image's candidates sorted by consensus score, best first (ties keep sample order).

    See `consensus_scores` for the score; `best_k` then keeps the top k ("best-5" of Table 2).
    """
    scores = consensus_scores(
        samples_by_image, neighbour_captions_by_image, df_corpus, scorer=scorer, workers=workers
    )
    ranked = {}
    for i, caps in samples_by_image.items():
        order = sorted(range(len(caps)), key=lambda j, s=scores[i]: -s[j])
        ranked[i] = [caps[j] for j in order]
    return ranked


def best_k(ranked: Captions, k: int = 5) -> dict[Hashable, list[str]]:
    """The first k captions of each image (after `consensus_rerank`)."""
    if k < 1:
        raise DistinctcapError(f"best_k needs k >= 1, got {k}")
    return {i: list(caps[:k]) for i, caps in ranked.items()}
