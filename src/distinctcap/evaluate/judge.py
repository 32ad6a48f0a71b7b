"""The judge CLIP's columns (evaluate.judge; docs/report.md, "The judge CLIP").

R@k, mean rank, CLIPScore and RefCLIPScore are also computed by the trainer's CLIP (`clip`),
which selects SMILE's and specificity's checkpoints and which specificity trains through: a
method can score well there by exploiting that one CLIP. The judge is a second CLIP that no
training rule, selection or objective reads, so its columns are a check on those:

    judge_r_at_{k}, judge_mean_rank   self-retrieval of each image's first caption among the
                                      split's images (as r_at_k, mean_rank; no hard pool)
    judge_clipscore                   CLIPScore, Hessel et al. 2021 eq. 1
    judge_refclipscore                RefCLIPScore, Hessel et al. 2021 eq. 2

computed by the trainer CLIP's own scoring code (evaluate.device.clip_metrics) on the judge's
pooled image features (rule judge_features, distinctcap.features.pooled) and the same CLIP
encoding the captions; and per image (`PER_IMAGE`) judge_rank (int64) and judge_clipscore
(float32). Without a judge the columns are NaN with the reason in `skipped`, and the per-image
ones null.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from distinctcap.core.settings import EvalSettings
from distinctcap.evaluate.loaded import JobLoads
from distinctcap.scores.result import MetricResult

PREFIX = "judge_"
OFF = "no judge CLIP configured (evaluate.judge)"
PER_IMAGE = ("judge_rank", "judge_clipscore")

# the scoring of evaluate.device.clip_metrics: (clip, texts, references, pooled, hard pool's
# training images, settings) -> (metrics, per-caption clip_rank and clipscore)
Score = Callable[..., tuple[MetricResult, dict[str, np.ndarray]]]


def judge_columns(ks: Sequence[int]) -> list[str]:
    """The judge's metric columns, in the metrics row's order."""
    return [PREFIX + name for name in scored_names(ks)]


def scored_names(ks: Sequence[int]) -> list[str]:
    """The trainer CLIP's columns the judge repeats."""
    return [*[f"r_at_{k}" for k in ks], "mean_rank", "clipscore", "refclipscore"]


def judge_metrics(
    features: str | Path | None,
    ids: Sequence[int],
    texts: Sequence[str],
    references: Sequence[Sequence[str]],
    settings: EvalSettings,
    score: Score,
    loads: JobLoads | None = None,
) -> tuple[MetricResult, dict[str, object]]:
    """The judge's columns and per-caption values of caption i (`texts[i]`, of image `ids[i]`
    with `references[i]`), from the judge features file `features` (None: no judge).
    `score` is evaluate.device.clip_metrics, handed in so both CLIPs are scored by one code
    path (and this module imports no stage). `loads`: the job's, so the judge CLIP and its
    features are read once per job."""
    if features is None:
        return skipped(len(ids), settings.retrieval_ks)
    loads = loads or JobLoads()
    pooled, info = loads.judge_pooled(features, ids)
    clip = loads.clip(info["arch"], info["pretrained"], settings.device, info.get("tag"))
    return judge_scores(clip, texts, references, pooled, settings, score)


def judge_scores(
    clip,
    texts: Sequence[str],
    references: Sequence[Sequence[str]],
    pooled: np.ndarray,
    settings: EvalSettings,
    score: Score,
) -> tuple[MetricResult, dict[str, np.ndarray]]:
    """`judge_metrics` with the judge CLIP loaded and its pooled image embeddings (row i:
    image i) given."""
    no_pool = np.zeros((0, pooled.shape[1]), np.float32)
    own, per_caption = score(
        clip, texts, references, pooled, no_pool, dataclasses.replace(settings, hard_pool=0)
    )
    out = MetricResult({PREFIX + n: own.values[n] for n in scored_names(settings.retrieval_ks)})
    return out, {
        "judge_rank": np.asarray(per_caption["clip_rank"], dtype=np.int64),
        "judge_clipscore": np.asarray(per_caption["clipscore"], dtype=np.float32),
    }


def skipped(n: int, ks: Sequence[int]) -> tuple[MetricResult, dict[str, object]]:
    """No judge: every column NaN with the reason, the per-image values null."""
    out = MetricResult()
    for name in judge_columns(ks):
        out.skip(name, OFF)
    return out, {
        "judge_rank": pd.array([None] * n, dtype="Int64"),
        "judge_clipscore": np.full(n, np.nan, dtype=np.float32),
    }
