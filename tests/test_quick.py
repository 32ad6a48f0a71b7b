"""Issue 32: the quick path ends on results. `make quick` then `make report` then
`distinctcap compare`, as a newcomer types them, each end on results: the summary of the two
quick runs, SMILE's verdict against the reference and where the report is.

The quick preset is shrunk to the tiny test world: the shared tiny DAG (`tiny_dag`) stands in
for its trained runs (presets/quick.yaml without its training lengths, so no job retrains), and
the test deletes the summary and the report files, which `make quick` must build again for the
two runs alone."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT

VENV = Path(sys.executable).parent.parent


def quick_repo(tiny_dag, at: Path) -> Path:
    """A checkout whose config.yaml is the tiny one, with the shrunk quick preset and the
    tiny DAG's results as experiments/quick, its summary and report files removed."""
    workdir, config = tiny_dag
    for name in ("Snakefile", "workflow", "envs", "Makefile"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, at / name)
    (at / "config.yaml").write_text(yaml.safe_dump(config))
    preset = yaml.safe_load((ROOT / "presets/quick.yaml").read_text())
    (at / "presets").mkdir()
    shrunk = {k: v for k, v in preset.items() if k not in ("train", "runs")}
    (at / "presets/quick.yaml").write_text(yaml.safe_dump(shrunk))
    results = at / "experiments/quick/results"
    shutil.copytree(workdir / "results", results)
    (results / "metrics/summary.csv").unlink()
    shutil.rmtree(results / "report")
    (results / "report.html").unlink(missing_ok=True)
    return at


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_make_quick_then_make_report_then_compare_end_on_results(tiny_dag, tmp_path):
    repo = quick_repo(tiny_dag, tmp_path)
    make = ["make", "--no-print-directory", f"VENV={VENV}", "-o", f"{VENV}/.installed"]

    said = run([*make, "quick"], repo).stdout
    results = repo / "experiments/quick/results"
    assert set(pd.read_csv(results / "metrics/summary.csv").run) == {"reference", "smile"}
    assert "== against the reference" in said and "\n- smile: " in said, said[-3000:]
    assert "summary:    experiments/quick/results/metrics/summary.csv" in said
    # issue 48 item 3: it ends on the verdict and the paths; the report's chatter ("Adding
    # forest.png", "Loading script code for rule") is in the report's log
    end = said[said.index("== against the reference"):]
    assert end.index("\n- smile: ") < end.index("== where they are"), end
    assert said.rstrip().splitlines()[-1].startswith("runs:       "), said[-1000:]
    assert "report:     experiments/quick/results/report.html (Snakemake's log of it: " \
        "experiments/quick/logs/report.log)" in end, end
    log = (repo / "experiments/quick/logs/report.log").read_text()
    assert "Loading script code" not in said and "Loading script code" in log
    assert (results / "report.html").stat().st_size > 10_000
    front = (repo / "experiments/quick/.snakemake/distinctcap/front.rst").read_text()
    listed = front[front.index("**What was run.**"):]
    assert "reference (MLE): method mle" in listed and "smile: method smile" in listed
    assert "teacher_neg" not in front and "Not built" not in listed
    assert "trained here for" in listed  # the tiny world's CLIP was trained, not shipped

    nothing = run([*make, "report"], repo).stdout  # EXP=.: nothing built there
    assert nothing.count("\n") == 1 and "nothing to report" in nothing, nothing
    assert "experiments/quick/results (report: experiments/quick/results/report.html)" in nothing

    compare = run([sys.executable, "-m", "distinctcap", "compare"], repo).stdout
    assert compare.startswith("experiments/quick/results:\n| run |"), compare
    assert "| smile |" in compare and "\n- smile: " in compare
    runs = run([sys.executable, "-m", "distinctcap", "runs"], repo).stdout
    assert "experiments/quick/results/runs/smile" in runs
