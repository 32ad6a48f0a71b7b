"""Which results folders an experiment has left: `results/` of the repository root and
`experiments/*/results` (one folder per experiment, the Makefile's EXP). `distinctcap runs` and
`distinctcap compare` without --results take the newest one; `make report` asks `report_check`
before building a report, so nothing to report is one line, not Snakemake's traceback.

    python -m distinctcap.runs.experiments EXP   # exit 1 with one line when EXP has no results

Light (pathlib only): no pandas, no torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

from distinctcap.core.errors import DistinctcapError

SUMMARY = Path("metrics") / "summary.csv"
RUN_CARDS = "runs/*/run.json"


def results_folders(root: Path = Path(".")) -> list[Path]:
    """Every results folder under `root` holding a finished run or a summary, newest first."""
    candidates = [root / "results", *sorted((root / "experiments").glob("*/results"))]
    held = [folder for folder in candidates if _newest_mark(folder) is not None]
    return sorted(held, key=_newest_mark, reverse=True)


def _newest_mark(folder: Path) -> float | None:
    """The modification time of the newest summary or run card in `folder` (None: neither)."""
    marks = [*folder.glob(RUN_CARDS), *([folder / SUMMARY] if (folder / SUMMARY).is_file() else [])]
    return max((p.stat().st_mtime for p in marks), default=None)


def find_results(given: str | None, need_summary: bool, root: Path = Path(".")) -> Path:
    """`given` as a Path; without it the newest results folder (with a summary where
    `need_summary`), else a DistinctcapError saying which folders hold results."""
    if given is not None:
        return Path(given)
    folders = results_folders(root)
    usable = [f for f in folders if (f / SUMMARY).is_file()] if need_summary else folders
    if usable:
        return usable[0]
    if folders:
        raise DistinctcapError(
            "no results folder has a summary yet (results/metrics/summary.csv); runs are in "
            + ", ".join(map(str, folders))
            + ": finish them (make quick, make run), or pass --results"
        )
    raise DistinctcapError(
        "no results yet (looked in results/ and experiments/*/results): run make quick first"
    )


def report_check(experiment: Path) -> str | None:
    """None when `experiment`/results exists (a report shows what there is); else the one line
    `make report` prints instead of building one, naming the folders that hold results."""
    if (experiment / "results").is_dir():
        return None
    held = [_with_report(f) for f in results_folders()]
    where = (
        "; results are in " + ", ".join(held) + " (make report EXP=<experiment> "
        "CONFIGS=<its presets> reports one)" if held else "; run make quick or make run first"
    )
    return f"make report: nothing to report, {experiment / 'results'}/ does not exist{where}"


def _with_report(results: Path) -> str:
    report = results / "report.html"
    return f"{results} (report: {report})" if report.is_file() else str(results)

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m distinctcap.runs.experiments EXPERIMENT_FOLDER")
    said = report_check(Path(sys.argv[1]))
    if said:
        print(said)
        sys.exit(1)
