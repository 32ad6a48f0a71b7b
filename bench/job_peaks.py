"""Each job's peak RSS at two rehearsal sizes, on the code checked out, in one session (issue
55: the peak RSS of train, the entropy split and its report at 123,287 images at most 1.25x
their RSS at 10,000).

The split_entropy, entropy_report and every train_run job of a `bench/rehearsal.py` work folder
are rerun, one at a time and in that order, in a scratch folder beside its run (WORK/job-peaks),
with the run's data, features, retrieval entropies and neighbour table linked in. The training
runs read the split the scratch folder made; a job whose inputs the rehearsal has not made yet
is skipped and named.

    PYTHONPATH=src python bench/job_peaks.py /scratch/r10000 /scratch/r123287 \
        --out docs/rehearsal/scale/job-peaks.json [--write docs/performance.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coco_table import write_between_markers  # noqa: E402  (bench/ is scripts, not a package)
from rehearsal import COCO_CONFIG, REPO, card  # noqa: E402
from scale_table import RSS_GOAL, markers  # noqa: E402

from distinctcap.core.usage import read_usage  # noqa: E402
from distinctcap.features.read import feature_ids  # noqa: E402


class Job(NamedTuple):
    rule: str
    target: str  # what snakemake is asked for
    removed: list[str]  # its outputs, removed first so that it runs from scratch
    log: str


RUNS = ["reference", "teacher_neg", "teacher_pos", "cl", "scst", "smile", "specificity", "unkt"]
ENTROPY = "results/entropy"
REPORT = "results/report"
JOBS = {
    "split_entropy": Job("split_entropy", f"{ENTROPY}/entropy.parquet",
                         [f"{ENTROPY}/entropy.parquet", f"{ENTROPY}/D-", f"{ENTROPY}/D+"],
                         "logs/entropy/split_entropy.log"),
    "entropy_report": Job("entropy_report", f"{REPORT}/entropy_extremes.md",
                          [f"{REPORT}/entropy_histogram.png", f"{REPORT}/entropy_extremes.md"],
                          "logs/entropy/entropy_report.log"),
    **{run: Job("train_run", f"results/runs/{run}/model.pt", [f"results/runs/{run}"],
                f"logs/train/{run}.log") for run in RUNS},
}  # fmt: skip
# Upstream results, read only, each linked on its own so that the caches the jobs build beside
# them (the pooled embeddings, the neighbour rows) are written here, not in the rehearsal's run.
LINKED = ["results/data", "results/features/index.json", "results/features/cache/*",
          f"{ENTROPY}/scores.parquet", "results/neighbours/*.parquet"]  # fmt: skip
BLOCK = "job-peaks"


def scratch(work: Path) -> Path:
    """WORK/job-peaks/run: the rehearsal's upstream results linked, its config overlay."""
    run, out = work / "run", work / "job-peaks" / "run"
    for pattern in LINKED:
        for source in sorted(run.glob(pattern)):
            link = out / source.relative_to(run)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(source)
    shutil.copy(run / "rehearsal.yaml", out / "rehearsal.yaml")
    return out


def rerun(out: Path, job: Job) -> dict | None:
    """The job, from scratch (its old outputs removed): its usage line, or None where it
    failed (its inputs missing)."""
    for path in [*job.removed, job.log]:
        shutil.rmtree(out / path, ignore_errors=True)
        (out / path).unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg",
           "PYTHONPATH": str(REPO / "src")}  # fmt: skip
    snakemake = Path(sys.executable).parent / "snakemake"
    command = [str(snakemake), "--snakefile", str(REPO / "Snakefile"), "--directory", str(out),
               "--cores", "1", "--configfile", str(COCO_CONFIG), str(out / "rehearsal.yaml"),
               "--allowed-rules", job.rule, "--quiet", "rules", "--", job.target]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        return None
    return read_usage(out / job.log)


def measure(work: Path) -> dict:
    """{images, runs: {job: usage}, skipped: [job]} of one rehearsal folder."""
    out = scratch(work)
    images = len(feature_ids(work / "run" / "results" / "features" / "index.json"))
    runs, skipped = {}, []
    for name, job in JOBS.items():
        usage = rerun(out, job)
        print(f"job-peaks: {images:,} images, {name}: {usage}", flush=True)
        if usage is None:
            skipped.append(name)
        else:
            runs[name] = usage
    return {"images": images, "runs": runs, "skipped": skipped}


def table(result: dict) -> str:
    """The Markdown table: each run's peak RSS at both sizes, the ratio and the goal."""
    small, large = result["sizes"]
    head = (f"Measured on {result['machine']} ({result['card']}), commit {result['commit']}, "
            f"one job at a time: peak RSS MB of each job.\n\n")  # fmt: skip
    rows = [f"| job | {small['images']:,} images | {large['images']:,} images | ratio | goal |",
            "|---|---|---|---|---|"]  # fmt: skip
    for run in JOBS:
        a, b = small["runs"].get(run), large["runs"].get(run)
        if a is None or b is None:
            rows.append(f"| {run} | {_mb(a)} | {_mb(b)} | - | not measured (inputs missing) |")
            continue
        ratio = b["peak_rss_mb"] / a["peak_rss_mb"]
        verdict = "met" if ratio <= RSS_GOAL else "MISSED"
        rows.append(f"| {run} | {_mb(a)} | {_mb(b)} | x{ratio:.2f} | {verdict} |")
    return head + "\n".join(rows) + "\n"


def _mb(usage: dict | None) -> str:
    return "-" if usage is None else f"{usage['peak_rss_mb']:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("small", type=Path, help="the smaller rehearsal's work folder")
    parser.add_argument("large", type=Path, help="the larger rehearsal's work folder")
    parser.add_argument("--out", type=Path, required=True, help="the JSON it writes")
    parser.add_argument("--write", type=Path, help="the Markdown file with the markers")
    parser.add_argument("--from-json", action="store_true", help="render --out; run nothing")
    args = parser.parse_args()
    if args.from_json:
        result = json.loads(args.out.read_text())
    else:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        machine = f"{platform.node()}, {os.cpu_count()} cores"
        result = {"machine": machine, "card": card(), "commit": commit,
                  "sizes": [measure(args.small), measure(args.large)]}  # fmt: skip
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    text = table(result)
    if args.write:
        write_between_markers(args.write, text, *markers(BLOCK))
    print(text)


if __name__ == "__main__":
    main()
