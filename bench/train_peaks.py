"""Each training run's peak RSS at two rehearsal sizes, on the code checked out, in one session
(issue 55: train's peak RSS at 123,287 images at most 1.25x its RSS at 10,000).

Every train_run job of a `bench/rehearsal.py` work folder is rerun, one at a time, in a scratch
folder beside its run (WORK/train-peaks), with the run's data, features, entropy subsets and
neighbours linked in; a run whose inputs the rehearsal has not made yet is skipped and named.

    PYTHONPATH=src python bench/train_peaks.py /scratch/r10000 /scratch/r123287 \
        --out docs/rehearsal/scale/train-peaks.json [--write docs/performance.md]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coco_table import write_between_markers  # noqa: E402  (bench/ is scripts, not a package)
from rehearsal import COCO_CONFIG, REPO, card  # noqa: E402
from scale_table import RSS_GOAL, markers  # noqa: E402

from distinctcap.core.usage import read_usage  # noqa: E402
from distinctcap.features.read import feature_ids  # noqa: E402

RUNS = ["reference", "teacher_neg", "teacher_pos", "cl", "scst", "smile", "specificity", "unkt"]
LINKED = ["data", "features", "entropy", "neighbours"]  # upstream results, read only
BLOCK = "train-peaks"


def scratch(work: Path) -> Path:
    """WORK/train-peaks/run: the rehearsal's upstream results linked, its config overlay."""
    run, out = work / "run", work / "train-peaks" / "run"
    (out / "results").mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = out / "results" / name
        if (run / "results" / name).exists() and not link.exists():
            link.symlink_to(run / "results" / name)
    shutil.copy(run / "rehearsal.yaml", out / "rehearsal.yaml")
    return out


def train(out: Path, run: str) -> dict | None:
    """The run's train_run job, from scratch (its old outputs removed): its usage line, or None
    where the job failed (its inputs missing)."""
    shutil.rmtree(out / "results" / "runs" / run, ignore_errors=True)
    (out / "logs" / "train" / f"{run}.log").unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg",
           "PYTHONPATH": str(REPO / "src")}  # fmt: skip
    snakemake = Path(sys.executable).parent / "snakemake"
    command = [str(snakemake), "--snakefile", str(REPO / "Snakefile"), "--directory", str(out),
               "--cores", "1", "--configfile", str(COCO_CONFIG), str(out / "rehearsal.yaml"),
               "--allowed-rules", "train_run", "--quiet", "rules", "--",
               f"results/runs/{run}/model.pt"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        return None
    return read_usage(out / "logs" / "train" / f"{run}.log")


def measure(work: Path) -> dict:
    """{images, runs: {run: usage}, skipped: [run]} of one rehearsal folder."""
    out = scratch(work)
    images = len(feature_ids(work / "run" / "results" / "features" / "index.json"))
    runs, skipped = {}, []
    for run in RUNS:
        usage = train(out, run)
        print(f"train-peaks: {images:,} images, {run}: {usage}", flush=True)
        if usage is None:
            skipped.append(run)
        else:
            runs[run] = usage
    return {"images": images, "runs": runs, "skipped": skipped}


def table(result: dict) -> str:
    """The Markdown table: each run's peak RSS at both sizes, the ratio and the goal."""
    small, large = result["sizes"]
    head = (f"Measured on {result['machine']} ({result['card']}), commit {result['commit']}, "
            f"one job at a time: peak RSS MB of each train_run job.\n\n")  # fmt: skip
    rows = [f"| run | {small['images']:,} images | {large['images']:,} images | ratio | goal |",
            "|---|---|---|---|---|"]  # fmt: skip
    for run in RUNS:
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
