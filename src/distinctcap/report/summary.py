"""The summary table (rule `summarize`) and the two helpers the rule file calls at DAG-parse
time: `evaluation_keys` (which evaluations exist) and `reference_run` (the MLE run the others
are compared with in the tables).

Imported while Snakemake parses the DAG, so it stays light: pandas and the metrics package's
name lists, never torch or matplotlib (hence no import of distinctcap.evaluate.stage).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, read_table
from distinctcap.evaluate.metrics import DIVERSITY_METRICS, QUALITY_METRICS
from distinctcap.evaluate.metrics.result import KEYS
from distinctcap.runs.runcard import list_runs

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


# The README's headline table: (header, column, decimals, direction); quality on one decoding,
# diversity on a sampled one. Every value on its metric's own scale (fractions stay fractions).
HEADLINE_QUALITY = (
    ("BLEU-4", "bleu4", 3, "↑"), ("METEOR", "meteor", 3, "↑"), ("CIDEr", "cider", 3, "↑"),
    ("R@1", "r_at_1", 3, "↑"), ("mean rank", "mean_rank", 1, "↓"),
    ("CLIPScore", "clipscore", 2, "↑"), ("scene F1", "scene_f1", 3, "↑"),
)
HEADLINE_DIVERSITY = (("Div-2", "div2", 3, "↑"), ("distinct", "distinct", 3, "↑"))


def run_label(name: str, run: dict) -> str:
    """`reference (MLE)`, `teacher_neg (MLE on D-)`; other methods by their name alone."""
    if run.get("method", "mle") != "mle":
        return name
    data = run.get("data", "all")
    return f"{name} (MLE)" if data == "all" else f"{name} (MLE on {data})"


def headline_table(
    summary: pd.DataFrame, runs: dict, split: str = "test", quality: str = "greedy",
    diversity: str = "sample20",
) -> tuple[list[str], list[list[str]]]:
    """(headers with their direction, rounded rows): one row per run in `run_order`, quality
    and retrieval columns of decoding `quality`, diversity columns of decoding `diversity`."""
    rows = summary[summary.split == split].set_index(["run", "decoding"])
    n_samples = "".join(c for c in diversity if c.isdigit())
    samples = f" ({n_samples} samples)" if n_samples else ""  # none: greedy (make quick)
    headers = ["run"] + [f"{h} {arrow}" for h, _, _, arrow in HEADLINE_QUALITY] + [
        f"{h}{samples} {arrow}" for h, _, _, arrow in HEADLINE_DIVERSITY
    ]
    table = []
    for name in run_order(runs):
        cells = [
            _cell(rows, (name, decoding), column, digits)
            for decoding, columns in ((quality, HEADLINE_QUALITY), (diversity, HEADLINE_DIVERSITY))
            for _, column, digits, _ in columns
        ]
        table.append([run_label(name, runs[name]), *cells])
    return headers, table


def headline_markdown(
    summary: pd.DataFrame, runs: dict, split: str = "test", quality: str = "greedy",
    diversity: str = "sample20",
) -> str:
    """The README's results table from summary.csv (`headline_table` as markdown)."""
    return markdown_table(*headline_table(summary, runs, split, quality, diversity))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table of string cells, ending in a newline."""
    lines = ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


SAMPLED_QUALITY = (  # (header, decoding, column, digits, arrow)
    ("greedy CIDEr", "greedy", "cider", 3, "↑"), ("greedy R@1", "greedy", "r_at_1", 3, "↑"),
    ("beam-3 CIDEr", "beam3", "cider", 3, "↑"), ("beam-3 R@1", "beam3", "r_at_1", 3, "↑"),
    ("sampled CIDEr", "sample20", "cider", 3, "↑"),
    ("oracle CIDEr@20", "sample20", "oracle_cider_20", 3, "↑"),
    ("Div-2 (20 samples)", "sample20", "div2", 3, "↑"),
)


def sampled_quality_markdown(summary: pd.DataFrame, runs: dict, split: str = "test") -> str:
    """UNKT's sampled-quality ablation (docs/unkt-sampled-captions.md): the MLE reference
    and every unkt run, each with its mode (greedy, beam 3) and its samples (20 an image: their
    mean CIDEr-D, the oracle over them, Div-2)."""
    rows = summary[summary.split == split].set_index(["run", "decoding"])
    reference = reference_run(runs)
    names = [n for n in run_order(runs) if n == reference or runs[n].get("method") == "unkt"]
    headers = ["run"] + [f"{h} {a}" for h, *_, a in SAMPLED_QUALITY]
    table = [
        [run_label(name, runs[name])]
        + [_cell(rows, (name, d), col, digits) for _, d, col, digits, _ in SAMPLED_QUALITY]
        for name in names
    ]
    return markdown_table(headers, table)


SEED_COLUMNS = (*SAMPLED_QUALITY, ("mBLEU-4 (20 samples)", "sample20", "mbleu4", 3, "↓"))


def seed_group(name: str) -> str:
    """The arm a run repeats: its name without a trailing _s<seed> (reference_s1 -> reference)."""
    return re.sub(r"_s\d+$", "", name)


def seeds_markdown(summary: pd.DataFrame, runs: dict, split: str = "test") -> str:
    """Issue 29's table: the MLE reference and every unkt arm, its runs over seeds (`name`,
    `name_s1`, ...) pooled: each column's mean and sample standard deviation over the seeds
    evaluated so far (n of them), mode (greedy, beam 3) and samples (20 an image)."""
    rows = summary[summary.split == split].set_index(["run", "decoding"])
    reference = reference_run(runs)
    groups: dict[str, list[str]] = {}
    for name in run_order(runs):
        if seed_group(name) == reference or runs[name].get("method") == "unkt":
            groups.setdefault(seed_group(name), []).append(name)
    headers = ["arm", "seeds"] + [f"{h} {a}" for h, *_, a in SEED_COLUMNS]
    table = [
        [group, str(len(names))]
        + [_spread(rows, names, d, col, digits) for _, d, col, digits, _ in SEED_COLUMNS]
        for group, names in groups.items()
    ]
    return markdown_table(headers, table)


def _spread(rows: pd.DataFrame, names: Sequence[str], decoding: str, column: str, digits: int):
    """'mean ± sd' of a column over the runs `names` (sd only with two or more values)."""
    if column not in rows:
        return "-"
    values = [rows[column].get((n, decoding)) for n in names if (n, decoding) in rows.index]
    values = [v for v in values if v is not None and not pd.isna(v)]
    if not values:
        return "-"
    mean = f"{sum(values) / len(values):.{digits}f}"
    return mean if len(values) < 2 else f"{mean} ± {pd.Series(values).std():.{digits}f}"


def write_headline(summary: pd.DataFrame, runs: dict, csv: Path, md: Path, tex: Path) -> None:
    """The headline table of the test split as csv, markdown and LaTeX (rule summarize)."""
    quality, diversity = pick_decodings(summary)
    headers, rows = headline_table(summary, runs, "test", quality, diversity)
    with atomic_path(csv) as tmp:
        pd.DataFrame(rows, columns=headers).to_csv(tmp, index=False)
    with atomic_path(md) as tmp:
        tmp.write_text(headline_markdown(summary, runs, "test", quality, diversity))
    caption = f"Test split; {quality} decoding, diversity over {diversity}"
    with atomic_path(tex) as tmp:
        tmp.write_text(latex(headers, rows, caption, labels=1))


def run_order(runs: dict) -> list[str]:
    """Run names in reading order: the MLE reference, the other MLE runs (teachers), then the
    methods, each group in config order."""
    reference = reference_run(runs)
    mle = [n for n, r in runs.items() if r.get("method", "mle") == "mle" and n != reference]
    rest = [n for n in runs if n != reference and n not in mle]
    return [*([reference] if reference else []), *mle, *rest]


def read_summary(results: Path) -> pd.DataFrame:
    path = results / "metrics" / "summary.csv"
    if not path.is_file():
        raise DistinctcapError(
            f"{path} does not exist: run the pipeline first (make quick, make run), or pass "
            "--results pointing at an experiment's results folder"
        )
    return pd.read_csv(path)


def summary_runs(results: Path, summary: pd.DataFrame) -> dict:
    """{run: its config block} from the run cards, for every run of the summary."""
    cards = {card["name"]: card["run"] for card in list_runs(results)}
    return {name: cards.get(name, {"method": "?"}) for name in summary.run.unique()}


def pick_decodings(summary: pd.DataFrame) -> tuple[str, str]:
    """(quality decoding, diversity decoding): greedy and the most-sample setting present."""
    names = list(dict.fromkeys(summary.decoding))
    quality = "greedy" if "greedy" in names else names[0]
    sampled = sorted((n for n in names if n.startswith("sample")), key=lambda n: len(n))
    return quality, (sampled[-1] if sampled else quality)


def compare_table(results: Path, split: str = "test") -> str:
    """`distinctcap compare`: the headline table of a results folder."""
    summary = read_summary(results)
    quality, diversity = pick_decodings(summary)
    return headline_markdown(summary, summary_runs(results, summary), split, quality, diversity)


def run_table(results: Path, split: str = "test") -> str:
    """`distinctcap runs`: each finished run folder, its method and headline numbers; a
    folder that cannot caption (its model.pt gone, its card unreadable) is marked so and
    shows no numbers, which belonged to a model it no longer has."""
    cards = {card["name"]: card for card in list_runs(results)}
    if not cards:
        raise DistinctcapError(f"no finished runs under {results / 'runs'} (no run.json)")
    done = (results / "metrics" / "summary.csv").is_file()
    summary = read_summary(results) if done else pd.DataFrame(columns=[*KEYS, "cider", "r_at_1"])
    quality = pick_decodings(summary)[0] if done else "greedy"
    rows = summary[summary.split == split].set_index(["run", "decoding"])
    headers = ["run", "method", "folder", f"CIDEr ({quality})", f"R@1 ({quality})"]
    table = [
        [name, cards[name]["method"], _folder(results, cards[name])]
        + [_cell(rows, (name, quality), column, 3) if not cards[name]["problem"] else "-"
           for column in ("cider", "r_at_1")]
        for name in run_order({n: c["run"] for n, c in cards.items()})
    ]
    return markdown_table(headers, table)


def _folder(results: Path, card: dict) -> str:
    folder = str(results / "runs" / card["name"])
    return f"{folder} (stale: {card['problem']})" if card["problem"] else folder


def _cell(rows: pd.DataFrame, key: tuple[str, str], column: str, digits: int) -> str:
    value = rows[column].get(key) if key in rows.index else None
    return "-" if value is None or pd.isna(value) else f"{value:.{digits}f}"




def read_metrics(paths: Sequence[str | Path]) -> pd.DataFrame:
    """The metrics rows of several parquets, `skipped` decoded to dicts, sorted by the keys."""
    if not paths:
        raise DistinctcapError("no metrics tables to read")
    table = pd.concat([read_table(p) for p in paths], ignore_index=True)
    table["skipped"] = [json.loads(s) for s in table.skipped]
    return table.sort_values(list(KEYS), kind="stable").reset_index(drop=True)


def latex(
    headers: Sequence[str], rows: Sequence[Sequence[str]], caption: str, labels: int = 2
) -> str:
    """A booktabs table (arrows as $\\uparrow$/$\\downarrow$, bold as \\textbf)."""
    def tex(text: str) -> str:
        text = text.replace("\\", "\\textbackslash{}")
        for char in "&%$#_{}":
            text = text.replace(char, "\\" + char)
        text = text.replace("↑", "$\\uparrow$").replace("↓", "$\\downarrow$")
        parts = text.split("**")
        return "".join(f"\\textbf{{{p}}}" if i % 2 else p for i, p in enumerate(parts))

    spec = "l" * labels + "r" * (len(headers) - labels)
    body = [" & ".join(tex(c) for c in r) + " \\\\" for r in rows]
    return "\n".join([
        "\\begin{table}[t]", "\\centering", f"\\caption{{{tex(caption)}}}",
        f"\\begin{{tabular}}{{{spec}}}", "\\toprule", " & ".join(tex(h) for h in headers) + " \\\\",
        "\\midrule", *body, "\\bottomrule", "\\end{tabular}", "\\end{table}",
    ]) + "\n"  # fmt: skip

if __name__ == "__main__":  # make readme-table / make unkt-ablation-table
    import argparse
    import sys

    import yaml

    parser = argparse.ArgumentParser(description="README tables from a run's summary.csv")
    parser.add_argument("summary", help="summary.csv, or a metrics folder (results/metrics) "
                        "whose runs have not all finished")
    parser.add_argument("configs", nargs="+", help="the run's config files; later ones overlay")
    parser.add_argument("--unkt-ablation", action="store_true", help="the sampled-quality table")
    parser.add_argument("--seeds", action="store_true", help="arms over seeds: mean ± sd")
    args = parser.parse_args()
    runs: dict = {}
    for path in args.configs:
        runs |= yaml.safe_load(Path(path).read_text()).get("runs", {})
    if Path(args.summary).is_dir():
        tables = sorted(Path(args.summary).glob("*/*.parquet"))  # not the per-image tables
        tables = [p for p in tables if not p.name.endswith("-per_image.parquet")]
        summary = summary_table(read_metrics(tables))
        runs = {name: block for name, block in runs.items() if name in set(summary.run)}
    else:
        summary = pd.read_csv(args.summary)
    table = sampled_quality_markdown if args.unkt_ablation else headline_markdown
    table = seeds_markdown if args.seeds else table
    sys.stdout.write(table(summary, runs))
