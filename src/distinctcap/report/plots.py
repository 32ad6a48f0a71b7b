"""The report's plots (rule `report_plots`): training curves of every run, metric bars per run
and decoding, and oracle CIDEr-D against the number of samples (UNKT Fig. 2).

matplotlib is imported on first use (`pyplot`), never at module level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from distinctcap.core.io import atomic_path
from distinctcap.report.summary import with_seeds


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | Path, dpi: int = 110) -> None:
    """Write the figure as a PNG (atomically) and close it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)


def _finish_panels(
    fig, axes, used: int, title: str, path: str | Path, shared_legend: bool = True
) -> None:
    """A grid of panels: blank the unused axes, one legend for all panels under the title
    (or each panel's own), title, save as PNG."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if shared_legend and handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(6, len(labels)), fontsize=8,
                   bbox_to_anchor=(0.5, 1 - 0.55 / fig.get_figheight()))
    fig.suptitle(title)
    top = 1 - (1.0 if shared_legend and handles else 0.5) / fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1, top))
    save_png(fig, path)


CURVE_SKIP = frozenset({"step", "epoch", "lr", "grad_norm", "tokens_per_s"})


def plot_training_curves(curves: dict[str, str | Path], path: str | Path) -> None:
    """One panel per run, from its curve.csv against the step: the training objective (`loss`)
    and validation loss on the left axis, its other validation columns (e.g. self-retrieval,
    the selection metric) dashed on the right."""
    plt = pyplot()
    tables = {run: pd.read_csv(p) for run, p in curves.items()}
    cols = min(4, len(tables))
    rows = math.ceil(len(tables) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (run, t) in zip(axes.flat, tables.items(), strict=False):
        for k, column in enumerate(c for c in ("loss", "val_loss") if c in t):
            sub = t[["step", column]].dropna()
            ax.plot(sub.step, sub[column], color=f"C{k}", label=column,
                    marker="." if len(sub) < 30 else None)
        others = [c for c in t.columns if c.startswith("val_") and c != "val_loss"
                  and t[c].notna().any()]
        if others:
            twin = ax.twinx()
            for k, column in enumerate(others, start=2):
                sub = t[["step", column]].dropna()
                twin.plot(sub.step, sub[column], "--", color=f"C{k}", label=column, marker=".")
            twin.tick_params(labelsize=7)
            lines = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
            ax.legend(lines[0][0] + lines[1][0], lines[0][1] + lines[1][1], fontsize=6)
        else:
            ax.legend(fontsize=6)
        ax.set_title(f"{run}: loss ↓ (its objective)", fontsize=9)
        ax.set_xlabel("optimiser step", fontsize=8)
        ax.grid(alpha=0.3)
    _finish_panels(fig, axes, len(tables), "Training curves, one panel per run (curve.csv)",
                   path, shared_legend=False)


BAR_METRICS = (  # (column, title with the direction that is better); values as computed
    ("cider", "CIDEr-D ↑"),
    ("bleu4", "BLEU-4 ↑"),
    ("meteor", "METEOR ↑"),
    ("spice", "SPICE ↑"),
    ("div1", "Div-1 (samples) ↑"),
    ("self_cider", "SelfCIDEr ↑"),
    ("distinct_corpus", "distinct captions ↑"),
    ("novelty", "novelty ↑"),
    ("vocab", "vocabulary ↑"),
    ("length", "length (words; neither)"),
    ("r_at_1", "CLIP R@1 ↑"),
    ("mean_rank", "CLIP mean rank ↓"),
    ("clipscore", "CLIPScore ↑"),
    ("self_r_at_1", "model self-R@1 ↑"),
    ("scene_f1", "scene F1 ↑"),
    ("oracle_cider_20", "oracle CIDEr (20) ↑"),
)
NOISE = 1e-6  # a panel whose values are all below this in size shows only noise


def informative(values: pd.Series) -> bool:
    """Worth a panel: some value present and not all of them zero up to noise (e.g. BLEU-4 of
    1e-10 on a run too short to match any 4-gram)."""
    values = values.dropna()
    return bool(len(values)) and float(values.abs().max()) > NOISE


def plot_metric_bars(
    metrics: pd.DataFrame, path: str | Path, order: Sequence[str] | None = None,
    versus: pd.DataFrame | None = None, seed_of: dict | None = None,
) -> None:
    """One panel per metric: a bar per run (in `order`, the front page's table order, where
    given), grouped by decoding, values on the metric's own scale; where `versus` has the
    run's paired bootstrap interval of its difference from the reference, an error bar spans
    that interval around the run's value. A run over several seeds (`seed_of`: model ->
    (run, seed)) is one bar at its mean over seeds, each seed's value a dot on it. Skipped
    metrics and those all zero up to noise are left out."""
    plt = pyplot()
    if seed_of:
        metrics = with_seeds(metrics, seed_of)
    several = bool(seed_of) and metrics.duplicated(["run", "split", "decoding"]).any()
    panels = [(m, t) for m, t in BAR_METRICS if m in metrics and informative(metrics[m])]
    present = list(dict.fromkeys(metrics.run))
    runs = [r for r in order if r in present] + [r for r in present if r not in order] \
        if order else present
    decodings = list(dict.fromkeys(metrics.split + "/" + metrics.decoding))
    cols = 4
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    width = 0.8 / max(1, len(decodings))
    x = np.arange(len(runs))
    for ax, (metric, title) in zip(axes.flat, panels, strict=False):
        for j, dec in enumerate(decodings):
            values, seeds = bar_heights(metrics, runs, dec, metric)
            errors = interval_errors(versus, runs, dec, metric, values)
            at = x + j * width - 0.4 + width / 2
            ax.bar(at, values, width, label=dec, yerr=errors,
                   error_kw={"elinewidth": 0.8, "capsize": 2})
            if several:
                ax.plot(at[seeds[0]], seeds[1], ".", color="black", ms=3, label="_seed")
        ax.set_xticks(x, runs, rotation=30, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    title = "Metrics per run (bars: split/decoding"
    title += "; dots: each seed" if several else ""
    title += "; error bars: 95 % interval of the difference from the reference)" if (
        versus is not None and len(versus)) else ")"
    _finish_panels(fig, axes, len(panels), title, path)


def bar_heights(
    metrics: pd.DataFrame, runs: Sequence[str], split_decoding: str, metric: str
) -> tuple[np.ndarray, tuple[list[int], np.ndarray]]:
    """Each run's bar under one split/decoding, its mean over its rows (its seeds), and every
    row as (run positions, values): the dots of a run over several seeds."""
    sub = metrics[metrics.split + "/" + metrics.decoding == split_decoding]
    sub = sub[sub.run.isin(runs)]
    means = sub.groupby("run")[metric].mean()
    heights = np.array([means.get(r, np.nan) for r in runs], dtype=float)
    return heights, ([list(runs).index(r) for r in sub.run], sub[metric].to_numpy(float))


def interval_errors(
    versus: pd.DataFrame | None, runs: Sequence[str], split_decoding: str, metric: str,
    values: np.ndarray,
) -> np.ndarray | None:
    """(2, runs) lower and upper error bar lengths: the interval of each run's difference from
    the reference (versus.csv) around its value; 0 where there is none."""
    if versus is None or versus.empty:
        return None
    split, decoding = split_decoding.split("/", 1)
    at = versus[(versus.split == split) & (versus.decoding == decoding)
                & (versus.metric == metric)].set_index("run")  # fmt: skip
    if at.empty:
        return None
    errors = np.zeros((2, len(runs)))
    for k, run in enumerate(runs):
        if run in at.index and np.isfinite(values[k]) and at.verdict[run] != "undefined":
            row = at.loc[run]
            errors[:, k] = row.difference - row.ci_low, row.ci_high - row.difference
    return errors


FOREST_COLOURS = {"better": "tab:green", "worse": "tab:red"}  # others grey


FOREST_TICKS = 3  # x ticks per panel at most: a 2.3-inch panel has room for 3 labels
FOREST_COLUMNS = 8  # panels a row: one row keeps the plot under the headline in 1000 px
FOREST_WIDTH = 13.8  # inches a row, about as wide as the front page: 6 panels of 2.3 inches


def plot_forest(
    versus: pd.DataFrame, order: Sequence[str], decoding: str, headers: dict, path: str | Path
) -> None:
    """The differences from the reference with their 95 % intervals (versus.csv), one panel per
    metric, one row per run in `order` (top to bottom), test split, `decoding`: green where the
    run is better, red where worse (the interval excludes 0), grey otherwise."""
    save_png(forest_figure(versus, order, decoding, headers), path)


def forest_figure(versus: pd.DataFrame, order: Sequence[str], decoding: str, headers: dict):
    """plot_forest's figure. Each panel has at most FOREST_TICKS x ticks: with matplotlib's
    choice, up to 7 labels such as -0.05 ... 0.01, the scene-precision panel's ran together."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()  # rows kept low: the plot must fit under the headline in a 1000 px window
    at = versus[(versus.decoding == decoding) & (versus.split == "test")]
    runs = [r for r in order if (at.run == r).any()]
    metrics = list(dict.fromkeys(at.metric))
    # at most FOREST_COLUMNS panels a row, in a row no wider than FOREST_WIDTH: the judges'
    # metrics (issue 45) made one row so wide that it was shown 70 px high, and the field's
    # (issue 58) a second row that pushed the plot below the window
    cols = min(FOREST_COLUMNS, max(1, len(metrics)))
    rows = math.ceil(max(1, len(metrics)) / cols)
    width = min(2.3 * cols, FOREST_WIDTH)
    fig, axes = plt.subplots(rows, cols, squeeze=False,
                             figsize=(width, rows * (0.35 + 0.14 * max(4, len(runs))) + 0.25))
    y = np.arange(len(runs))[::-1]
    for ax, metric in zip(axes.flat, metrics, strict=False):
        rows = at[at.metric == metric].set_index("run")
        for k, run in zip(y, runs, strict=True):
            if run not in rows.index or rows.verdict[run] == "undefined":
                continue
            r = rows.loc[run]
            colour = FOREST_COLOURS.get(r.verdict, "0.5")
            ax.plot([r.ci_low, r.ci_high], [k, k], color=colour, lw=2)
            ax.plot([r.difference], [k], "o", color=colour, ms=4)
        ax.axvline(0, color="black", lw=0.8)
        first = ax in axes[:, 0]
        ax.set_yticks(y, runs if first else [""] * len(runs), fontsize=6)
        ax.set_ylim(-0.6, len(runs) - 0.4)
        ax.set_title(headers.get(metric, metric), fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=FOREST_TICKS - 1, min_n_ticks=2))
        ax.grid(axis="x", alpha=0.3)
    for ax in axes.flat[len(metrics):] if metrics else []:
        ax.set_visible(False)
    if not metrics:
        ax = axes.flat[0]
        ax.text(0.5, 0.5, "no run to compare", ha="center", transform=ax.transAxes)
    fig.suptitle(f"Difference from the reference, 95 % interval ({decoding}, test; green "
                 "better, red worse, grey no clear difference)", fontsize=9)
    fig.tight_layout()
    return fig


def plot_cider_vs_n(curve_paths: Sequence[str | Path], path: str | Path) -> None:
    """Oracle CIDEr-D against the number of samples n, one line per run and decoding (UNKT
    Fig. 2)."""
    plt = pyplot()
    tables = [pd.read_csv(p) for p in curve_paths]
    tables = [t for t in tables if len(t)]
    fig, ax = plt.subplots(figsize=(6, 4))
    ns = sorted({int(n) for t in tables for n in t.n})
    for t in tables:
        r = t.iloc[0]
        ax.plot(t.n, t.cider, marker="o", label=f"{r.run} ({r.split}/{r.decoding})")
    if ns:
        ax.set_xscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
    if not tables:
        ax.text(0.5, 0.5, "no sampling decoding configured", ha="center", transform=ax.transAxes)
    ax.set(
        xlabel="samples per image n",
        ylabel="oracle CIDEr-D",
        title="CIDEr vs number of samples (UNKT Fig. 2)",
    )
    ax.grid(alpha=0.3)
    if tables:
        ax.legend(fontsize=7)
    save_png(fig, path)
