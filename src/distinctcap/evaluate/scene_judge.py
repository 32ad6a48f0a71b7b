"""The evaluate stage's scene-retrieval judge (shapes world only, distinctcap.data.scene_retrieval):
scene_r_at_k and scene_mean_rank of each image's first caption among the split's images, and
its per-image scene_rank and scene_top1 (`PER_IMAGE`, for the paired bootstrap)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from distinctcap.data.scene_retrieval import scene_retrieval
from distinctcap.scores.result import MetricResult

NO_SCENES = "no scene graphs: only the shapes world knows its scenes"
PER_IMAGE_SCENE = ("scene_rank", "scene_top1")  # float64: expected rank, P(rank 1)


def split_scenes(images: pd.DataFrame, image_ids: Sequence[int]) -> list[str] | None:
    """The scene graphs (JSON) of `image_ids`, in that order; None off the shapes world."""
    if "scene" not in images.columns:
        return None
    return images.set_index("image_id").scene.loc[list(image_ids)].tolist()


def scene_retrieval_metrics(
    texts: Sequence[str], image_ids: Sequence[int], images: pd.DataFrame, ks: Sequence[int]
) -> tuple[MetricResult, dict[str, np.ndarray]]:
    """(scene_r_at_k for k in `ks` and scene_mean_rank, per-caption scene_rank and
    scene_top1) of caption i (of image_ids[i]) among the images `image_ids`; skipped, with
    NaN per-caption columns, where `images` has no scene column."""
    out = MetricResult()
    scenes = split_scenes(images, image_ids)
    if scenes is None:
        for name in [*(f"scene_r_at_{k}" for k in ks), "scene_mean_rank"]:
            out.skip(name, NO_SCENES)
        return out, {c: np.full(len(texts), np.nan) for c in PER_IMAGE_SCENE}
    values, per_caption = scene_retrieval(list(texts), scenes, ks)
    out.values.update(values)
    return out, per_caption
