"""The docs table "COCO on one GPU" (docs/performance.md) from rehearsal JSON files, never by
hand: per stage of config.coco.yaml, each file's measured rate and the extrapolated hours of
the full schedule, then the totals on one device and on a SLURM allocation's devices side by
side (bench/rehearsal.py computes both from the same rates).

    PYTHONPATH=src python bench/coco_table.py LABEL=rehearsal.json [LABEL=...] [--write FILE]

A label names a column group (e.g. before=..., after=..., or the card). Each file is what
bench/rehearsal.py --out wrote (bench/gpu_check.sh part d writes $OUT/rehearsal.json). With
--write the table replaces what lies between the markers in FILE; else it is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rehearsal  # noqa: E402  (bench/ is scripts, not a package)

DOCS = Path(__file__).resolve().parent.parent / "docs"
DOCS_INPUTS = {  # the table's columns: the first rehearsal, and the first at COCO's size
    "2-core CPU, 16 images": DOCS / "rehearsal/cpu-2core-16-images.json",
    "2-core CPU, 123,287 images, small models": DOCS / "rehearsal/scale/second-full-123287.json",
}
BEGIN, END = "<!-- coco-table:begin -->", "<!-- coco-table:end -->"
UPSTREAM = (
    "prepare_data",
    "extract_features",
    "retrieval_entropy",
    "split_entropy",
    "entropy_report",
    "neighbours",
)
PER_RUN = ("train_run", "decode", "evaluate_gpu", "evaluate")
REPORT = ("summarize", "versus_reference", "report_tables", "report_plots", "report_gallery")
# Stages whose work does not depend on the models (data, tables of features, the report): a
# `--small-models` rehearsal (small_models in its JSON) measures them at their real cost; its
# other rows are the small models' and are left out ("COCO's shape on a CPU" has them).
MODEL_FREE = {
    "prepare_data",
    "retrieval_entropy",
    "split_entropy",
    "entropy_report",
    "neighbours",
    *REPORT,
}


def expected_jobs(config: dict) -> list[str]:
    """Every job of the schedule the table has a row for, in the DAG's order."""
    runs = list(config["runs"])
    return [*UPSTREAM, *(f"{rule}/{run}" for rule in PER_RUN for run in runs), *REPORT]


def shown(result: dict, job: str) -> bool:
    """Whether `result`'s row of `job` belongs in the table (module doc: MODEL_FREE)."""
    return not result.get("small_models") or job.split("/")[0] in MODEL_FREE


def resumed_jobs(result: dict) -> set[str]:
    """Jobs whose last run reused a killed run's work (their `usage` says so): their numbers
    are that run's, not the job's whole cost. A job is named by its log (data/prepare_data)
    and by its log's last part (prepare_data), as `stage` may name it."""
    logs = [u["log"] for u in result.get("usage", []) if u.get("resumed")]
    return {*logs, *(log.rsplit("/", 1)[-1] for log in logs)}


def stage(row: dict) -> str:
    """A row's name in the table: rule/run for a run's jobs, else the rule (one job each)."""
    return row["job"] if row["rule"] in PER_RUN else row["rule"]


def hours(seconds: float) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds / 3600:.2f}"


def rate(row: dict | None) -> str:
    if row is None:
        return "not run"
    known = row["unit"] and row["rate"] is not None and not math.isnan(row["rate"])
    return f"{row['rate']:.3g} {row['unit']}" if known else "-"


def table(results: dict[str, dict], config: dict) -> str:
    """Markdown: the inputs (label, machine, card, size), then one row per job."""
    lines = [
        "| input | card / machine | images | steps per run | snakemake rc |",
        "|---|---|---|---|---|",
    ]
    for label, r in results.items():
        lines.append(
            f"| {label} | {r['card']}; {r['machine']} | {r['images']:,} | "
            f"{r['steps']} | {'-' if r['snakemake_rc'] is None else r['snakemake_rc']} |"
        )
    lines += [
        "",
        "| stage | scaling | "
        + " | ".join(f"{label}: rate | {label}: full schedule (h)" for label in results)
        + " |",
    ]
    lines.append("|---|---|" + "---|---|" * len(results))
    by_job = {label: {stage(row): row for row in r["stages"]} for label, r in results.items()}
    resumed = {label: resumed_jobs(r) for label, r in results.items()}
    for job in expected_jobs(config):
        scaling = rehearsal.SCALING.get(job.split("/")[0], "fixed")
        cells = []
        for label, result in results.items():
            row = by_job[label].get(job)
            if not shown(result, job):
                cells += ["small models", "-"]
                continue
            if row and row["job"] in resumed[label]:
                cells += ["resumed: its last run only", "-"]
                continue
            cells += [rate(row), hours(row["extrapolated_s"]) if row else "-"]
        lines.append(f"| {job} | {scaling} | " + " | ".join(cells) + " |")
    cells = []
    for label, result in results.items():
        other = [r for job, r in by_job[label].items() if job not in expected_jobs(config)]
        total = sum(r["extrapolated_s"] for r in other)
        cells += ["", "-" if result.get("small_models") else hours(total)]
    other = "| other jobs (preflight, run cards, report_times) | fixed | "
    lines.append(other + " | ".join(cells) + " |")
    for key, what in (
        ("one_device_s", "one device, jobs one after another"),
        ("devices_s", "{devices} devices side by side (critical path)"),
    ):
        name = what.format(devices=next(iter(results.values()))["totals"]["devices"])
        cells = [
            cell
            for r in results.values()
            for cell in ("", "-" if r.get("small_models") else hours(r["totals"][key]))
        ]
        lines.append(f"| **total, {name}** | | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_between_markers(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """`text` replaces what lies between the markers `begin` and `end` in the file `path`."""
    doc = path.read_text()
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(doc):
        raise SystemExit(f"{path} has no {begin} ... {end} markers")
    path.write_text(pattern.sub(lambda _: f"{begin}\n{text}{end}", doc))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="LABEL=rehearsal.json")
    parser.add_argument("--write", type=Path, help="the Markdown file with the markers")
    args = parser.parse_args()
    results = {}
    for item in args.inputs:
        label, _, path = item.partition("=")
        results[label] = json.loads(Path(path).read_text())
    text = table(results, rehearsal.load_coco())
    if args.write:
        write_between_markers(args.write, text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
