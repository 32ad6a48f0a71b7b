"""Issue 48 item 1: an experiment folder remembers how it was made. The first job's onstart
records its config files (with their sha256) and --config overrides in
results/experiment.json; `make run` and `make report` without CONFIGS use them, other CONFIGS
are refused in one line printing the right command, and no report shows a run the
experiment does not have. The experiment is shrunk to its data stage (seconds)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, SNAKEMAKE

from distinctcap.core.errors import DistinctcapError

VENV = Path(sys.executable).parent.parent


def test_the_record_lists_the_config_files_and_overrides_and_refuses_others(
    tmp_path, capsys, monkeypatch
):
    from distinctcap.runs.experiments import configs_for, main, record_experiment

    repo, experiment = tmp_path, tmp_path / "experiments" / "x"
    (repo / "presets").mkdir()
    (repo / "presets" / "two.yaml").write_text("only_runs: [smile]\n")
    (experiment / "results").mkdir(parents=True)
    record = record_experiment(experiment, repo, [repo / "presets" / "two.yaml"], {"seed": 3})
    overrides = "experiments/x/results/experiment-overrides.yaml"
    assert [f["path"] for f in record["configfiles"]] == ["presets/two.yaml", overrides]
    assert (repo / overrides).read_text() == "seed: 3\n" and record["overrides"] == {"seed": 3}
    assert json.loads((experiment / "results/experiment.json").read_text()) == record
    monkeypatch.chdir(repo)
    assert configs_for(Path("experiments/x"), [], "report") == ["presets/two.yaml", overrides]
    assert configs_for(Path("experiments/x"), ["presets/two.yaml", overrides], "run")
    with pytest.raises(DistinctcapError) as refused:
        configs_for(Path("experiments/x"), ["presets/quick.yaml"], "report")
    assert (f'run make report EXP=experiments/x CONFIGS="presets/two.yaml {overrides}"'
            in str(refused.value))
    assert main(["experiments/x", "--configs", "presets/quick.yaml", "--make", "run"]) == 2
    said = capsys.readouterr()
    assert said.err.count("\n") == 1 and "make run EXP=experiments/x CONFIGS=" in said.err
    assert configs_for(Path("experiments/new"), ["presets/a.yaml"], "run") == ["presets/a.yaml"]


def test_the_workflow_knows_a_report_invocation_by_its_command_line():
    """rule all and the front page (common.smk) ask `report_requested`: Snakemake parses the
    workflow before it hands over the report settings."""
    from distinctcap.runs.experiments import report_requested

    assert report_requested(["snakemake", "--cores", "2", "--report", "results/report.html"])
    assert not report_requested(["snakemake", "--cores", "2", "-n"])
    assert not report_requested()  # pytest's own command line


def make(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    cmd = ["make", "--no-print-directory", f"VENV={VENV}", "-o", f"{VENV}/.installed", *args]
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A checkout whose experiments/x ran its data stage with presets/two.yaml (only_runs:
    smile and its reference; config.yaml has five more runs) and --config seed=3."""
    repo = tmp_path_factory.mktemp("repo")
    for name in ("Snakefile", "workflow", "envs", "Makefile", "config.yaml", "presets"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, repo / name)
    (repo / "presets" / "two.yaml").write_text("only_runs: [smile]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [SNAKEMAKE, "--cores", "2", "--directory", "experiments/x", "--configfile",
         "presets/two.yaml", "--config", "seed=3", "--", "results/data/images.parquet"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return repo


def test_make_report_without_configs_reports_the_experiment_as_it_was_made(made):
    """Before: `make report EXP=...` alone read config.yaml only and showed its seven runs."""
    done = make(made, "report", "EXP=experiments/x")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "report: experiments/x/results/report.html" in done.stdout
    front = (made / "experiments/x/.snakemake/distinctcap/front.rst").read_text()
    assert "Not built (yet): reference, smile." in front  # the preset's two, not config.yaml's
    assert "teacher_neg" not in front
    record = json.loads((made / "experiments/x/results/experiment.json").read_text())
    assert [f["path"] for f in record["configfiles"]] == [
        "presets/two.yaml", "experiments/x/results/experiment-overrides.yaml"]


def test_make_report_with_other_configs_is_refused_with_the_right_command(made):
    done = make(made, "report", "EXP=experiments/x", "CONFIGS=presets/quick.yaml")
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("distinctcap:")]
    assert len(said) == 1 and 'run make report EXP=experiments/x CONFIGS="presets/two.yaml ' \
        'experiments/x/results/experiment-overrides.yaml"' in said[0], done.stderr
    assert "Traceback" not in done.stderr


def test_make_run_with_other_configs_is_refused(made):
    refused = make(made, "run", "EXP=experiments/x", "CONFIGS=presets/quick.yaml")
    assert refused.returncode != 0 and "make run EXP=experiments/x CONFIGS=" in refused.stderr


def test_the_front_page_shows_no_row_of_a_run_the_summary_lacks(tmp_path):
    from distinctcap.report.front import headline

    summary = pd.DataFrame([{"run": r, "split": "test", "decoding": "greedy", "seed": 0,
                             "cider": 1.0} for r in ("reference", "smile")])  # fmt: skip
    (tmp_path / "metrics").mkdir()
    summary.to_csv(tmp_path / "metrics" / "summary.csv", index=False)
    runs = {"reference": {"method": "mle"}, "smile": {"method": "smile"},
            "unkt": {"method": "unkt", "teacher": "teacher_neg"},
            "teacher_neg": {"method": "mle", "data": "D-"}}  # fmt: skip
    text = "\n".join(headline(tmp_path, runs))
    assert "smile" in text and "reference" in text
    assert "unkt" not in text and "teacher_neg" not in text


def test_nothing_to_report_names_the_command_that_reports_the_newest(tmp_path, monkeypatch):
    """Before: the hint said `CONFIGS=<its presets>` without naming them."""
    from distinctcap.runs.experiments import record_experiment, report_check

    monkeypatch.chdir(tmp_path)
    quick = Path("experiments/quick")
    (quick / "results/runs/smile").mkdir(parents=True)
    (quick / "results/runs/smile/run.json").write_text("{}")
    assert "(make report EXP=experiments/quick CONFIGS=<the presets it was made with> reports " \
        "the newest)" in report_check(Path("."))  # made before records: unknown, said so
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets/quick.yaml").write_text("only_runs: [smile]\n")
    record_experiment(quick, tmp_path, [tmp_path / "presets/quick.yaml"], {})
    said = report_check(Path("."))
    assert said.endswith("(make report EXP=experiments/quick reports the newest)"), said
