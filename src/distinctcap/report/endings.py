"""SCST's bad endings over seeds (issue 58; docs/methods.md, "The end token in the CIDEr-D
reward"): for each arm, the share of its greedy and of its sampled test captions (every
sample) that end badly (`data.scene.ends_badly`, shapes world), and its greedy CIDEr-D, each
the mean ± sd over its models, `<arm>` and `<arm>_s<seed>` (`report.summary.seed_group`):

    python -m distinctcap.report.endings results scst scst_noend    # make scst-endings
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from distinctcap.core.io import read_table
from distinctcap.data.scene import ends_badly
from distinctcap.report.summary import markdown_table, seed_group

DECODINGS = ("greedy", "sample20")


def bad_ending_share(generated: pd.DataFrame) -> float:
    """The share of a generated table's captions (every sample) that end badly."""
    return float(generated.text.map(ends_badly).mean())


def model_endings(results: Path, model: str, split: str, decodings: Sequence[str]) -> dict:
    """One model's bad-ending share per decoding and greedy CIDEr-D (NaN where not written)."""
    row: dict[str, object] = {"arm": seed_group(model), "model": model}
    for decoding in decodings:
        path = results / "generated" / model / f"{split}-{decoding}.parquet"
        found = path.is_file()
        row[decoding] = bad_ending_share(read_table(path, "generated")) if found else math.nan
    metrics = results / "metrics" / model / f"{split}-greedy.parquet"
    row["cider"] = float(read_table(metrics).cider.iloc[0]) if metrics.is_file() else math.nan
    return row


def endings_table(
    results: Path, arms: Sequence[str], split: str = "test",
    decodings: Sequence[str] = DECODINGS,
) -> pd.DataFrame:  # fmt: skip
    """A row per model of `arms` under results/generated: arm, model, each decoding's
    bad-ending share, greedy CIDEr-D."""
    folder = results / "generated"
    models = sorted(p.name for p in folder.iterdir() if seed_group(p.name) in arms)
    rows = [model_endings(results, model, split, decodings) for model in models]
    return pd.DataFrame(rows, columns=["arm", "model", *decodings, "cider"])


def pooled(table: pd.DataFrame, arms: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): per arm, its models and each column's mean ± sd over them."""
    columns = [c for c in table.columns if c not in ("arm", "model")]
    headers = ["arm", "models", *(f"bad endings ({c})" for c in columns[:-1]), "greedy CIDEr"]
    rows = []
    for arm in arms:
        own = table[table.arm == arm]
        rows.append([arm, str(len(own)), *(_spread(own[c]) for c in columns)])
    return headers, rows


def _spread(values: pd.Series) -> str:
    values = values.dropna()
    if values.empty:
        return "-"
    return f"{values.mean():.3f}" + (f" ± {values.std():.3f}" if len(values) > 1 else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the results folder (generated/, metrics/)")
    parser.add_argument("arms", nargs="+", help="the arms to compare, e.g. scst scst_noend")
    args = parser.parse_args(argv)
    if not (args.results / "generated").is_dir():
        parser.error(f"{args.results / 'generated'} does not exist: decode the runs first")
    table = endings_table(args.results, args.arms)
    print(markdown_table(*pooled(table, args.arms)), end="")


if __name__ == "__main__":
    main()
