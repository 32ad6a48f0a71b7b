"""When each job of a Snakemake run ran, and how busy the cores were (`make timeline`).

Read from the run's own log (`.snakemake/log/*.snakemake.log` in the experiment folder): each
job's start (`[date]` then `rule NAME:` with its `jobid`, `wildcards` and `threads` lines,
threads 1 where the log prints none) and its end (`[date]` then `Finished jobid: N`). The
log's clock has whole seconds. Busy cores at a moment are the threads of the jobs running
then, at most `--cores`; the idle core-seconds are what a better schedule or a job's own
threads could still use (issue 46: an evaluate job holding both cores of a 2-core box kept
the trainings waiting).
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from distinctcap.report.plots import pyplot, save_png

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_RULE = re.compile(r"^(?:local)?rule (\w+):$")
_FIELD = re.compile(r"^\s+(jobid|wildcards|threads): (.*)$")
_FINISHED = re.compile(r"^Finished jobid: (\d+)")
_CORES = re.compile(r"^Provided cores: (\d+)$")


def latest_run(experiment: str | Path) -> tuple[Path, pd.DataFrame, int]:
    """The newest Snakemake log of an experiment folder that ran jobs, with its jobs and
    `--cores` (`read_jobs`). `make run` ends with the report's build, whose log has none."""
    folder = Path(experiment) / ".snakemake" / "log"
    for log in sorted(folder.glob("*.snakemake.log"), reverse=True):
        jobs, cores = read_jobs(log)
        if not jobs.empty and cores is not None:
            return log, jobs, cores
    raise FileNotFoundError(f"no Snakemake log under {folder} ran a job: run it first")


def read_jobs(log: str | Path) -> tuple[pd.DataFrame, int | None]:
    """The log's jobs (jobid, rule, wildcards, threads, start_s, end_s: seconds from the first
    start; end NaN for a job still running or killed) and its `--cores`."""
    jobs: dict[int, dict] = {}
    cores, stamp, current = None, None, None
    for line in Path(log).read_text().splitlines():
        if match := _CORES.match(line):
            cores = int(match.group(1))
        elif match := _STAMP.match(line):
            stamp = datetime.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")
        elif match := _RULE.match(line):
            current = {"rule": match.group(1), "wildcards": "", "threads": 1, "start": stamp}
        elif current is not None and (match := _FIELD.match(line)):
            key, value = match.groups()
            current[key] = int(value) if key in ("jobid", "threads") else value
            if key == "jobid":
                jobs[current["jobid"]] = current
        elif match := _FINISHED.match(line):
            current = None
            if int(match.group(1)) in jobs:
                jobs[int(match.group(1))]["end"] = stamp
    table = pd.DataFrame(list(jobs.values()), columns=["jobid", "rule", "wildcards", "threads",
                                                       "start", "end"])
    if table.empty:
        return table.rename(columns={"start": "start_s", "end": "end_s"}), cores
    origin = table["start"].min()
    table["start_s"] = (table["start"] - origin).dt.total_seconds()
    table["end_s"] = (pd.to_datetime(table["end"]) - origin).dt.total_seconds()
    return table.drop(columns=["start", "end"]).sort_values("start_s", kind="stable"), cores


def busy_cores(jobs: pd.DataFrame, cores: int) -> pd.DataFrame:
    """Piecewise-constant busy cores: one row per interval (from_s, to_s, busy, running:
    the rules running then), busy capped at `cores`."""
    done = jobs.dropna(subset=["end_s"])
    edges = np.unique(np.concatenate([done["start_s"], done["end_s"]]))
    rows = []
    for begin, end in zip(edges[:-1], edges[1:], strict=True):
        running = done[(done["start_s"] <= begin) & (done["end_s"] >= end)]
        busy = min(cores, int(running["threads"].sum()))
        rows.append({"from_s": begin, "to_s": end, "busy": busy,
                     "running": ", ".join(sorted(running["rule"]))})
    return pd.DataFrame(rows, columns=["from_s", "to_s", "busy", "running"])


def summary(jobs: pd.DataFrame, cores: int) -> dict:
    """Wall seconds, core-seconds used and idle, and the busy fraction of cores x wall."""
    intervals = busy_cores(jobs, cores)
    length = intervals["to_s"] - intervals["from_s"]
    wall = float(length.sum())
    used = float((length * intervals["busy"]).sum())
    fraction = used / (cores * wall) if wall else 0.0
    return {"jobs": len(jobs), "cores": cores, "wall_s": wall, "core_s_used": used,
            "core_s_idle": cores * wall - used, "busy_fraction": fraction}


def idle_spells(jobs: pd.DataFrame, cores: int, min_s: float = 10.0) -> pd.DataFrame:
    """Stretches of at least `min_s` seconds with a core idle, merged while what ran is the same."""
    intervals = busy_cores(jobs, cores)
    intervals = intervals[intervals["busy"] < cores]
    spells: list[dict] = []
    for row in intervals.itertuples(index=False):
        last = spells[-1] if spells else None
        if last and last["to_s"] == row.from_s and last["running"] == row.running:
            last["to_s"] = row.to_s
        else:
            spells.append(row._asdict())
    table = pd.DataFrame(spells, columns=["from_s", "to_s", "busy", "running"])
    return table[table["to_s"] - table["from_s"] >= min_s]


def plot_timeline(jobs: pd.DataFrame, cores: int, path: str | Path) -> None:
    """One bar per job (colour by rule, label by wildcards), busy cores underneath."""
    plt = pyplot()
    done = jobs.dropna(subset=["end_s"]).reset_index(drop=True)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 0.22 * len(done) + 2.5), sharex=True,
        gridspec_kw={"height_ratios": [max(len(done), 4), 4]},
    )
    rules = list(dict.fromkeys(done["rule"]))
    colours = {rule: plt.cm.tab20(i % 20) for i, rule in enumerate(rules)}
    for row in done.itertuples():
        top.barh(row.Index, row.end_s - row.start_s, left=row.start_s, color=colours[row.rule])
    top.set_yticks(range(len(done)), [_label(row) for row in done.itertuples()], fontsize=7)
    top.invert_yaxis()
    intervals = busy_cores(done, cores)
    bottom.stairs(intervals["busy"], np.append(intervals["from_s"], intervals["to_s"].iloc[-1:]),
                  fill=True, color="0.5")
    bottom.set_ylim(0, cores)
    bottom.set_ylabel("busy cores")
    bottom.set_xlabel("seconds from the first job's start")
    stats = summary(done, cores)
    top.set_title(f"{stats['jobs']} jobs, {stats['wall_s']:.0f} s, cores busy "
                  f"{100 * stats['busy_fraction']:.0f}% of {cores} x wall")
    save_png(fig, path)


def _label(row) -> str:
    return f"{row.rule} {row.wildcards}".strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", help="the experiment folder (holds .snakemake/log)")
    parser.add_argument("--log", help="a Snakemake log (default: the folder's newest with jobs)")
    parser.add_argument("--png", help="also draw the timeline here")
    args = parser.parse_args(argv)
    try:
        if args.log:
            log = Path(args.log)
            jobs, cores = read_jobs(log)
        else:
            log, jobs, cores = latest_run(args.experiment)
    except FileNotFoundError as error:
        print(f"timeline: {error}", file=sys.stderr)
        return 2
    if jobs.empty or cores is None:
        print(f"timeline: no jobs in {log}", file=sys.stderr)
        return 2
    stats = summary(jobs, cores)
    print(f"{log}: {stats['jobs']} jobs on {cores} cores, {stats['wall_s']:.0f} s wall; cores "
          f"busy {100 * stats['busy_fraction']:.1f}% ({stats['core_s_idle']:.0f} core-s idle)")
    for spell in idle_spells(jobs, cores).itertuples(index=False):
        print(f"  {spell.from_s:6.0f}-{spell.to_s:6.0f} s  {spell.busy} of {cores} busy: "
              f"{spell.running or 'nothing'}")
    if args.png:
        plot_timeline(jobs, cores, args.png)
        print(f"timeline: drawn in {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
