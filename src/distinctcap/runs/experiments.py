"""Which results folders an experiment has left: `results/` of the repository root and
`experiments/*/results` (one folder per experiment, the Makefile's EXP). `distinctcap runs` and
`distinctcap compare` without --results take the newest one; `make report` asks `report_check`
before building a report, so nothing to report is one line, not Snakemake's traceback.

An experiment folder remembers how it was made: the Snakefile's onstart records its config files
(config.yaml, then each --configfile, as given, with their sha256) and Snakemake's --config
overrides (kept as the file `results/experiment-overrides.yaml`, the last config file) in
`results/experiment.json` (`record_experiment`). `make run` and `make report` without CONFIGS
use them; CONFIGS that differ are refused in one line that prints the right command
(`configs_for`).

    python -m distinctcap.runs.experiments EXP [--configs "CONFIGS"] [--make report]
        # the config files to pass, one line; exit 1 with one line when EXP has no results
        # (--make report), exit 2 with one line when CONFIGS differ from the record

Whether an invocation builds the report (`report_requested`) is read here too, for the
workflow's `rule all` and its front page.

Light (pathlib, json, hashlib): no pandas, no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from distinctcap.core.errors import DistinctcapError

SUMMARY = Path("metrics") / "summary.csv"
RUN_CARDS = "runs/*/run.json"
RECORD = Path("results") / "experiment.json"
OVERRIDES = Path("results") / "experiment-overrides.yaml"
BASE_CONFIG = "config.yaml"  # beside the Snakefile, read before every --configfile


def report_requested(argv: Sequence[str] | None = None) -> bool:
    """Is this `snakemake --report` (`argv`: default, this process's command line)? Then rule
    all asks only for the targets that exist and the report's front page is written from
    them. Snakemake (9.27) gives the workflow no such fact: it parses the Snakefile and builds
    rule all's targets before it hands the report settings over (the DAG API's
    `create_report` comes after the parse), so the command line is where it is said."""
    return "--report" in (sys.argv if argv is None else argv)


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
    folders = results_folders()
    held = [_with_report(f) for f in folders]
    where = (
        "; results are in " + ", ".join(held) + f" ({report_command(folders[0].parent)} "
        "reports the newest)" if held else "; run make quick or make run first"
    )
    return f"make report: nothing to report, {experiment / 'results'}/ does not exist{where}"


def report_command(experiment: Path) -> str:
    """`make report EXP=...`, with the CONFIGS it needs where the folder has no record of its
    config files (made before records): then they are unknown, and said so."""
    command = f"make report EXP={experiment}"
    known = recorded_configs(experiment) is not None or experiment == Path(".")
    return command if known else f"{command} CONFIGS=<the presets it was made with>"


def _with_report(results: Path) -> str:
    report = results / "report.html"
    return f"{results} (report: {report})" if report.is_file() else str(results)


def record_experiment(experiment: Path, repo: Path, configfiles: list, overrides: dict) -> dict:
    """Write `experiment`/results/experiment.json, atomically: the --configfile files in order
    (named by `shown_path`), each with its sha256, and the --config overrides, written as
    `experiment-overrides.yaml`, the last file. The Snakefile's onstart calls it."""
    import yaml

    from distinctcap.core.configfile import shown_path
    from distinctcap.core.io import atomic_path, file_sha256, write_json

    repo = repo.absolute()
    files = [Path(f).absolute() for f in configfiles]
    if overrides:
        with atomic_path(experiment / OVERRIDES) as tmp:
            tmp.write_text(yaml.safe_dump(json.loads(json.dumps(dict(overrides)))))
        files.append((experiment / OVERRIDES).absolute())
    record = {
        "configfiles": [{"path": shown_path(f, repo), "sha256": file_sha256([f])} for f in files],
        "overrides": json.loads(json.dumps(dict(overrides))),
    }
    write_json(record, experiment / RECORD)
    return record


def recorded_configs(experiment: Path) -> list[str] | None:
    """The config files `experiment` was made with (after config.yaml), or None when it has
    no record (made before records, or never run)."""
    path = experiment / RECORD
    if not path.is_file():
        return None
    return [entry["path"] for entry in json.loads(path.read_text())["configfiles"]]


def configs_for(experiment: Path, given: list[str], target: str) -> list[str]:
    """The config files for `make TARGET EXP=experiment`: the given ones, or without them the
    recorded ones; given ones that differ from the record are one DistinctcapError printing
    the command that uses the recorded ones."""
    recorded = recorded_configs(experiment)
    if recorded is None or given == recorded:
        return given
    if not given:
        return recorded
    right = f'make {target} EXP={experiment} CONFIGS="{" ".join(recorded)}"'
    made = " ".join([BASE_CONFIG, *recorded])
    raise DistinctcapError(
        f"{experiment} was made with {made}, not CONFIGS={' '.join(given)}: run {right} "
        "(or give another EXP for other configs)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distinctcap.runs.experiments")
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--configs", default="", help="make's CONFIGS, as given")
    parser.add_argument("--make", default="report", choices=("report", "run"))
    args = parser.parse_args(argv)
    if args.make == "report":
        said = report_check(args.experiment)
        if said:
            print(said)
            return 1
    try:
        print(" ".join(configs_for(args.experiment, args.configs.split(), args.make)))
    except DistinctcapError as error:
        print(f"distinctcap: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
