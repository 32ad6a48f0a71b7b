"""How far an image is from the run's training images: the `familiarity` block of a run card.

An image's score is the RMS z-score of its CLIP grid features averaged over the grid tokens,
against the per-dimension mean and spread of the training images' (`feature_distance`). The
threshold is `MARGIN` times the 99th percentile of the validation images' scores, so about one
validation image in a hundred comes near it and an image twice as far is flagged as outside the
training images (`distinctcap caption` says so; the caption is still written).

Why the CLIP's features and not the caption's mean token log-probability: the features are
those of the CLIP the run was trained on, whatever the captioner learnt. A captioner trained
briefly (the tests' tiny run) gives a noise image and a shapes image the same mean token
log-probability (-3.2 both), while the score above is 1.0 (median) to 1.8 (largest) on its
validation images and 5.7 to 6.4 on uniform noise (measured on the tiny DAG's run, 2-core box).
The mean token log-probability is still shown beside each caption, as the captioner's own
confidence.

The statistics come from at most `MAX_IMAGES` images of each split (evenly spread over the
sorted ids), read from the features index, so a COCO-size index is not read whole.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import torch

from distinctcap.core.io import read_table
from distinctcap.features.read import ImageFeatures

MARGIN = 2.0
QUANTILE = 99.0
MAX_IMAGES = 2000


def token_mean(grid: torch.Tensor) -> torch.Tensor:
    """(N, G, Dv) grid features -> (N, Dv) float32, their mean over the grid tokens."""
    return grid.float().mean(dim=1)


def feature_distance(grid: torch.Tensor, familiarity: dict) -> torch.Tensor:
    """(N,) RMS z-score of each image's token-mean grid features against the training images'
    statistics (module docstring)."""
    mean = torch.tensor(familiarity["mean"], dtype=torch.float32, device=grid.device)
    scale = torch.tensor(familiarity["scale"], dtype=torch.float32, device=grid.device)
    return ((token_mean(grid) - mean) / scale).pow(2).mean(dim=1).sqrt()


def spread_ids(images: pd.DataFrame, split: str, count: int = MAX_IMAGES) -> np.ndarray:
    """Up to `count` image ids of `split`, evenly spread over its sorted ids."""
    ids = np.sort(images[images.split == split].image_id.to_numpy())
    pick = np.unique(np.linspace(0, len(ids) - 1, min(count, len(ids))).round().astype(int))
    return ids[pick] if len(ids) else ids


def calibrate(features_index: str | os.PathLike, images: str | os.PathLike) -> dict:
    """The card's `familiarity` block of a features index: its training images' statistics
    and the threshold calibrated on its validation images (test images when there are none)."""
    table = read_table(images, "images")
    held_out = "val" if (table.split == "val").any() else "test"
    grids = [
        ImageFeatures.load(features_index, spread_ids(table, split)).grid
        for split in ("train", held_out)
    ]
    return familiarity(*grids, held_out=held_out)


def familiarity(train_grid: torch.Tensor, held_out_grid: torch.Tensor, held_out: str) -> dict:
    """The training images' feature statistics, and the threshold: `MARGIN` times the
    `QUANTILE` percentile of the held-out images' distances (module docstring)."""
    train = token_mean(train_grid)
    block = {
        "score": "rms z-score of the CLIP grid features' token mean",
        "mean": _rounded(train.mean(dim=0)),
        "scale": _rounded(train.std(dim=0).clamp_min(1e-6)),
    }
    scores = feature_distance(held_out_grid, block).numpy()
    reference = float(np.percentile(scores, QUANTILE))
    return block | {
        "threshold": round(MARGIN * reference, 4),
        "calibrated_on": f"{len(scores)} {held_out} images: {MARGIN:g} x their "
        f"{QUANTILE:g}th percentile {reference:.4f}",
    }


def _rounded(values: torch.Tensor) -> list[float]:
    return [float(f"{v:.6g}") for v in values.tolist()]
