"""Shared test setup: offline hub, headless plots, and helpers to run the real pipeline small."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def tiny_config() -> dict:
    """The embedded default config, shrunk so the whole DAG runs in a few minutes on 2 cores."""
    config = yaml.safe_load((ROOT / "tests" / "tiny_config.yaml").read_text())
    return config


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A copy of the workflow (Snakefile, rules, schemas) in a fresh directory."""
    for name in ("Snakefile", "workflow", "envs", "config.yaml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    return tmp_path


def snakemake(
    workdir: Path, *args: str, config: dict | None = None, timeout: int = 1200, env=None
):
    """Run snakemake in `workdir` (with `config` written as its config.yaml, in environment
    `env`, default ours); never hangs."""
    if config is not None:
        (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = ["timeout", "-k", "10", str(timeout), SNAKEMAKE, "--cores", "2", *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)


def shrink_runs(runs: dict, tiny_train: dict) -> dict:
    """`runs` with each run's own `train` overrides (e.g. a fine-tune's steps) shrunk to the
    tiny trainer settings; its other overrides (e.g. select_metric) stay."""
    return {
        name: {**run, "train": {**run.get("train", {}), **tiny_train}} for name, run in runs.items()
    }
