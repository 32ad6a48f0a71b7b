"""Each run against the MLE reference with paired bootstrap confidence intervals over the test
images (rule `versus_reference`: versus.csv, versus.md, versus.tex).

A difference counts as better or worse only where its 95 % interval excludes 0; otherwise it
reads "no significant difference", so noise (e.g. 3.10e-10 vs 3.01e-10) is never a win.
Scores per image, of each image's first caption (greedy, best beam or first sample), on the
same images for run and reference:
- CIDEr-D (distinctcap.evaluate.metrics.cider, the references of the scored images as its corpus, on
  whitespace tokens: the shapes captions have no punctuation; on COCO it differs slightly from
  the PTB-tokenised summary value), the statistic is the mean over images;
- R@1, mean rank and CLIPScore, from the evaluate rule's per-image table (clip_rank: the
  1-based CLIP rank of the image by its caption among the split's images; clipscore, Hessel
  et al. 2021 eq. 1): the statistic is the mean over images of the hit 1[clip_rank <= 1], of
  clip_rank and of clipscore, so the full sample gives the summary's r_at_1, mean_rank and
  clipscore. Mean rank is lower-better: its difference is better where the interval lies
  below 0 (`LOWER_BETTER`);
- scene precision and F1 (shapes world): claim and fact counts per image, the statistic is
  the micro average over the resampled images, as in the summary.
Bootstrap (Efron & Tibshirani 1993, percentile interval): `n_boot` resamples of the images
with replacement, the same resample for run and reference (paired), seeded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from distinctcap.core.io import atomic_path
from distinctcap.data.scene import score_caption
from distinctcap.evaluate.metrics.cider import CiderD
from distinctcap.report.summary import HEADLINE_QUALITY, latex, run_order

COLUMNS = [
    "run", "decoding", "split", "metric", "value", "reference_value", "difference",
    "ci_low", "ci_high", "verdict",
]  # fmt: skip
# the README's headline columns with their arrows (report.summary), plus scene precision
HEADERS = {column: f"{header} {arrow}" for header, column, _, arrow in HEADLINE_QUALITY}
HEADERS["scene_precision"] = "scene precision ↑"
LOWER_BETTER = frozenset(column for _, column, _, arrow in HEADLINE_QUALITY if arrow == "↓")
SCENE_COUNTS = ("claims", "correct", "facts", "covered")
# metric -> its value per image from a per-image table (distinctcap.evaluate.stage.PER_IMAGE)
PER_IMAGE_VALUES: dict[str, Callable[[pd.DataFrame], pd.Series]] = {
    "r_at_1": lambda t: (t.clip_rank <= 1).astype(float),  # the hit of R@1 (recall_at_k)
    "mean_rank": lambda t: t.clip_rank.astype(float),
    "clipscore": lambda t: t.clipscore.astype(float),
}


def first_captions(generated: pd.DataFrame) -> pd.Series:
    """image_id -> its first caption (sample 0) of a generated table."""
    return generated.sort_values(["image_id", "sample"]).groupby("image_id").text.first()


def cider_scores(texts: pd.Series, refs: dict[int, list[str]]) -> np.ndarray:
    """CIDEr-D of each image's caption (texts indexed by image id) against its references."""
    scorer = CiderD([refs[i] for i in texts.index])
    return np.array([scorer.score(t, refs[i]) for i, t in texts.items()])


def scene_counts(texts: pd.Series, scenes: pd.Series) -> np.ndarray:
    """(images, 4) claims, correct, facts, covered of each caption against its scene."""
    rows = []
    for image_id, text in texts.items():
        scene = scenes[image_id]
        counts = score_caption(text, json.loads(scene) if isinstance(scene, str) else scene)
        rows.append([counts[k] for k in SCENE_COUNTS])
    return np.array(rows, dtype=float).reshape(-1, len(SCENE_COUNTS))


def micro_precision(sums: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums[..., 1] / sums[..., 0]


def micro_f1(sums: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        p, r = sums[..., 1] / sums[..., 0], sums[..., 3] / sums[..., 2]
        return np.where(p + r > 0, 2 * p * r / (p + r), 0.0)


def paired_bootstrap(
    ours: np.ndarray,
    reference: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float, float, float]:
    """(ours, reference, difference, ci_low, ci_high) of statistic(ours) - statistic(reference)
    where `statistic` maps summed per-image rows (..., k) of a resample to a value; per-image
    arrays are (images, k), paired by row."""
    n = len(ours)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    a, b = statistic(ours.sum(0)), statistic(reference.sum(0))
    diffs = statistic(ours[idx].sum(1)) - statistic(reference[idx].sum(1))
    tail = (1 - level) / 2 * 100
    finite = diffs[np.isfinite(diffs)]  # NaN: e.g. precision of a resample without claims
    low, high = np.percentile(finite, [tail, 100 - tail]) if finite.size else (np.nan, np.nan)
    return float(a), float(b), float(a - b), float(low), float(high)


def mean_statistic(n: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda sums: sums[..., 0] / n


def verdict(low: float, high: float, lower_better: bool = False) -> str:
    """Better / worse only where the interval of run minus reference excludes 0: above 0 is
    better for a higher-better metric, below 0 for a lower-better one (mean rank)."""
    if np.isnan(low) or np.isnan(high):
        return "undefined"
    if low > 0 or high < 0:
        return "better" if (low > 0) != lower_better else "worse"
    return "no significant difference"


def per_image_scores(
    ours: pd.DataFrame, theirs: pd.DataFrame, shared: pd.Index
) -> dict[str, tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], np.ndarray]]]:
    """metric -> (run's, reference's (images, 1) values on `shared`, mean statistic) for each of
    `PER_IMAGE_VALUES`, from two per-image tables (image_id, clip_rank, clipscore)."""
    a, b = ours.set_index("image_id").loc[shared], theirs.set_index("image_id").loc[shared]
    return {
        metric: (value(a).to_numpy()[:, None], value(b).to_numpy()[:, None],
                 mean_statistic(len(shared)))
        for metric, value in PER_IMAGE_VALUES.items()
    }  # fmt: skip


def compare_runs(
    generated: dict[tuple[str, str, str], pd.DataFrame],
    captions: pd.DataFrame,
    images: pd.DataFrame,
    reference: str,
    runs: dict | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    per_image: dict[tuple[str, str, str], pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """One row per (run, decoding, split, metric) against `reference` under the same split and
    decoding, runs in report order (`runs`: the config's blocks); `generated` and `per_image`
    map (run, split, decoding) to its generated table and its evaluate per-image table (R@1,
    mean rank, CLIPScore; left out where either side has none). Images: those both runs
    captioned (and, for the per-image metrics, both tables hold)."""
    per_image = per_image or {}
    refs = captions.groupby("image_id").text.agg(list).to_dict()
    scenes = images.set_index("image_id").scene if "scene" in images.columns else None
    rows = []
    for (run, split, decoding), table in generated.items():
        base = generated.get((reference, split, decoding))
        if run == reference or base is None:
            continue
        ours, theirs = first_captions(table), first_captions(base)
        shared = ours.index.intersection(theirs.index)
        ours, theirs = ours[shared], theirs[shared]
        scores = {
            "cider": (
                cider_scores(ours, refs)[:, None], cider_scores(theirs, refs)[:, None],
                mean_statistic(len(shared)),
            )
        }
        a, b = per_image.get((run, split, decoding)), per_image.get((reference, split, decoding))
        if a is not None and b is not None:
            both = shared.intersection(a.image_id).intersection(b.image_id)
            scores |= per_image_scores(a, b, both)
        if scenes is not None:
            a, b = scene_counts(ours, scenes), scene_counts(theirs, scenes)
            scores |= {"scene_precision": (a, b, micro_precision), "scene_f1": (a, b, micro_f1)}
        for metric, (a, b, statistic) in scores.items():
            value, ref, diff, low, high = paired_bootstrap(a, b, statistic, n_boot, seed)
            rows.append([run, decoding, split, metric, value, ref, diff, low, high,
                         verdict(low, high, metric in LOWER_BETTER)])
    table = pd.DataFrame(rows, columns=COLUMNS)
    order = {name: i for i, name in enumerate(run_order(runs or {r: {} for r in table.run}))}
    position = np.argsort(table.run.map(order).to_numpy(), kind="stable")
    return table.iloc[position].reset_index(drop=True)


def cell(row: pd.Series) -> str:
    if row.verdict == "undefined":
        return "n/a"
    sign = {"better": " **better**", "worse": " **worse**"}.get(row.verdict, "")
    return f"{row.difference:+.3f} [{row.ci_low:+.3f}, {row.ci_high:+.3f}]{sign}"


def wide(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): one row per run and decoding, one difference cell per metric."""
    metrics = list(dict.fromkeys(table.metric))
    headers = ["run", "decoding", *(HEADERS.get(m, m) for m in metrics)]
    rows = []
    for (run, decoding), group in table.groupby(["run", "decoding"], sort=False):
        by_metric = group.set_index("metric")
        rows.append([run, decoding, *(cell(by_metric.loc[m]) if m in by_metric.index else "-"
                                      for m in metrics)])
    return headers, rows


def markdown(table: pd.DataFrame, reference: str) -> str:
    headers, rows = wide(table)
    lines = [
        f"Difference against the MLE reference `{reference}` (run minus reference, same images,"
        " split and decoding) with its paired bootstrap 95 % interval; **better** / **worse**"
        " only where the interval excludes 0 (↓: lower is better, a negative difference is"
        " better).",
        "",
        "| " + " | ".join(headers) + " |",
        "|---" * len(headers) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    return "\n".join(lines) + "\n"



def write_versus(table: pd.DataFrame, reference: str, csv: Path, md: Path, tex: Path) -> None:
    with atomic_path(csv) as tmp:
        table.round(6).to_csv(tmp, index=False)
    with atomic_path(md) as tmp:
        tmp.write_text(markdown(table, reference))
    headers, rows = wide(table)
    caption = f"Difference against the MLE reference {reference}, paired bootstrap 95% CI"
    with atomic_path(tex) as tmp:
        tmp.write_text(latex(headers, rows, caption))
