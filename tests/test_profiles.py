"""The execution profiles: rules they name exist, only heavy rules ask for GPUs, and the SLURM
test profile mirrors the shipped SLURM profile (so the cluster test exercises its settings)."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from conftest import ROOT, SNAKEMAKE

PROFILES = {
    "slurm": ROOT / "workflow" / "profiles" / "slurm" / "config.yaml",
    "local-gpu": ROOT / "workflow" / "profiles" / "local-gpu" / "config.yaml",
    "slurm-test": ROOT / "tests" / "slurm_profile" / "config.yaml",
}
# Every rule whose script takes the config's `device`: with `device: cuda` (config.coco.yaml) a
# job of one without a GPU would stop at its start.
GPU_RULES = {
    "preflight",  # checks the GPU the others will get; it takes no device
    "train_clip",
    "extract_features",
    "extract_captioner_features",
    "train_judge_clip",
    "judge_features",
    "train_run",
    "decode",
    "retrieval_entropy",
    "neighbours",
    "evaluate_gpu",
}
# Keys whose values are the cluster's or the test's own; everything else must match.
SITE_VALUES = {"jobs", "latency-wait", "retries", "slurm-init-seconds-before-status-checks"}
SITE_RESOURCES = {"slurm_partition", "slurm_account", "gpu_model", "runtime", "mem_mb"}


def load(name: str) -> dict:
    return yaml.safe_load(PROFILES[name].read_text())


@pytest.fixture(scope="module")
def rule_sets(tmp_path_factory) -> dict[str, set[str]]:
    """Rule names of the workflow on a copy of it: "plain" without a profile, "gpu" with the
    local-gpu profile (which adds evaluate_gpu)."""
    import shutil

    work = tmp_path_factory.mktemp("rules")
    for name in ("Snakefile", "workflow", "envs", "config.yaml"):
        src = ROOT / name
        if src.exists():
            (shutil.copytree if src.is_dir() else shutil.copy)(src, work / name)
    return {"plain": rule_names(work), "gpu": rule_names(work, "local-gpu")}


@pytest.fixture(scope="module")
def workflow_rules(rule_sets) -> set[str]:
    """Every rule a profile can run."""
    return rule_sets["gpu"]


def rule_names(work, profile: str | None = None) -> set[str]:
    """`snakemake --list-rules` in `work`, with the named workflow profile or none."""
    option = ["--workflow-profile", f"workflow/profiles/{profile}"] if profile else []
    out = subprocess.run(
        ["timeout", "-k", "10", "120", SNAKEMAKE, "--list-rules", *option],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    # "name (docstring)", the docstring's further lines indented
    return {line.split()[0] for line in out.stdout.splitlines() if line[:1].strip()}


def test_evaluates_torch_part_is_its_own_job_only_where_a_profile_gives_it_a_gpu(
    rule_sets: dict[str, set[str]],
) -> None:
    """A plain `snakemake` computes the torch part in the evaluate job (one process start and
    CLIP load per run); the GPU profiles give it its own GPU job, evaluate_gpu."""
    assert "evaluate_gpu" not in rule_sets["plain"]
    assert rule_sets["gpu"] == rule_sets["plain"] | {"evaluate_gpu"}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_names_only_existing_rules(name: str, workflow_rules: set[str]) -> None:
    # set-resources for a rule that does not exist is silently ignored by snakemake: a typo
    # (or a renamed rule) would drop its GPU request without any error.
    named = set(load(name).get("set-resources", {}))
    assert named - workflow_rules == set()


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_only_heavy_rules_ask_for_gpus(name: str) -> None:
    profile = load(name)
    assert "gpu" not in profile.get("default-resources", {})
    assert "gpu_model" not in profile.get("default-resources", {})
    gpu = {rule for rule, res in profile["set-resources"].items() if "gpu" in res}
    assert gpu == GPU_RULES
    for rule, res in profile["set-resources"].items():
        # gres together with gpu/gpu_model makes sbatch fail; gpu_model alone means 1 GPU.
        assert "gres" not in res, rule
        assert "gpu_model" not in res or "gpu" in res, rule


def test_slurm_profiles_submit_with_partition_account_and_requeue() -> None:
    for name in ("slurm", "slurm-test"):
        profile = load(name)
        assert profile["executor"] == "slurm"
        assert profile["slurm-requeue"] is True
        assert {"slurm_partition", "slurm_account", "runtime", "mem_mb"} <= set(
            profile["default-resources"]
        )


def test_test_profile_mirrors_the_shipped_slurm_profile() -> None:
    shipped, test = load("slurm"), load("slurm-test")
    assert set(shipped) == set(test)
    for key in set(shipped) - SITE_VALUES - {"default-resources", "set-resources"}:
        assert shipped[key] == test[key], key
    assert set(shipped["default-resources"]) == set(test["default-resources"])
    assert set(shipped["set-resources"]) == set(test["set-resources"])
    for rule, res in shipped["set-resources"].items():
        mine = test["set-resources"][rule]
        assert set(res) - SITE_RESOURCES == set(mine) - SITE_RESOURCES, rule
        assert partition_kind(shipped, rule) == partition_kind(test, rule), rule
        assert res.get("gpu") == mine.get("gpu"), rule


def test_every_rule_that_takes_the_device_asks_for_a_gpu() -> None:
    rules = {}
    for path in (ROOT / "workflow" / "rules").glob("*.smk"):
        for block in re.split(r"^\s*rule ", path.read_text(), flags=re.MULTILINE)[1:]:
            rules[block.split(":")[0]] = block
    assert {name for name, block in rules.items() if 'device=config["device"]' in block} == (
        GPU_RULES - {"preflight"}
    )


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_rule_declares_mem_mb(name: str, workflow_rules: set[str]) -> None:
    resources = load(name)["set-resources"]
    for rule in workflow_rules - {"all"}:
        assert "mem_mb" in resources.get(rule, {}), rule


def resource(profile: dict, rule: str, key: str, attempt: int = 1):
    """A rule's resource as snakemake resolves it: its own value, else the default; a string
    is a Python expression with `attempt` in scope, or else a plain string (a partition)."""
    value = profile["set-resources"].get(rule, {}).get(key, profile["default-resources"].get(key))
    try:
        return eval(value, {"attempt": attempt}) if isinstance(value, str) else value  # noqa: S307
    except NameError:
        return value


def partition_kind(profile: dict, rule: str) -> str:
    default = profile["default-resources"]["slurm_partition"]
    return "cpu" if resource(profile, rule, "slurm_partition") == default else "gpu"


@pytest.mark.parametrize("name", ["slurm", "slurm-test"])
@pytest.mark.parametrize("key", ["mem_mb", "runtime"])
def test_slurm_memory_and_time_grow_with_the_attempt(
    name: str, key: str, workflow_rules: set[str]
) -> None:
    # a job that ended OUT_OF_MEMORY or TIMEOUT is resubmitted by `retries` asking for more
    profile = load(name)
    for rule in workflow_rules - {"all"}:
        first, second = (resource(profile, rule, key, a) for a in (1, 2))
        assert isinstance(first, int) and second > first, (rule, key)


@pytest.mark.parametrize("name", ["slurm", "slurm-test"])
def test_slurm_jobs_stay_on_one_node(name: str, workflow_rules: set[str]) -> None:
    # torchrun --standalone (train_run with gpu > 1) needs all of a job's GPUs on one node
    profile = load(name)
    assert all(resource(profile, rule, "nodes") == 1 for rule in workflow_rules - {"all"})


@pytest.mark.parametrize("name", ["slurm", "slurm-test"])
def test_cpu_rules_use_the_cpu_partition(name: str, workflow_rules: set[str]) -> None:
    # evaluate's CPU metrics hold no GPU: its torch part (evaluate_gpu) shares decode's job
    profile = load(name)
    on_gpu = {rule for rule in workflow_rules - {"all"} if partition_kind(profile, rule) == "gpu"}
    assert on_gpu == GPU_RULES


def test_the_cpu_partition_is_a_site_line() -> None:
    lines = PROFILES["slurm"].read_text().splitlines()
    (line,) = [x for x in lines if x.strip().startswith("slurm_partition: cpu")]
    assert "# SITE: CPU partition" in line


@pytest.mark.parametrize("name", ["slurm", "slurm-test"])
def test_decode_and_evaluates_gpu_part_are_one_job_with_an_efficiency_report(name: str) -> None:
    profile = load(name)
    assert profile["groups"]["decode"] == profile["groups"]["evaluate_gpu"]
    assert set(profile["groups"]) == {"decode", "evaluate_gpu"}
    assert profile["slurm-efficiency-report"] is True


def test_the_shipped_slurm_profile_accepts_any_gpu_model() -> None:
    profile = load("slurm")
    assert all("gpu_model" not in res for res in profile["set-resources"].values())


@pytest.mark.parametrize("attempt", [1, 2])
def test_slurm_runtimes_stay_inside_common_partition_limits(attempt: int) -> None:
    # train_run at most 48 h (it resumes from checkpoints); decode and evaluate an hour or less,
    # and so is their group job, whose runtime is their sum
    profile = load("slurm")
    assert resource(profile, "train_run", "runtime", attempt) <= 48 * 60
    group = [r for r, g in profile["groups"].items() if g == "decode_evaluate"]
    times = [resource(profile, rule, "runtime", attempt) for rule in group]
    assert max(times) <= 60 and sum(times) <= 60, times
    assert resource(profile, "preflight", "runtime", attempt) <= 30


class _Workflow:
    """The three attributes of snakemake's Workflow that `local_cores` reads."""

    def __init__(self, local_exec: bool, remote_exec: bool, cores: int | None):
        self.local_exec, self.remote_exec = local_exec, remote_exec
        self.global_resources = {"_cores": cores}


def test_evaluate_shares_the_local_cores_among_pending_runs_and_keeps_eight_on_a_cluster():
    from distinctcap.core.cores import evaluate_threads, local_cores, pending_runs

    # the shapes default's 7 runs pending: one core each on a 2-core box, as many as are free
    assert [evaluate_threads(c, 7) for c in (1, 2, 3, 4, 8, 16, 64)] == [1, 1, 1, 1, 1, 2, 8]
    # one run left (a single run's evaluation rerun): every core, up to 8
    assert [evaluate_threads(c, 1) for c in (1, 2, 4, 16)] == [1, 2, 4, 8]
    # nothing pending by its files (a forced rerun): half the cores
    assert [evaluate_threads(c, None) for c in (1, 2, 3, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 8, 8]
    assert pending_runs(["a", "b", "c"], lambda run: run == "b") == 2
    assert pending_runs(["a", "b"], lambda run: True) is None
    assert local_cores(_Workflow(True, False, 2)) == 2
    # SLURM: the submitting process and the job itself (its own cpus_per_task) keep 8
    assert evaluate_threads(local_cores(_Workflow(False, False, 2))) == 8
    assert evaluate_threads(local_cores(_Workflow(True, True, 8))) == 8
    assert evaluate_threads(local_cores(_Workflow(True, False, None))) == 8


def test_features_rules_ask_for_one_thread_only_where_they_surely_compute_on_this_cpu(
    monkeypatch, tmp_path
) -> None:
    from distinctcap.core import cores

    monkeypatch.setattr(cores, "DRIVER_FILE", tmp_path / "no-driver")
    assert cores.features_threads("cpu", 2) == 1
    assert cores.features_threads("cpu", None) == 1  # a cluster job told to use its CPU
    assert cores.features_threads("auto", 2) == 1  # local, no NVIDIA driver here
    assert cores.features_threads("auto", None) == 256  # a cluster node may have a GPU
    assert cores.features_threads("cuda", 2) == 256
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06\n")
    monkeypatch.setattr(cores, "DRIVER_FILE", driver)
    assert cores.features_threads("auto", 2) == 256  # this machine may give it a GPU
