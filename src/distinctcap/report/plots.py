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

from distinctcap.io import atomic_path


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


def _finish_panels(fig, axes, used: int, title: str, path: str | Path) -> None:
    """A grid of panels: blank the unused axes, legend on the first, title, save as PNG."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    save_png(fig, path)


CURVE_SKIP = frozenset({"step", "epoch", "lr", "grad_norm", "tokens_per_s"})


def plot_training_curves(curves: dict[str, str | Path], path: str | Path) -> None:
    """Each run's curve.csv against the step: the training objective (`loss`), every
    validation column and the objectives' own terms (e.g. UNKT's mle, pred, hid, att, lambda)."""
    plt = pyplot()
    tables = {run: pd.read_csv(p) for run, p in curves.items()}
    names = {c for t in tables.values() for c in t.columns if c not in CURVE_SKIP}
    vals = sorted(c for c in names if c.startswith("val_"))
    panels = ["loss", *vals, *sorted(names - {"loss", *vals})]
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    colour = {run: f"C{k % 10}" for k, run in enumerate(tables)}  # one colour per run
    for ax, panel in zip(axes.flat, panels, strict=False):
        for run, t in tables.items():
            if panel in t and t[panel].notna().any():
                sub = t[["step", panel]].dropna()
                marker = "." if len(sub) < 30 else None
                ax.plot(sub.step, sub[panel], label=run, color=colour[run], marker=marker)
        ax.set_title(panel if panel != "loss" else "loss (each run's objective)", fontsize=9)
        ax.set_xlabel("optimiser step", fontsize=8)
        ax.grid(alpha=0.3)
    _finish_panels(fig, axes, len(panels), "Training curves (curve.csv of each run)", path)


BAR_METRICS = (
    ("cider", "CIDEr-D", 1),
    ("bleu4", "BLEU-4", 1),
    ("meteor", "METEOR", 1),
    ("spice", "SPICE", 1),
    ("div1", "Div-1 (samples)", 1),
    ("self_cider", "SelfCIDEr", 1),
    ("distinct_corpus", "distinct captions %", 100),
    ("novelty", "novelty %", 100),
    ("vocab", "vocabulary", 1),
    ("length", "length (words)", 1),
    ("r_at_1", "CLIP R@1 %", 100),
    ("mean_rank", "CLIP mean rank", 1),
    ("clipscore", "CLIPScore x100", 100),
    ("self_r_at_1", "model self-R@1 %", 100),
    ("scene_f1", "scene F1 %", 100),
    ("oracle_cider_20", "oracle CIDEr (20)", 1),
)


def plot_metric_bars(metrics: pd.DataFrame, path: str | Path) -> None:
    """One panel per metric: a bar per run, grouped by decoding; skipped metrics left out."""
    plt = pyplot()
    panels = [(m, t, s) for m, t, s in BAR_METRICS if m in metrics and metrics[m].notna().any()]
    runs = list(dict.fromkeys(metrics.run))
    decodings = list(dict.fromkeys(metrics.split + "/" + metrics.decoding))
    cols = 4
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    width = 0.8 / max(1, len(decodings))
    x = np.arange(len(runs))
    for ax, (metric, title, scale) in zip(axes.flat, panels, strict=False):
        for j, dec in enumerate(decodings):
            sub = metrics[metrics.split + "/" + metrics.decoding == dec].set_index("run")
            values = [sub[metric].get(r, np.nan) * scale for r in runs]
            ax.bar(x + j * width - 0.4 + width / 2, values, width, label=dec)
        ax.set_xticks(x, runs, rotation=30, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    _finish_panels(fig, axes, len(panels), "Metrics per run (bars: split/decoding)", path)


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
