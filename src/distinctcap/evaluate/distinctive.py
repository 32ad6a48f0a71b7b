"""The field's distinctiveness columns in the evaluate stage (distinctcap.scores.distinctive;
docs/report.md, "Distinctiveness metrics of the field"):

    cider_btw, dis_word_rate              each image's first caption against the references
                                          of its K most similar images by the judge CLIP's
                                          pooled embeddings (rule judge_features)
    cider_btw_scene, dis_word_rate_scene  the same with the similar images by their scene
                                          graphs (shapes world only: the cosine of the claim
                                          keys two scenes hold, data.scene_retrieval.
                                          scene_key_matrix)

CIDErBtw is lower-better, DisWordRate higher-better. The similar images are chosen among the
evaluated images of the split, as the authors' sets keep them inside the Karpathy test split,
with K = 5 (`SIMILAR_K`, the papers' default set `method_retrieval_05`), fewer (with one
warning) where the split has fewer than K + 1 images. Neither image space is read by any
training objective or selection. Texts are the PTB tokens of every text metric, and CIDEr-D's
document frequencies are the split's references (the `cider` column's corpus). Without a
judge, or off the shapes world, the pair is NaN with the reason in `skipped`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from distinctcap.core import logs
from distinctcap.data.scene_retrieval import scene_key_matrix
from distinctcap.evaluate.scene_judge import NO_SCENES, split_scenes
from distinctcap.scores.cider import CiderD
from distinctcap.scores.distinctive import (
    SIMILAR_K,
    Neighbours,
    cider_btw,
    dis_word_rate,
    similar_images,
)
from distinctcap.scores.result import MetricResult

if TYPE_CHECKING:
    from distinctcap.evaluate.loaded import JobLoads

log = logging.getLogger(__name__)

COLUMNS = ("cider_btw", "dis_word_rate")
SOURCES = {"": "the judge CLIP", "_scene": "the scene graphs"}  # column suffix -> image space
TOO_FEW = "needs at least two evaluated images: an image's similar images are other images"


def distinctive_columns() -> list[str]:
    """The columns of the metrics row, in its order."""
    return [column + suffix for suffix in SOURCES for column in COLUMNS]


@dataclass
class SimilarSets:
    """Each image space's similar images (suffix -> image id -> K ids, most similar first),
    and why an image space has none (suffix -> reason)."""

    neighbours: dict[str, Neighbours] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def similar_sets(
    judge_features: str | Path | None,
    ids: Sequence[int],
    images: pd.DataFrame,
    loads: JobLoads | None = None,
) -> SimilarSets:
    """The similar images of the evaluated images `ids` by the judge CLIP (its features file,
    None: no judge) and by the scene graphs of `images` (shapes world only)."""
    # here, not above: evaluate.metrics.text imports this module, and report.summary that one
    # while Snakemake parses; the feature readers import torch
    from distinctcap.evaluate.judge import OFF
    from distinctcap.evaluate.loaded import JobLoads

    out = SimilarSets()
    if len(ids) < 2:
        out.skipped = dict.fromkeys(SOURCES, TOO_FEW)
        return out
    k = min(SIMILAR_K, len(ids) - 1)
    logs.warn_if_capped(log, "similar images per image", SIMILAR_K, k,
                        f"the {len(ids)} evaluated images less the image itself")  # fmt: skip
    if judge_features is None:
        out.skipped[""] = OFF
    else:
        pooled, _ = (loads or JobLoads()).judge_pooled(judge_features, ids)
        out.neighbours[""] = similar_images(list(ids), pooled, k)
    scenes = split_scenes(images, ids)
    if scenes is None:
        out.skipped["_scene"] = NO_SCENES
    else:
        out.neighbours["_scene"] = similar_images(list(ids), scene_key_matrix(scenes), k)
    return out


def distinctive_scores(
    references: Mapping[int, Sequence[str]],
    captions: Mapping[int, str],
    similar: SimilarSets,
    scorer: CiderD,
) -> MetricResult:
    """The columns of `distinctive_columns` for one (tokenised) caption per image, against the
    (tokenised) references of the evaluated images; `scorer` holds the references' document
    frequencies."""
    out = MetricResult()
    for suffix, neighbours in similar.neighbours.items():
        btw = cider_btw(captions, references, neighbours, scorer=scorer)
        rate = dis_word_rate(captions, references, neighbours)
        out.values["cider_btw" + suffix] = btw.corpus
        out.values["dis_word_rate" + suffix] = rate.corpus
    for suffix, reason in similar.skipped.items():
        for column in COLUMNS:
            out.skip(column + suffix, reason)
    return out
