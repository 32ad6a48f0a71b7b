"""Shared test setup: offline hub, headless plots, and helpers to run the real pipeline small."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parents[1]
# The tests' tiny captioner (`tiny_captioner`, and the `captioner` block of the tiny runs that
# the method tests train through the real trainer, each with its module's overrides) and those
# runs' `train` block: 3 steps, no validation, no checkpoint
TINY_CAPTIONER = dict(width=16, enc_layers=1, dec_layers=2, heads=2, ffn=32, dropout=0.0, max_len=8)
TINY_TRAIN = dict(
    steps=3, batch_size=6, warmup_steps=1, val_every=0, checkpoint_every=0, log_every=1
)
# The tests that train beside a CLIP (SCST, specificity): a wider captioner of longer captions
CLIP_TESTS_CAPTIONER = {**TINY_CAPTIONER, "width": 32, "dec_layers": 1, "ffn": 64, "max_len": 12}
CLIP_TESTS_TRAIN = {**TINY_TRAIN, "lr": 1e-3}
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# the shapes CLIP the repository ships: a DAG that needs a CLIP but does not test its training
SHIPPED_CLIP = ROOT / "assets" / "clip" / "shapes-rn-tiny.pt"


# `make test` runs two pytest-xdist workers, and a worker runs a group of modules whole: the
# SLURM tests share one cluster, the readers of the shared tiny run its session fixture (one
# DAG run), any other module is a group of its own (its module fixtures run once). The
# groups are named here because the controller that deals them out sees node ids only
# (xdist's own xdist_group marks write `item._nodeid`, which pytest 9 no longer reads).
MODULE_GROUPS = {
    "slurm": ("test_slurm_cluster", "test_slurm_pipeline"),
    "tiny_dag": ("test_entropy", "test_pipeline", "test_quick", "test_report", "test_seeds",
                 "test_upgrade", "test_work_budget"),
}
SHARED_RUN_FIXTURES = {"tiny_dag", "tiny_report"}
# The longest groups (the last serial CI's durations: SLURM ~17 min, the shared tiny run and
# its readers ~13 min, the source DAGs ~6 min) go first, so that the workers end together.
LONGEST_GROUPS_FIRST = ("slurm", "tiny_dag", "test_sources", "test_hf_pipeline", "test_rehearsal",
                        "test_scaling", "test_plugins")


def module_group(module: str) -> str:
    """The group of the test module named `module` (its file's stem)."""
    return next((g for g, modules in MODULE_GROUPS.items() if module in modules), module)


def ungrouped_module(item: pytest.Item) -> str | None:
    """The module of `item` if it needs a group that MODULE_GROUPS does not give it."""
    module = item.module.__name__
    if item.get_closest_marker("slurm") and module_group(module) != "slurm":
        return module
    if SHARED_RUN_FIXTURES & set(item.fixturenames) and module_group(module) != "tiny_dag":
        return module
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Check the groups, and put the longest first (stable: file order after)."""
    missing = sorted({m for m in map(ungrouped_module, items) if m})
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: MODULE_GROUPS must group {missing}")
    rank = {group: k for k, group in enumerate(LONGEST_GROUPS_FIRST)}
    items.sort(key=lambda item: rank.get(module_group(item.module.__name__), len(rank)))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduler, with the groups above for scopes."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return module_group(Path(nodeid.split("::")[0]).stem)

    return ByModuleGroup(config, log)


def child_peak_mb(code: str, *args: object) -> float:
    """Peak RSS (MB) of `code` run in a fresh Python with `args` as argv[1:], read as the
    child's own VmHWM: its ru_maxrss would keep the parent's peak across exec on Linux."""
    report = 'print(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")))'
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{report}", *map(str, args)], capture_output=True,
        text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "MPLBACKEND": "Agg"},
    )  # fmt: skip
    return int(done.stdout.split()[-2]) / 1024


def tiny_config() -> dict:
    """The embedded default config, shrunk so the whole DAG runs in a few minutes on 2 cores."""
    config = yaml.safe_load((ROOT / "tests" / "tiny_config.yaml").read_text())
    return config


def copy_workflow(workdir: Path) -> Path:
    """A copy of the workflow (Snakefile, rules, schemas, its default profile) in `workdir`."""
    for name in ("Snakefile", "workflow", "envs", "config.yaml", "profiles"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, workdir / name)
    return workdir


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A copy of the workflow (Snakefile, rules, schemas) in a fresh directory."""
    return copy_workflow(tmp_path)


def snakemake(
    workdir: Path, *args: str, config: dict | None = None, timeout: int = 1200, env=None
):
    """Run snakemake in `workdir` (with `config` written as its config.yaml, in environment
    `env`, default ours); never hangs."""
    if config is not None:
        (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = ["timeout", "-k", "10", str(timeout), SNAKEMAKE, "--cores", "2", *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)


def failed_job_logs(workdir: Path, snakemake_output: str, chars: int = 3000) -> str:
    """The tails of the logs of the jobs snakemake's output says failed ("Error in rule"),
    so a failed run in CI shows the job's own traceback, not only snakemake's."""
    tails = []
    for block in snakemake_output.split("Error in rule")[1:]:
        named = re.search(r"^\s*log: ([^,\s]+)", block, re.MULTILINE)
        if named and (workdir / named.group(1)).is_file():
            text = (workdir / named.group(1)).read_text(errors="replace")
            tails.append(f"--- {named.group(1)}:\n{text[-chars:]}")
    return "\n".join(tails)


def run_tiny_dag(workdir: Path) -> tuple[Path, dict]:
    """The whole tiny DAG in a fresh copy of the workflow at `workdir`."""
    copy_workflow(workdir)
    config = tiny_config()
    result = snakemake(workdir, config=config, timeout=1500)
    assert result.returncode == 0, result.stderr[-5000:] + failed_job_logs(workdir, result.stderr)
    return workdir, config


@pytest.fixture(scope="session")
def tiny_dag(tmp_path_factory) -> tuple[Path, dict]:
    """One full run of the tiny DAG, shared by every test that reads a finished run (the
    suite's costliest step: run it once). Tests that edit it restore what they change."""
    return run_tiny_dag(tmp_path_factory.mktemp("pipeline"))


@pytest.fixture(scope="session")
def tiny_report(tiny_dag) -> Path:
    """The shared run's report (`snakemake --report`), built once."""
    workdir, _ = tiny_dag
    result = snakemake(workdir, "--report", "results/report.html")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir / "results/report.html"


def shrink_runs(runs: dict, tiny_train: dict) -> dict:
    """`runs` with each run's own `train` overrides (e.g. a fine-tune's steps) shrunk to the
    tiny trainer settings; its other overrides (e.g. select_metric) stay."""
    return {
        name: {**run, "train": {**run.get("train", {}), **tiny_train}} for name, run in runs.items()
    }


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: threads only add contention (10x slower on a busy 2-core box), and one
    thread keeps reductions in one order. Modules take it with `usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_captioner(vocab: int, visual_dim: int, pooled_dim: int, seed: int = 0, **overrides):
    """A seeded random captioner of the tests' tiny size (`TINY_CAPTIONER`, with overrides)."""
    import torch

    from distinctcap.captioner.model import Captioner, CaptionerConfig

    torch.manual_seed(seed)
    cfg = CaptionerConfig(vocab, visual_dim, pooled_dim, **{**TINY_CAPTIONER, **overrides})
    return Captioner(cfg)


# ---------------------------------------------------------------------------------------------
# The local SLURM cluster of .ci/slurm/start.sh (tests/test_slurm_cluster.py and
# tests/test_slurm_pipeline.py)

SLURM_STATE_DIR = Path(os.environ.get("SLURM_STATE_DIR", "/tmp/distinctcap-slurm"))


def slurm_env() -> dict[str, str]:
    """Environment for SLURM clients: the state dir's config unless SLURM_CONF is set."""
    env = dict(os.environ)
    conf = SLURM_STATE_DIR / "etc" / "slurm.conf"
    if "SLURM_CONF" not in env and conf.exists():
        env["SLURM_CONF"] = str(conf)
    return env


def slurm(*args: str, timeout: float = 20) -> str:
    """The standard output of a SLURM client command (`args`), which must succeed."""
    done = subprocess.run(
        args, env=slurm_env(), capture_output=True, text=True, check=True, timeout=timeout
    )
    return done.stdout


def slurm_cluster_problem() -> str | None:
    """Why the cluster cannot be used, or None when slurmctld answers `scontrol ping`."""
    if shutil.which("scontrol") is None:
        return "SLURM client tools not installed (run .ci/slurm/install.sh)"
    try:
        slurm("scontrol", "ping", timeout=10)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        return f"local SLURM cluster not up (`scontrol ping` failed; run .ci/slurm/start.sh): {err}"
    return None


@pytest.fixture(scope="module")
def cluster() -> None:
    """The SLURM tests' cluster: skipped when none answers, unless DISTINCTCAP_REQUIRE_SLURM=1
    (CI), where that is a failure."""
    problem = slurm_cluster_problem()
    if problem and os.environ.get("DISTINCTCAP_REQUIRE_SLURM") == "1":
        pytest.fail(f"DISTINCTCAP_REQUIRE_SLURM=1 but {problem}")
    if problem:
        pytest.skip(problem)
