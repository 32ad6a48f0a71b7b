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
from distinctcap.core.runcard import list_runs
from distinctcap.evaluate.headline import (
    FIELD_METRICS,
    HEADLINE_DIVERSITY,
    HEADLINE_FIELD,
    HEADLINE_QUALITY,
)
from distinctcap.evaluate.metrics import DIVERSITY_METRICS, QUALITY_METRICS
from distinctcap.scores.result import KEYS

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
    "refclipscore",
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


# The independent judges' columns (issue 45), where the evaluation wrote them: the judge CLIP's
# after refclipscore, the scene-retrieval judge's (shapes world) after scene_f1.
JUDGE_CLIP_COLUMN = re.compile(r"judge_(r_at_\d+|mean_rank|clipscore|refclipscore)")
SCENE_JUDGE_COLUMN = re.compile(r"scene_(r_at_\d+|mean_rank)")


def summary_columns(metrics: pd.DataFrame) -> list[str]:
    """The summary's columns: the issue's named ones, the judge CLIP's present, the field's
    distinctiveness metrics present (CIDErBtw, DisWordRate), the oracle columns present,
    consensus, ppl, scene precision/recall/F1 and the scene judge's present."""
    oracle = [c for c in metrics.columns if c.startswith("oracle_")]
    judge = [c for c in metrics.columns if JUDGE_CLIP_COLUMN.fullmatch(c)]
    field = [column for _, column, _, _ in FIELD_METRICS if column in metrics.columns]
    scene = [c for c in metrics.columns if SCENE_JUDGE_COLUMN.fullmatch(c)]
    columns = [*SUMMARY_BASE, *judge, *field, *oracle, *CONSENSUS, *SUMMARY_TAIL, *scene]
    return list(dict.fromkeys(columns))  # once, should SUMMARY_BASE name a judge's column


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


def write_summary(
    metrics: pd.DataFrame, path: str | Path, seed_of: dict | None = None,
    seeds_path: str | Path | None = None,
) -> pd.DataFrame:
    """summary.csv, one row per (run, seed, split, decoding) (`with_seeds`), and, given
    `seeds_path`, summary_seeds.csv: each metric's mean and sd over a run's seeds
    (`seed_table`)."""
    table = with_seeds(summary_table(metrics), seed_of or {})
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False)
    if seeds_path is not None:
        with atomic_path(seeds_path) as tmp:
            seed_table(table).to_csv(tmp, index=False)
    return table


# ---------------------------------------------------------------------------------------------
# Seeds (issue 34, docs/seeds.md): a run trained over several seeds is one model per seed
# (distinctcap.config.rungraph.seed_runs); the tables pool its seeds into mean ± sd (n).

SEED = "seed"
GROUP = list(KEYS)  # what a run's seeds are pooled over: (run, split, decoding)


def with_seeds(summary: pd.DataFrame, seed_of: dict) -> pd.DataFrame:
    """The summary with `run` the configured run and a `seed` column after it, from `seed_of`
    (model name -> (run, seed), config.rungraph.seed_runs); a model it does not name keeps its
    name and an empty seed."""
    table = summary.copy()
    arms = {name: arm_seed[0] for name, arm_seed in seed_of.items()}
    seeds = {name: arm_seed[1] for name, arm_seed in seed_of.items()}
    table.insert(1, SEED, table.run.map(seeds).astype("Int64"))
    table["run"] = [arms.get(name, name) for name in table.run]
    return table


def seed_table(summary: pd.DataFrame) -> pd.DataFrame:
    """summary_seeds.csv: per (run, split, decoding), in the summary's order, each metric's
    mean (`<metric>_mean`) and sample standard deviation (`<metric>_sd`, empty with one seed)
    over its seed rows, and `n_seeds` (the rows pooled). Without a `seed` column every row is
    one seed."""
    values = [c for c in summary.columns if c not in (*GROUP, SEED)
              and pd.api.types.is_numeric_dtype(summary[c])]  # fmt: skip
    groups = summary.groupby(GROUP, sort=False)[values]
    pooled = pd.concat(
        [groups.mean().add_suffix("_mean"), groups.std().add_suffix("_sd")], axis=1
    )
    pooled = pooled[[f"{c}{end}" for c in values for end in ("_mean", "_sd")]].copy()
    pooled["n_seeds"] = summary.groupby(GROUP, sort=False).size()  # copied: one block, no warning
    return pooled.reset_index()


def spread(mean: float, sd: float, n: int, digits: int, with_n: bool = True) -> str:
    """A pooled cell: the mean alone with one seed (so one seed prints today's cell),
    'mean ± sd (n)' with several; '-' for no value."""
    if mean is None or pd.isna(mean):
        return "-"
    text = f"{mean:.{digits}f}"
    if n < 2:
        return text
    return f"{text} ± {sd:.{digits}f}" + (f" ({n})" if with_n else "")


def pooled_metrics(metrics: pd.DataFrame, seed_of: dict) -> pd.DataFrame:
    """The metrics tables (`read_metrics`) with each run's seeds pooled, for the paper-layout
    tables: one row per (run, split, decoding), each metric its mean over seeds beside
    `sd:<metric>` (a name no metric prefix matches) and `n_seeds`, `skipped` of its first
    seed; unchanged with one seed a run."""
    table = with_seeds(metrics, seed_of).drop(columns=SEED)
    pooled = seed_table(table)
    if (pooled.n_seeds < 2).all():
        return metrics
    skipped = table.groupby(GROUP, sort=False).skipped.first().to_numpy()
    names = {c: f"sd:{c.removesuffix('_sd')}" if c.endswith("_sd") else c.removesuffix("_mean")
             for c in pooled.columns}  # fmt: skip
    return pooled.rename(columns=names).assign(skipped=skipped)


def pooled_rows(summary: pd.DataFrame, split: str) -> pd.DataFrame:
    """`seed_table` of one split, indexed by (run, decoding), for `_cell`."""
    return seed_table(summary[summary.split == split]).set_index(["run", "decoding"])


# The independent judges (issue 45) beside the trainer's CLIP metric each re-measures: the judge
# CLIP (a second CLIP no training rule sees) and, on the shapes world, scene retrieval (the
# caption's parsed claims ranked against every image's true scene graph).
JUDGE_METRICS = (  # (header, column, decimals, direction, the trainer's CLIP column)
    ("judge R@1", "judge_r_at_1", 3, "↑", "r_at_1"),
    ("scene R@1", "scene_r_at_1", 3, "↑", "r_at_1"),
    ("judge mean rank", "judge_mean_rank", 1, "↓", "mean_rank"),
    ("scene mean rank", "scene_mean_rank", 1, "↓", "mean_rank"),
    ("judge CLIPScore", "judge_clipscore", 2, "↑", "clipscore"),
)
HEADLINE_JUDGES = ("judge_r_at_1", "scene_r_at_1", "judge_clipscore")  # after their CLIP column


def headline_quality(
    summary: pd.DataFrame, split: str = "test", quality: str = "greedy"
) -> list[tuple[str, str, int, str]]:
    """HEADLINE_QUALITY with each of HEADLINE_JUDGES right after the trainer's CLIP column it
    re-measures, then HEADLINE_FIELD, each where the summary has a value of it (split,
    decoding `quality`): a config without a judge keeps exactly HEADLINE_QUALITY."""
    rows = summary[(summary.split == split) & (summary.decoding == quality)]

    def has(column: str) -> bool:
        return column in rows and pd.to_numeric(rows[column], errors="coerce").notna().any()

    shown = [j for j in JUDGE_METRICS if j[1] in HEADLINE_JUDGES and has(j[1])]
    columns = []
    for header, column, digits, arrow in HEADLINE_QUALITY:
        columns.append((header, column, digits, arrow))
        columns += [judge[:4] for judge in shown if judge[4] == column]
    return columns + [field for field in HEADLINE_FIELD if has(field[1])]


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
    """(headers with their direction, rounded rows): one row per run in `run_order`, quality,
    retrieval and judge columns (`headline_quality`) of decoding `quality`, diversity columns
    of decoding `diversity`;
    a run over several seeds shows each cell's mean ± sd (n seeds) (`spread`)."""
    rows = pooled_rows(summary, split)
    n_samples = "".join(c for c in diversity if c.isdigit())
    samples = f" ({n_samples} samples)" if n_samples else ""  # none: greedy (make quick)
    shown = headline_quality(summary, split, quality)
    headers = ["run"] + [f"{h} {arrow}" for h, _, _, arrow in shown] + [
        f"{h}{samples} {arrow}" for h, _, _, arrow in HEADLINE_DIVERSITY
    ]
    table = []
    for name in run_order(runs):
        cells = [
            _cell(rows, (name, decoding), column, digits)
            for decoding, columns in ((quality, shown), (diversity, HEADLINE_DIVERSITY))
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
    rows = pooled_rows(summary, split)
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
    """The arm a hand-made repeat names: its name without a trailing _s<seed> (reference_s1 ->
    reference), issue 29's runs of presets/unkt-ablations.yaml; `seeds:` names its models the
    same way (config.rungraph.seed_name)."""
    return re.sub(r"_s\d+$", "", name)


def hand_made_arms(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with each hand-made repeat (`seed_group`) folded into its arm, so
    `seed_table` pools it (the adapter of issue 29's runs to the seeds tables)."""
    return summary.assign(run=summary.run.map(seed_group))


def seeds_markdown(summary: pd.DataFrame, runs: dict, split: str = "test") -> str:
    """Issue 29's table: the MLE reference and every unkt arm, its runs over seeds (`name`,
    `name_s1`, ...) pooled (`seed_table`): each column's mean and sample standard deviation
    over the seeds evaluated so far (n of them), mode (greedy, beam 3) and samples (20 an
    image)."""
    rows = pooled_rows(hand_made_arms(summary), split)
    reference = reference_run(runs)
    arms = [seed_group(n) for n in run_order(runs)
            if seed_group(n) == reference or runs[n].get("method") == "unkt"]  # fmt: skip
    headers = ["arm", "seeds"] + [f"{h} {a}" for h, *_, a in SEED_COLUMNS]
    table = [
        [arm, str(int(rows.n_seeds.get((arm, "greedy"), 0)))]
        + [_cell(rows, (arm, d), col, digits, with_n=False) for _, d, col, digits, _ in
           SEED_COLUMNS]
        for arm in dict.fromkeys(arms)
    ]  # fmt: skip
    return markdown_table(headers, table)


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
    models = [model_rows(summary, name, card["run"].get(SEED)) for name, card in cards.items()]
    rows = pooled_rows(pd.concat([summary.iloc[:0], *models]), split)
    headers = ["run", "method", "folder", f"CIDEr ({quality})", f"R@1 ({quality})"]
    table = [
        [name, cards[name]["method"], _folder(results, cards[name])]
        + [_cell(rows, (name, quality), column, 3) if not cards[name]["problem"] else "-"
           for column in ("cider", "r_at_1")]
        for name in run_order({n: c["run"] for n, c in cards.items()})
    ]
    return markdown_table(headers, table)


def model_rows(summary: pd.DataFrame, name: str, seed: int | None) -> pd.DataFrame:
    """The summary rows of one model folder `name` (its card's `seed`), named `name`: its
    run's rows of that seed (a model of a run over seeds, <run>_s<seed>, by its run)."""
    arm = name if name in set(summary.run) else seed_group(name)
    rows = summary[summary.run == arm]
    if SEED in rows and seed is not None and rows[SEED].notna().any():
        rows = rows[rows[SEED] == seed]
    return rows.assign(run=name)


def _folder(results: Path, card: dict) -> str:
    folder = str(results / "runs" / card["name"])
    return f"{folder} (stale: {card['problem']})" if card["problem"] else folder


def _cell(
    rows: pd.DataFrame, key: tuple[str, str], column: str, digits: int, with_n: bool = True
) -> str:
    """The cell of `column` for (run, decoding) `key` of `pooled_rows`: `spread`."""
    if key not in rows.index or f"{column}_mean" not in rows:
        return "-"
    row = rows.loc[key]
    return spread(row[f"{column}_mean"], row[f"{column}_sd"], int(row.n_seeds), digits, with_n)




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

def folder_summary(folder: Path, config: dict) -> pd.DataFrame:
    """summary.csv's rows from the metrics tables finished so far under `folder`
    (results/metrics; not the per-image tables), each model by its run and seed (`seed_runs`
    of the validated `config`)."""
    from distinctcap.config.rungraph import seed_runs

    tables = sorted(folder.glob("*/*.parquet"))
    tables = [p for p in tables if not p.name.endswith("-per_image.parquet")]
    seed_of = {name: (m.arm, m.seed) for name, m in seed_runs(config).items()}
    return with_seeds(summary_table(read_metrics(tables)), seed_of)


if __name__ == "__main__":  # make readme-table / unkt-ablation-table / unkt-seeds-table / seeds
    import argparse
    import sys

    from distinctcap.config.check import load_schema, validate
    from distinctcap.core.configfile import read_configs

    parser = argparse.ArgumentParser(description="README tables from a run's summary.csv")
    parser.add_argument("summary", help="summary.csv, or a metrics folder (results/metrics) "
                        "whose runs have not all finished")
    parser.add_argument("configs", nargs="+", help="the run's config files; later ones overlay")
    parser.add_argument("--unkt-ablation", action="store_true", help="the sampled-quality table")
    parser.add_argument("--seeds", action="store_true", help="issue 29's arms over seeds")
    args = parser.parse_args()
    config = validate(read_configs(args.configs), load_schema())
    runs = config["runs"]
    if Path(args.summary).is_dir():
        summary = folder_summary(Path(args.summary), config)
        runs = {name: block for name, block in runs.items() if name in set(summary.run)}
    else:
        summary = pd.read_csv(args.summary)
    table = sampled_quality_markdown if args.unkt_ablation else headline_markdown
    table = seeds_markdown if args.seeds else table
    sys.stdout.write(table(summary, runs))
