"""Each method against the MLE reference in one line, and the headline table with the
intervals beside its numbers: the report's front page and `distinctcap compare`.

The differences and intervals are those of rule versus_reference (versus.csv: paired bootstrap
95 % intervals over the test images, distinctcap.report.versus); nothing is recomputed here.
A metric counts as won or lost only where its interval excludes 0.

Light (pandas): the Snakefile's `--report` front page imports it while parsing.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from distinctcap.evaluate.headline import (
    FIELD_METRICS,
    HEADLINE_DIVERSITY,
    HEADLINE_FIELD,
    HEADLINE_QUALITY,
)
from distinctcap.report.judged import JUDGE_NAMES, judge_line
from distinctcap.report.summary import (
    HEADLINE_JUDGES,
    compare_table,
    headline_quality,
    headline_table,
    pick_decodings,
    read_summary,
    reference_run,
    run_order,
    summary_runs,
)

METRIC_NAMES = {column: header for header, column, _, _ in HEADLINE_QUALITY}
METRIC_NAMES["scene_precision"] = "scene precision"
METRIC_NAMES |= JUDGE_NAMES
METRIC_NAMES |= {column: header for header, column, _, _ in FIELD_METRICS}


def is_teacher(name: str, runs: dict) -> bool:
    """An MLE run other than the reference (trained on D- or D+ for UNKT)."""
    return runs[name].get("method", "mle") == "mle" and name != reference_run(runs)


def methods_first(runs: dict) -> list[str]:
    """Run names in the front page's order: the reference, the methods, then the teachers."""
    order = run_order(runs)
    return [n for n in order if not is_teacher(n, runs)] + [n for n in order if is_teacher(n, runs)]


def interval(row) -> str:
    return f"{row.difference:+.3f} [{row.ci_low:+.3f}, {row.ci_high:+.3f}]"


def verdict_line(run: str, rows: pd.DataFrame) -> str:
    """`smile: wins R@1 +0.050 [+0.020, +0.080]; loses CIDEr ...; no clear difference on ...`
    from one run's versus rows under one decoding, then what the independent judges say of its
    trainer-CLIP gains where they measured them (`judged.judge_line`: confirmed, or 'gain
    measured mainly by the CLIP it was tuned on')."""
    said = {kind: [f"{METRIC_NAMES.get(r.metric, r.metric)} {interval(r)}"
                   for r in rows.itertuples() if r.verdict == verdict]
            for kind, verdict in (("wins", "better"), ("loses", "worse"))}  # fmt: skip
    unclear = [METRIC_NAMES.get(r.metric, r.metric) for r in rows.itertuples()
               if r.verdict not in ("better", "worse")]  # fmt: skip
    parts = [f"{kind} {', '.join(items)}" for kind, items in said.items() if items]
    if unclear:
        parts.append("no clear difference on " + ", ".join(unclear))
    judged = judge_line(rows, METRIC_NAMES)
    if judged:
        parts.append(judged)
    return f"{run}: " + "; ".join(parts)


def verdict_lines(versus: pd.DataFrame, runs: dict, decoding: str) -> list[str]:
    """One line per method (not the MLE runs) of `runs` with versus rows under `decoding`."""
    at = versus[(versus.decoding == decoding) & (versus.split == "test")]
    return [verdict_line(name, at[at.run == name]) for name in methods_first(runs)
            if runs[name].get("method", "mle") != "mle" and (at.run == name).any()]  # fmt: skip


def versus_decoding(versus: pd.DataFrame, quality: str) -> str:
    """The decoding whose differences go beside the headline: its quality decoding if versus
    has it, else versus' first."""
    names = list(dict.fromkeys(versus.decoding))
    return quality if quality in names or not names else names[0]


# the front table's columns shown without the interval of their difference from the reference
BARE_ON_FRONT = {*HEADLINE_JUDGES, *(column for _, column, _, _ in HEADLINE_FIELD)}


def front_table(
    summary: pd.DataFrame, versus: pd.DataFrame | None, runs: dict, quality: str, diversity: str
) -> tuple[list[str], list[list[tuple[str, str, bool]]]]:
    """(headers, rows) of the headline table in `methods_first` order; each cell (value,
    interval of its difference from the reference or "", best in its column)."""
    headers, rows = headline_table(summary, runs, "test", quality, diversity)
    shown = headline_quality(summary, "test", quality)
    columns = [(c, arrow) for _, c, _, arrow in (*shown, *HEADLINE_DIVERSITY)]
    by_name = dict(zip(run_order(runs), rows, strict=True))
    names = methods_first(runs)
    ordered = [by_name[n] for n in names]
    best = [best_values([row[i + 1] for row in ordered], arrow)
            for i, (_, arrow) in enumerate(columns)]  # fmt: skip
    out = []
    for name, row in zip(names, ordered, strict=True):
        cells = [(row[0], "", False)]
        for i, (column, _) in enumerate(columns):
            # the judges' and the field metrics' intervals are in the verdict lines and
            # versus.md: beside every number they would push the table past a 1400 px window
            # and the forest plot below a 1000 px one
            interval = i < len(shown) and column not in BARE_ON_FRONT
            said = _interval_of(versus, name, column, quality) if interval else ""
            cells.append((row[i + 1], said, row[i + 1] in best[i]))
        out.append(cells)
    return headers, out


def best_values(cells: list[str], arrow: str) -> set[str]:
    """The best of a column's rounded values (lowest under ↓), as written; none where the
    column has no number or all are equal (nothing stands out)."""
    numbers = {c: float(c) for c in cells if _is_number(c)}
    if len(set(numbers.values())) < 2:
        return set()
    best = (min if arrow == "↓" else max)(numbers.values())
    return {c for c, v in numbers.items() if v == best}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _interval_of(versus: pd.DataFrame | None, run: str, column: str, decoding: str) -> str:
    if versus is None:
        return ""
    hit = versus[(versus.run == run) & (versus.metric == column) & (versus.decoding == decoding)
                 & (versus.split == "test")]  # fmt: skip
    if hit.empty or hit.verdict.iloc[0] == "undefined":
        return ""
    row = hit.iloc[0]
    return f"[{row.ci_low:+.3f},{row.ci_high:+.3f}]"  # no space: it wraps as one word


def read_versus(results: Path) -> pd.DataFrame | None:
    """results/report/versus.csv, or None before rule versus_reference has run."""
    path = results / "report" / "versus.csv"
    return pd.read_csv(path) if path.is_file() else None


def compare_text(results: Path) -> str:
    """`distinctcap compare`: the headline table, then each method's verdict against the
    reference (when versus.csv exists)."""
    summary = read_summary(results)
    quality, _ = pick_decodings(summary)
    text = compare_table(results)
    versus = read_versus(results)
    if versus is None or versus.empty:
        return text + "\n(no versus.csv yet: no intervals against the reference)\n"
    decoding = versus_decoding(versus, quality)
    lines = verdict_lines(versus, summary_runs(results, summary), decoding)
    head = (f"\nAgainst the reference ({decoding}, test split; difference [95 % paired "
            "bootstrap interval]; won or lost only where the interval excludes 0; metrics "
            "beyond the table's: docs/report.md):")
    return "\n".join([text + head, *(f"- {line}" for line in lines)]) + "\n"
