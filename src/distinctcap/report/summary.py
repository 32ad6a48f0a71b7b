"""The summary table (rule `summarize`) and the two helpers the rule file calls at DAG-parse
time: `evaluation_keys` (which evaluations exist) and `reference_run` (the MLE run the others
are compared with in the tables).

Imported while Snakemake parses the DAG, so it stays light: pandas and the metrics package's
name lists, never torch or matplotlib (hence no import of distinctcap.evaluate).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from distinctcap.errors import DistinctcapError
from distinctcap.io import atomic_path
from distinctcap.metrics import DIVERSITY_METRICS, QUALITY_METRICS
from distinctcap.metrics.result import KEYS

SUMMARY_BASE = (
    *KEYS,
    "bleu1",
    "bleu2",
    "bleu3",
    "bleu4",
    "meteor",
    "rouge_l",
    "cider",
    "spice",
    "div1",
    "div2",
    "mbleu4",
    "self_cider",
    "distinct",
    "novelty",
    "vocab",
    "length",
    "r_at_1",
    "r_at_5",
    "r_at_10",
    "mean_rank",
    "clipscore",
)
SUMMARY_TAIL = ("ppl", "scene_precision", "scene_recall", "scene_f1")
CONSENSUS = tuple(f"consensus_{m}" for m in (*QUALITY_METRICS, *DIVERSITY_METRICS))


def evaluation_keys(runs: Sequence[str], decoding: dict) -> list[tuple[str, str, str]]:
    """(run, split, decoding) of every evaluation: each run under each decoding setting, for
    each of the setting's splits (the decode stage's targets)."""
    return [
        (run, split, name)
        for run in runs
        for name, setting in decoding.items()
        for split in setting.get("splits", ["test"])
    ]


def reference_run(runs: dict) -> str | None:
    """The MLE reference: the run named `reference`, else the first mle run on all data."""
    if "reference" in runs:
        return "reference"
    mle = [n for n, r in runs.items() if r.get("method") == "mle" and r.get("data", "all") == "all"]
    return mle[0] if mle else None


def summary_columns(metrics: pd.DataFrame) -> list[str]:
    """The summary's columns: the issue's named ones, the oracle columns present, consensus,
    ppl and scene precision/recall/F1."""
    oracle = [c for c in metrics.columns if c.startswith("oracle_")]
    return [*SUMMARY_BASE, *oracle, *CONSENSUS, *SUMMARY_TAIL]


def summary_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, split, decoding) with exactly `summary_columns`."""
    dup = metrics.duplicated(list(KEYS))
    if dup.any():
        keys = metrics.loc[dup, list(KEYS)].to_dict("records")[:3]
        raise DistinctcapError(f"several metrics rows for {keys}")
    missing = [c for c in summary_columns(metrics) if c not in metrics.columns]
    if missing:
        raise DistinctcapError(f"metrics tables lack the columns {missing}")
    return metrics[summary_columns(metrics)].reset_index(drop=True)


def write_summary(metrics: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    table = summary_table(metrics)
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False)
    return table
