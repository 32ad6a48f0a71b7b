"""Each run against the MLE reference with paired bootstrap confidence intervals over the test
images (rule `versus_reference`: versus.csv, versus.md, versus.tex).

A difference counts as better or worse only where its 95 % interval excludes 0; otherwise it
reads "no significant difference", so noise (e.g. 3.10e-10 vs 3.01e-10) is never a win.
Scores per image, of each image's first caption (greedy, best beam or first sample), on the
same images for run and reference:
- CIDEr-D (distinctcap.scores.cider, the references of the scored images as its corpus, on
  whitespace tokens: the shapes captions have no punctuation; on COCO it differs slightly from
  the PTB-tokenised summary value), the statistic is the mean over images;
- R@1, mean rank and CLIPScore, from the evaluate rule's per-image table (clip_rank: the
  1-based CLIP rank of the image by its caption among the split's images; clipscore, Hessel
  et al. 2021 eq. 1): the statistic is the mean over images of the hit 1[clip_rank <= 1], of
  clip_rank and of clipscore, so the full sample gives the summary's r_at_1, mean_rank and
  clipscore. Mean rank is lower-better: its difference is better where the interval lies
  below 0 (`LOWER_BETTER`);
- the independent judges' R@1, mean rank and CLIPScore (issue 45), where both per-image tables
  hold them: the judge CLIP's (judge_rank, judge_clipscore; as the trainer's CLIP's) and, on
  the shapes world, scene retrieval's (scene_top1: the probability that the image ranks first
  under random tie order, whose mean is scene_r_at_1; scene_rank: the expected rank under it).
  Below the table a line per run says whether its trainer-CLIP gains survive the judges
  (report.judged);
- scene precision and F1 (shapes world): claim and fact counts per image, the statistic is
  the micro average over the resampled images, as in the summary;
- the field's CIDErBtw (lower-better) and DisWordRate (distinctcap.scores.distinctive, on
  whitespace tokens as CIDEr-D here) of each image's caption, its similar images those of the
  evaluate stage (evaluate.distinctive: the K most similar among the images both models
  captioned) in each image space given (`spaces`: the judge CLIP's pooled features, where the
  rule has them) and, on the shapes world, by the scene graphs (`cider_btw_scene`,
  `dis_word_rate_scene`); the statistic is the mean over images.
Bootstrap (Efron & Tibshirani 1993, percentile interval): `n_boot` resamples of the images
with replacement, the same resample for run and reference (paired), seeded. A run trained over
several seeds (config.rungraph.seed_runs) is compared seed by seed with the reference of the same
seed and resampled over seeds and images (`seed_bootstrap`, docs/seeds.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from distinctcap.core.io import atomic_path
from distinctcap.data.scene import score_caption
from distinctcap.data.scene_retrieval import scene_key_matrix
from distinctcap.evaluate.headline import FIELD_METRICS, HEADLINE_QUALITY
from distinctcap.report.judged import LOWER_BETTER, judge_line
from distinctcap.report.summary import JUDGE_METRICS, latex, run_order
from distinctcap.scores.cider import CiderD
from distinctcap.scores.distinctive import SIMILAR_K, cider_btw, dis_word_rate, similar_images

COLUMNS = [
    "run", "decoding", "split", "metric", "value", "reference_value", "difference",
    "ci_low", "ci_high", "verdict",
]  # fmt: skip
# the README's headline columns and the judges' with their arrows (evaluate.headline,
# report.summary), plus scene precision; LOWER_BETTER (report.judged): the mean ranks
HEADERS = {column: f"{header} {arrow}"
           for header, column, _, arrow, *_ in (*HEADLINE_QUALITY, *JUDGE_METRICS)}  # fmt: skip
HEADERS |= {column: f"{header} {arrow}" for header, column, _, arrow in FIELD_METRICS}
HEADERS["scene_precision"] = "scene precision ↑"
SCENE_COUNTS = ("claims", "correct", "facts", "covered")
# metric -> (the per-image table's column, its value per image) (distinctcap.evaluate.device.
# PER_IMAGE): the trainer's CLIP (clip_rank, clipscore), the judge CLIP (judge_rank,
# judge_clipscore) and the scene judge (scene_rank: the expected rank under random tie order,
# scene_top1: the probability of rank 1 under it, whose mean is scene_r_at_1)
PER_IMAGE_VALUES: dict[str, tuple[str, Callable[[pd.Series], pd.Series]]] = {
    "r_at_1": ("clip_rank", lambda rank: (rank <= 1).astype(float)),  # R@1's hit (recall_at_k)
    "mean_rank": ("clip_rank", lambda rank: rank.astype(float)),
    "clipscore": ("clipscore", lambda score: score.astype(float)),
    "judge_r_at_1": ("judge_rank", lambda rank: (rank <= 1).astype(float)),
    "judge_mean_rank": ("judge_rank", lambda rank: rank.astype(float)),
    "judge_clipscore": ("judge_clipscore", lambda score: score.astype(float)),
    "scene_r_at_1": ("scene_top1", lambda top1: top1.astype(float)),
    "scene_mean_rank": ("scene_rank", lambda rank: rank.astype(float)),
}
# the trainer's CLIP columns every per-image table has; a judge's metric only where both tables
# hold its column with finite values (a config without that judge)
ALWAYS = frozenset({"clip_rank", "clipscore"})
# an image space of the similar images: the images' ids -> their rows (ids, D)
Space = Callable[[list[int]], np.ndarray]


def first_captions(generated: pd.DataFrame) -> pd.Series:
    """image_id -> its first caption (sample 0) of a generated table."""
    return generated.sort_values(["image_id", "sample"]).groupby("image_id").text.first()


def cider_scores(texts: pd.Series, refs: dict[int, list[str]]) -> np.ndarray:
    """CIDEr-D of each image's caption (texts indexed by image id) against its references."""
    references = [refs[i] for i in texts.index]
    return CiderD(references).score_each(list(texts), references)


def field_scores(
    ours: pd.Series, theirs: pd.Series, refs: dict[int, list[str]], spaces: dict[str, Space]
) -> dict[str, Scores]:
    """cider_btw<suffix> and dis_word_rate<suffix> (module docstring) of both models' captions
    (indexed by the same image ids) in each image space of `spaces` (column suffix -> Space)."""
    ids = [int(i) for i in ours.index]
    if len(ids) < 2:
        return {}
    split_refs = {i: refs[i] for i in ids}
    scorer = CiderD(split_refs.values())
    statistic = mean_statistic(len(ids))
    out = {}
    for suffix, space in spaces.items():
        near = similar_images(ids, space(ids), min(SIMILAR_K, len(ids) - 1))
        for name, metric in (("cider_btw", cider_btw), ("dis_word_rate", dis_word_rate)):
            options = {"scorer": scorer} if name == "cider_btw" else {}
            a, b = (metric(texts.to_dict(), split_refs, near, **options).per_image
                    for texts in (ours, theirs))  # fmt: skip
            out[name + suffix] = (np.array([[a[i]] for i in ids]),
                                  np.array([[b[i]] for i in ids]), statistic)  # fmt: skip
    return out


def scene_space(scenes: pd.Series) -> Space:
    """The scene graphs' image space (data.scene_retrieval.scene_key_matrix)."""
    return lambda ids: scene_key_matrix(scenes.loc[ids].tolist())


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
    low, high = percentile_interval(diffs, level)
    return float(a), float(b), float(a - b), low, high


def percentile_interval(diffs: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval of bootstrap differences; NaN ones (e.g. precision of a
    resample without claims) left out."""
    tail = (1 - level) / 2 * 100
    finite = diffs[np.isfinite(diffs)]
    low, high = np.percentile(finite, [tail, 100 - tail]) if finite.size else (np.nan, np.nan)
    return float(low), float(high)


Scores = tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], np.ndarray]]


def seed_bootstrap(
    per_seed: list[Scores], n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float, float, float]:
    """`paired_bootstrap` over seeds and images (docs/seeds.md): the run's and the
    reference's per-image rows of each seed (the same seed trained both), two-stage: each
    resample draws as many seeds as there are, with replacement, and for each drawn seed a
    resample of its images, the same for run and reference; its difference is the mean over
    the drawn seeds of statistic(run) - statistic(reference). Values: means over seeds."""
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, len(per_seed), size=(n_boot, len(per_seed)))
    diffs = np.empty(drawn.shape)
    for index, (ours, reference, statistic) in enumerate(per_seed):
        slots = drawn == index
        idx = rng.integers(0, len(ours), size=(int(slots.sum()), len(ours)))
        diffs[slots] = statistic(ours[idx].sum(1)) - statistic(reference[idx].sum(1))
    a = np.mean([statistic(ours.sum(0)) for ours, _, statistic in per_seed])
    b = np.mean([statistic(reference.sum(0)) for _, reference, statistic in per_seed])
    low, high = percentile_interval(diffs.mean(1), level)
    return float(a), float(b), float(a - b), low, high


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
    `PER_IMAGE_VALUES` the two per-image tables (image_id, clip_rank, clipscore, and the
    judges' columns where evaluated) both hold (`measured`)."""
    a, b = ours.set_index("image_id").loc[shared], theirs.set_index("image_id").loc[shared]
    return {
        metric: (value(a[column]).to_numpy()[:, None], value(b[column]).to_numpy()[:, None],
                 mean_statistic(len(shared)))
        for metric, (column, value) in PER_IMAGE_VALUES.items() if measured(column, a, b)
    }  # fmt: skip


def measured(column: str, *tables: pd.DataFrame) -> bool:
    """Whether every table holds `column`: the trainer's CLIP always, a judge's where each
    table has it with finite values."""
    if column in ALWAYS:
        return True
    return all(column in t and np.isfinite(pd.to_numeric(t[column]).astype(float)).all()
               for t in tables)  # fmt: skip


def compare_runs(
    generated: dict[tuple[str, str, str], pd.DataFrame],
    captions: pd.DataFrame,
    images: pd.DataFrame,
    reference: str,
    runs: dict | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    per_image: dict[tuple[str, str, str], pd.DataFrame] | None = None,
    seed_of: dict | None = None,
    spaces: dict[str, Space] | None = None,
) -> pd.DataFrame:
    """One row per (run, decoding, split, metric) against `reference` under the same split and
    decoding, runs in report order (`runs`: the config's blocks); `generated` and `per_image`
    map (model, split, decoding) to its generated table and its evaluate per-image table (R@1,
    mean rank, CLIPScore; left out where either side has none). Images: those both models
    captioned (and, for the per-image metrics, both tables hold). A run over several seeds
    (`seed_of`: model -> (run, seed)) is one row per metric: each seed against the reference
    of that seed (`seed_pairs`), its interval over seeds and images (`seed_bootstrap`), and an
    `n_seeds` column says how many seeds. `spaces`: image spaces of the similar images beside
    the scene graphs' (column suffix -> Space; "" the judge CLIP's)."""
    per_image = per_image or {}
    refs = captions.groupby("image_id").text.agg(list).to_dict()
    scenes = images.set_index("image_id").scene if "scene" in images.columns else None
    spaces = {**(spaces or {}), **({"_scene": scene_space(scenes)} if scenes is not None else {})}
    rows = []
    for (run, split, decoding), pairs in seed_pairs(generated, reference, seed_of or {}).items():
        scores = [
            pair_scores(generated[ours], generated[theirs], refs, scenes,
                        per_image.get(ours), per_image.get(theirs), spaces)
            for ours, theirs in pairs
        ]  # fmt: skip
        for metric in scores[0]:
            per_seed = [s[metric] for s in scores if metric in s]
            value, ref, diff, low, high = (
                paired_bootstrap(*per_seed[0], n_boot, seed) if len(per_seed) == 1
                else seed_bootstrap(per_seed, n_boot, seed)
            )  # fmt: skip
            rows.append([run, decoding, split, metric, value, ref, diff, low, high,
                         verdict(low, high, metric in LOWER_BETTER), len(per_seed)])
    table = pd.DataFrame(rows, columns=[*COLUMNS, "n_seeds"])
    if not (table.n_seeds > 1).any():
        table = table.drop(columns="n_seeds")  # one seed: today's table
    order = {name: i for i, name in enumerate(run_order(runs or {r: {} for r in table.run}))}
    position = np.argsort(table.run.map(order).to_numpy(), kind="stable")
    return table.iloc[position].reset_index(drop=True)


Key = tuple[str, str, str]  # (model, split, decoding)


def seed_pairs(keys, reference: str, seed_of: dict) -> dict[Key, list[tuple[Key, Key]]]:
    """(run, split, decoding) -> its (model, reference model) keys to compare: a run over
    several seeds pairs each seed with the reference's model of the same seed (seeds the
    reference lacks are left out); a run with one model is compared with the model
    `reference`, as before seeds. The reference's own rows are left out."""
    arm_seed = {key[0]: tuple(seed_of.get(key[0], (key[0], None))) for key in keys}
    reference_arm = arm_seed.get(reference, (reference, None))[0]
    models: dict[Key, list[Key]] = {}
    for model, split, decoding in keys:
        models.setdefault((arm_seed[model][0], split, decoding), []).append(
            (model, split, decoding))
    by_seed = {(arm_seed[m][1], s, d): (m, s, d) for m, s, d in keys
               if arm_seed[m][0] == reference_arm}  # fmt: skip
    pairs = {}
    for (run, split, decoding), own in models.items():
        if run == reference_arm:
            continue
        if len(own) == 1:
            partner = [(reference, split, decoding)] if (reference, split, decoding) in keys else []
        else:
            partner = [by_seed.get((arm_seed[m][1], split, decoding)) for m, _, _ in own]
        kept = [(o, p) for o, p in zip(own, partner, strict=False) if p is not None]
        if kept:
            pairs[(run, split, decoding)] = kept
    return pairs


def pair_scores(
    table: pd.DataFrame, base: pd.DataFrame, refs: dict, scenes: pd.Series | None,
    a: pd.DataFrame | None, b: pd.DataFrame | None, spaces: dict[str, Space] | None = None,
) -> dict[str, Scores]:
    """metric -> (model's, reference model's per-image rows, statistic) on the images both
    captioned: CIDEr-D, the per-image table's metrics (where both have one: `a`, `b`), on
    the shapes world scene precision and F1, and CIDErBtw and DisWordRate in each of
    `spaces` (`field_scores`)."""
    ours, theirs = first_captions(table), first_captions(base)
    shared = ours.index.intersection(theirs.index)
    ours, theirs = ours[shared], theirs[shared]
    scores = {
        "cider": (
            cider_scores(ours, refs)[:, None], cider_scores(theirs, refs)[:, None],
            mean_statistic(len(shared)),
        )
    }
    if a is not None and b is not None:
        both = shared.intersection(a.image_id).intersection(b.image_id)
        scores |= per_image_scores(a, b, both)
    if scenes is not None:
        a, b = scene_counts(ours, scenes), scene_counts(theirs, scenes)
        scores |= {"scene_precision": (a, b, micro_precision), "scene_f1": (a, b, micro_f1)}
    return scores | field_scores(ours, theirs, refs, spaces or {})


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
        rows.append([seeds_label(run, group), decoding,
                     *(cell(by_metric.loc[m]) if m in by_metric.index else "-"
                       for m in metrics)])  # fmt: skip
    return headers, rows


def seeds_label(run: str, rows: pd.DataFrame) -> str:
    """The run's label in the wide table: '<run> (n seeds)' for a run over several seeds."""
    n = int(rows.n_seeds.max()) if "n_seeds" in rows else 1
    return f"{run} ({n} seeds)" if n > 1 else run


SEEDS_NOTE = (
    " A run over several seeds (n seeds): each seed against the reference of the same seed,"
    " the mean difference over seeds, its interval from a bootstrap over seeds and images."
)


def markdown(table: pd.DataFrame, reference: str) -> str:
    headers, rows = wide(table)
    lines = [
        f"Difference against the MLE reference `{reference}` (run minus reference, same images,"
        " split and decoding) with its paired bootstrap 95 % interval; **better** / **worse**"
        " only where the interval excludes 0 (↓: lower is better, a negative difference is"
        " better)." + (SEEDS_NOTE if "n_seeds" in table else ""),
        "",
        "| " + " | ".join(headers) + " |",
        "|---" * len(headers) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
        *judges_lines(table),
    ]
    return "\n".join(lines) + "\n"


def judges_lines(table: pd.DataFrame) -> list[str]:
    """Under the table, one line per run and decoding with a trainer-CLIP gain that a judge
    re-measured: confirmed, or flagged (report.judged.judge_line)."""
    names = {metric: header.rsplit(" ", 1)[0] for metric, header in HEADERS.items()}
    lines = [f"- {seeds_label(run, group)} ({decoding}): {said}"
             for (run, decoding), group in table.groupby(["run", "decoding"], sort=False)
             if (said := judge_line(group, names))]  # fmt: skip
    if not lines:
        return []
    return ["", "The independent judges (judge CLIP, scene retrieval) on each gain under the "
            "trainer's CLIP: a judge's gain under half the CLIP's, or its interval including 0, "
            "is flagged.", "", *lines]



def write_versus(table: pd.DataFrame, reference: str, csv: Path, md: Path, tex: Path) -> None:
    with atomic_path(csv) as tmp:
        table.round(6).to_csv(tmp, index=False)
    with atomic_path(md) as tmp:
        tmp.write_text(markdown(table, reference))
    headers, rows = wide(table)
    caption = f"Difference against the MLE reference {reference}, paired bootstrap 95% CI"
    with atomic_path(tex) as tmp:
        tmp.write_text(latex(headers, rows, caption))
