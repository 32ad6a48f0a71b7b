"""The work budget: what a finished experiment computed, as its stages counted it, against a
committed expectation, with no clock involved (issue 46).

A run's work is its summary.json `work` (distinctcap.train.state.WorkDone.record), an
evaluate job's its results/metrics/<run>/work.json (distinctcap.evaluate.stage.write_work).
`work_record(directory)` flattens them into {key: number or text}:

    train.<run>.<count>                 steps, examples, tokens, decoded, cl_negatives, ...
    train.<run>.validation.passes       validation passes
    train.<run>.validation.steps        their steps, "10,20"
    train.<run>.validation.metrics      the metrics they computed, "val_loss,cider"
    train.<run>.validation.<count>      summed over the passes: decoded, cider_scored, ...
    evaluate.<run>.<split>-<decoding>.<count>   captions (or pairs) each metric scored

The budget file holds {key: {"value": ..., "reason": why it last changed}}; `differences`
names every key whose value differs, one line each. Rewrite it from a finished experiment:

    python -m distinctcap.runs.budget <experiment folder> --write-budget --reason "why"

(unchanged entries keep their reasons; without --write-budget it prints the differences and
exits 1 if there are any).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_json, write_json
from distinctcap.core.results import METRICS_DIR, RUN_DIR
from distinctcap.runs.plan import flat

BUDGET = Path(__file__).resolve().parents[3] / "tests" / "work_budget.json"
WRITE = "python -m distinctcap.runs.budget {directory} --write-budget --reason '...'"


def training_work(run: str, work: dict) -> dict:
    """The flat record of one run's summary.json `work`."""
    passes = work.get("validations", [])
    counts = {k: v for k, v in work.items() if k != "validations"}
    summed: Counter = Counter()
    for done in passes:
        summed.update({k: v for k, v in done.items() if k not in ("step", "metrics")})
    metrics = dict.fromkeys(m for done in passes for m in done["metrics"])
    validation = {
        "passes": len(passes),
        "steps": ",".join(str(done["step"]) for done in passes),
        "metrics": ",".join(metrics),
        **summed,
    }
    return flat({"train": {run: {**counts, "validation": validation}}})


def work_record(directory: str | Path) -> dict:
    """{key: value} of every run's summary.json and every evaluate job's work.json under the
    experiment folder `directory` (see the module doc)."""
    root = Path(directory)
    record: dict = {}
    for summary in sorted((root / RUN_DIR).glob("*/summary.json")):
        work = read_json(summary).get("work")
        if work is None:
            raise DistinctcapError(f"{summary} has no work record: rerun its training")
        record |= training_work(summary.parent.name, work)
    for path in sorted((root / METRICS_DIR).glob("*/work.json")):
        record |= flat({"evaluate": {path.parent.name: read_json(path)}})
    if not record:
        raise DistinctcapError(f"{root}: no {RUN_DIR}/*/summary.json nor {METRICS_DIR}/*/work.json")
    return dict(sorted(record.items()))


def differences(record: dict, budget: dict) -> list[str]:
    """One line per key whose value in `record` is not the budget's (or is in one only)."""
    lines = []
    for key in sorted(set(record) | set(budget)):
        if key not in budget:
            lines.append(f"{key}: {record[key]!r}, not in the budget")
        elif key not in record:
            lines.append(f"{key}: not done, budget {budget[key]['value']!r}")
        elif record[key] != budget[key]["value"]:
            lines.append(f"{key}: {record[key]!r}, budget {budget[key]['value']!r}")
    return lines


def budget_message(lines: list[str], directory: str | Path = "<experiment folder>",
                   path: Path = BUDGET) -> str:  # fmt: skip
    """The failure: the differing entries, and how to accept them for `directory`'s run."""
    write = WRITE.format(directory=directory)
    return "\n".join(
        [
            f"the work done differs from the budget {path.name} in {len(lines)} entries:",
            *lines,
            f"if this work is meant, update the budget in the same commit with its reason: {write}",
        ]
    )


def updated_budget(record: dict, budget: dict, reason: str | None) -> dict:
    """The budget of `record`: unchanged entries keep their reasons, changed and new ones get
    `reason` (required when any entry changes)."""
    changed = differences(record, budget)
    if changed and not reason:
        raise DistinctcapError(f"{len(changed)} budget entries change: give --reason")
    return {
        key: budget[key] if key in budget and budget[key]["value"] == value
        else {"value": value, "reason": reason}
        for key, value in record.items()
    }  # fmt: skip


def read_budget(path: str | Path = BUDGET) -> dict:
    return read_json(path) if Path(path).exists() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distinctcap.runs.budget",
        description="Compare a finished experiment's work with the work budget, or rewrite it.",
    )
    parser.add_argument("directory", help="the experiment folder (holds results/)")
    parser.add_argument("--budget", default=str(BUDGET), help="the budget file")
    parser.add_argument("--write-budget", action="store_true", help="rewrite the budget file")
    parser.add_argument("--reason", help="why the changed entries changed (with --write-budget)")
    args = parser.parse_args(argv)
    record, budget = work_record(args.directory), read_budget(args.budget)
    if args.write_budget:
        write_json(updated_budget(record, budget, args.reason), args.budget)
        print(f"{args.budget}: {len(record)} entries")
        return 0
    lines = differences(record, budget)
    if lines:
        print(budget_message(lines, args.directory, Path(args.budget)))
    return 1 if lines else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DistinctcapError as error:
        sys.exit(f"error: {error}")
