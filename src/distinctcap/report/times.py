"""Where the time goes: the per-rule table from Snakemake's benchmark files (rule
`report_times`, `make times`).

Every rule writes `benchmarks/<rule>.tsv` (one job) or `benchmarks/<rule>/<wildcards>.tsv`
(one per job): Snakemake's record of the job's wall seconds (`s`), peak resident memory in MB
(`max_rss`, the job's process tree) and CPU seconds (`cpu_time`, user + system of the tree,
sampled while it runs). The rule is the first path component. Wall seconds of jobs that ran
side by side overlap, so the sum of wall seconds exceeds the run's wall clock on several cores.
CPU seconds move with the machine's load too (a job's threads spin while they wait for a core),
so compare them only between runs of one sitting on one quiet machine (docs/performance.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from distinctcap.core.io import atomic_path
from distinctcap.core.usage import read_usage

COLUMNS = {"s": "wall_s", "cpu_time": "cpu_s", "max_rss": "max_rss_mb"}


def read_benchmarks(root: str | Path) -> pd.DataFrame:
    """One row per job: rule, job (the file's path under root), wall_s, cpu_s, max_rss_mb
    (NaN where Snakemake could not sample a very short job)."""
    root = Path(root)
    rows = []
    for path in sorted(root.rglob("*.tsv")):
        record = pd.read_csv(path, sep="\t", na_values=["NA", "-"])
        record = record.reindex(columns=list(COLUMNS)).rename(columns=COLUMNS).mean()
        job = path.relative_to(root).with_suffix("")
        rows.append({"rule": job.parts[0], "job": str(job), **record.to_dict()})
    return pd.DataFrame(rows, columns=["rule", "job", *COLUMNS.values()])


def read_usages(logs: str | Path) -> pd.DataFrame:
    """One row per job log under `logs` with a `usage:` line (core.usage): log (its path
    under `logs`, without .log), wall_s, cpu_s, peak_rss_mb, children_peak_rss_mb, written_mb."""
    logs = Path(logs)
    rows = []
    for path in sorted(logs.rglob("*.log")):
        used = read_usage(path)
        if used:
            rows.append({"log": str(path.relative_to(logs).with_suffix("")), **used})
    return pd.DataFrame(rows)


def rule_table(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per rule: jobs, sum and max of wall and CPU seconds, the largest peak memory; the
    costliest rule first, then a `total` row."""
    per_rule = jobs.groupby("rule").agg(
        jobs=("job", "size"),
        wall_sum_s=("wall_s", "sum"),
        wall_max_s=("wall_s", "max"),
        cpu_sum_s=("cpu_s", "sum"),
        cpu_max_s=("cpu_s", "max"),
        max_rss_mb=("max_rss_mb", "max"),
    )
    per_rule = per_rule.sort_values("wall_sum_s", ascending=False)
    total = per_rule.agg(
        {"jobs": "sum", "wall_sum_s": "sum", "wall_max_s": "max", "cpu_sum_s": "sum",
         "cpu_max_s": "max", "max_rss_mb": "max"}
    )
    return pd.concat([per_rule, total.to_frame("total").T]).rename_axis("rule").reset_index()


def markdown(table: pd.DataFrame) -> str:
    """The table as Markdown, seconds to 0.1 s and memory in whole MB."""
    header = (
        "| rule | jobs | wall sum (s) | wall max (s) | CPU sum (s) | CPU max (s) | peak RSS (MB) |"
    )
    lines = [header, "|---|---|---|---|---|---|---|"]
    for row in table.itertuples(index=False):
        cells = [row.rule, f"{int(row.jobs)}"]
        cells += [_number(v, ".1f") for v in (row.wall_sum_s, row.wall_max_s, row.cpu_sum_s,
                                               row.cpu_max_s)]
        cells.append(_number(row.max_rss_mb, ".0f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _number(value: float, fmt: str) -> str:
    return "-" if pd.isna(value) else format(value, fmt)


def write_times(root: str | Path, out_markdown: str | Path, out_csv: str | Path) -> None:
    """The per-rule table of every benchmark under `root`, as Markdown and CSV."""
    table = rule_table(read_benchmarks(root))
    with atomic_path(out_markdown) as tmp:
        Path(tmp).write_text(markdown(table))
    with atomic_path(out_csv) as tmp:
        table.to_csv(tmp, index=False)


if __name__ == "__main__":  # make times: python -m distinctcap.report.times [BENCHMARKS_DIR]
    found = read_benchmarks(sys.argv[1] if len(sys.argv) > 1 else "benchmarks")
    if found.empty:
        sys.exit("no benchmark files yet: run the pipeline first (make run)")
    sys.stdout.write(markdown(rule_table(found)))
