"""The pipeline through the snakemake SLURM executor on the real local cluster of
.ci/slurm/start.sh (partitions cpu and gpu, account distinctcap, two fake GPUs of type fakegpu).

One module-scoped run of the tiny DAG with tests/slurm_profile (the shipped SLURM profile with
this cluster's values, test_profiles.py checks the mirror); the tests read what happened back
from SLURM accounting (sacct via slurmdbd): every job ran under SLURM and completed, and the
GPU rules asked for GPUs. A second test trains a run on 2 (fake) GPUs, i.e. in 2 torchrun
processes, requeues the running job (`scontrol requeue`, what a preemption does) and checks
that it resumed from its checkpoint and completed.

Skipped when no cluster answers `scontrol ping`, unless DISTINCTCAP_REQUIRE_SLURM=1 (CI), where
that is a failure. Every snakemake call is wrapped in `timeout -k 10 N`.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT, SNAKEMAKE, failed_job_logs, slurm, slurm_env, tiny_config

from distinctcap.captioner.model import Captioner

pytestmark = pytest.mark.slurm

PROFILE = ROOT / "tests" / "slurm_profile"
GPU_RULES = {
    "preflight",  # on the GPU partition with one GPU, to check the node the others will get
    "train_clip",
    "extract_features",
    "train_run",
    "decode",
    "retrieval_entropy",
    "neighbours",
    "train_judge_clip",  # as train_clip and extract_features
    "judge_features",
}
GROUP = "decode_evaluate"  # the profile's group of decode and evaluate_gpu: one SLURM job
# The tiny DAG of slurm_config: every rule but `all` (local) and neighbours (no run needs it).
DAG_RULES = {
    "preflight", "prepare_data", "train_clip", "extract_features", "retrieval_entropy",
    "split_entropy", "entropy_report", "train_run", "decode", "evaluate_gpu", "evaluate",
    "summarize",
    "report_tables", "report_plots", "report_gallery", "run_card", "versus_reference",
    "report_times", "train_judge_clip", "judge_features",
}  # fmt: skip
GPU_TYPE = "fakegpu"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}
PIPELINE_TIMEOUT = 720  # s, a guard: the module takes ~5 min on a free 2-core machine
SACCT_FIELDS = ["JobID", "Comment", "State", "ReqTRES", "Partition"]


# ---------------------------------------------------------------------------------------------
# What SLURM accounting says (the cluster and its client: tests/conftest.py)


@dataclass
class SlurmJob:
    job_id: str
    rule: str
    wildcards: str
    state: str
    req_tres: dict[str, str]
    partition: str


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
                    r["Partition"],
                )
                for r in rows
            ]
        if time.monotonic() > deadline:
            pytest.fail(f"jobs of run {run_uuid} not all accounted after {timeout}s:\n{out}")
        time.sleep(1)


def job_states(job_id: str) -> list[str]:
    """State of every record of a job, oldest first, requeued runs included (sacct -D)."""
    out = slurm("sacct", "-X", "-D", "-n", "-P", "-j", job_id, "--format=State")
    return [line.split()[0] for line in out.splitlines()]


def step_states(job_id: str) -> list[str]:
    """State of each step of a job (batch, extern, the srun steps)."""
    out = slurm("sacct", "-n", "-P", "-j", job_id, "--format=JobID,State")
    return [state.split()[0] for jid, state in (line.split("|") for line in out.splitlines())
            if "." in jid]


def job_restarts(job_id: str) -> int:
    """How often SLURM restarted the job (the job's SLURM_RESTART_COUNT); from slurmctld,
    which keeps finished jobs for MinJobAge (sacct has no such field in 22.05)."""
    fields = dict(
        f.split("=", 1) for f in slurm("scontrol", "-o", "show", "job", job_id).split() if "=" in f
    )
    return int(fields["Restarts"])


# ---------------------------------------------------------------------------------------------
# Running the pipeline


# What the SLURM tests build: the whole tiny DAG of slurm_config (one MLE run, one decoding
# setting), CPU rules, evaluation and reports included, every job through sbatch. On the 2-CPU
# test cluster every job pays ~10 s for the in-job snakemake and up to ~40 s of the executor's
# growing status-poll interval.
TARGETS = ["all"]
PROBE = "requeue_probe"  # the run the requeue test trains, preempts and resumes
# ~6 s of training on a free CPU core: the first checkpoint comes after 10 steps, so the test
# has the other 140 to requeue the job while it runs.
# Long enough that `scontrol requeue` lands mid-training on a quiet machine (~90 steps/s there)
PROBE_STEPS, PROBE_CHECKPOINT_EVERY = 1500, 10


def slurm_config() -> dict:
    """The tiny config, smaller still: SLURM execution is under test here, not the models."""
    config = tiny_config()
    # The cluster's GPUs are fake: a job holding one stops when CUDA is unusable unless the
    # config says cpu (distinctcap.core.devices.resolve_device).
    config["device"] = "cpu"
    config["clip"] = {**config.get("clip", {}), "train": {"epochs": 2, "batch_size": 64}}
    config["captioner"] = {"width": 32, "enc_layers": 1, "dec_layers": 1, "heads": 2, "ffn": 64}
    config["train"] = {
        **config.get("train", {}),
        "steps": 20,
        "batch_size": 32,
        "warmup_steps": 2,
        "val_every": 0,
        "checkpoint_every": 0,
    }
    config["runs"] = {"reference": {"method": "mle", "data": "all"}}
    config["decoding"] = {"greedy": {"kind": "greedy"}}
    return config


def probe_config(config: dict) -> dict:
    """`config` plus a run long enough to be requeued after its first checkpoint."""
    config = copy.deepcopy(config)
    config["runs"][PROBE] = {
        "method": "mle",
        "data": "all",
        "train": {
            "steps": PROBE_STEPS,
            "checkpoint_every": PROBE_CHECKPOINT_EVERY,
            "log_every": PROBE_CHECKPOINT_EVERY,
        },
    }
    return config


def start_snakemake(
    workdir: Path, log: Path, *args: str, timeout: int, profile: Path = PROFILE
) -> subprocess.Popen:
    cmd = ["timeout", "-k", "10", str(timeout), SNAKEMAKE, "--workflow-profile", str(profile)]
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


def wait_or_cancel(proc: subprocess.Popen, log: Path) -> None:
    """Wait for snakemake; then cancel whatever SLURM jobs of its run are still there (a
    snakemake killed by `timeout` leaves its jobs behind)."""
    try:
        proc.wait()
    finally:
        match = re.search(r"SLURM run ID: ([0-9a-f-]{36})", log.read_text())
        if match:
            subprocess.run(["scancel", "--name", match.group(1)], env=slurm_env(), check=False)


@dataclass
class PipelineRun:
    workdir: Path
    config: dict
    since: str  # sacct start time covering the module's jobs
    returncode: int
    log: str
    seconds: float
    jobs: list[SlurmJob]

    def submitted(self) -> dict[str, str]:
        """SLURM job id -> snakemake log line, for every job snakemake submitted."""
        found = re.findall(r"(Job \S+ has been submitted with SLURM jobid (\d+).*)", self.log)
        return {job_id: line for line, job_id in found}


def run_uuid(log: str) -> str:
    match = re.search(r"SLURM run ID: ([0-9a-f-]{36})", log)
    assert match, f"no 'SLURM run ID' in the snakemake log:\n{log[-3000:]}"
    return match.group(1)


def failure(proc: subprocess.Popen, text: str, workdir: Path) -> str:
    """What a failed snakemake said, with the failed jobs' own logs."""
    logs = failed_job_logs(workdir, text)
    return f"snakemake failed ({proc.returncode}):\n{text[-6000:]}\n{logs}"


def sacct_time() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 60))


@pytest.fixture(scope="module")
def pipeline(cluster: None, tmp_path_factory) -> PipelineRun:
    config = slurm_config()
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm"), config)
    since, t0 = sacct_time(), time.monotonic()
    log = workdir / "snakemake.out"
    proc = start_snakemake(workdir, log, *TARGETS, timeout=PIPELINE_TIMEOUT)
    wait_or_cancel(proc, log)
    seconds = time.monotonic() - t0
    text = log.read_text()
    assert proc.returncode == 0, failure(proc, text, workdir)
    jobs = accounted_jobs(run_uuid(text), since)
    print(f"\nSLURM pipeline: {len(jobs)} jobs in {seconds:.0f} s")
    return PipelineRun(workdir, config, since, proc.returncode, text, seconds, jobs)


# ---------------------------------------------------------------------------------------------
# Tests


def test_every_job_ran_under_slurm_and_completed(pipeline: PipelineRun) -> None:
    submitted = pipeline.submitted()
    assert submitted, "snakemake submitted no SLURM job"
    assert {job.job_id for job in pipeline.jobs} == set(submitted)
    assert [job for job in pipeline.jobs if job.state != "COMPLETED"] == []
    # Every non-local job of the DAG was one SLURM job; decode and evaluate_gpu shared one.
    non_local = re.findall(r"^rule (\w+):$", pipeline.log, flags=re.MULTILINE)
    grouped = [job for job in pipeline.jobs if job.rule.startswith(GROUP)]
    assert len(grouped) == 1
    assert sorted(non_local) == sorted(j.rule for j in pipeline.jobs if j not in grouped)
    assert set(non_local) == DAG_RULES - {"decode", "evaluate_gpu"}
    for output in ("generated/reference/test-greedy", "metrics/reference/test-greedy"):
        assert (pipeline.workdir / "results" / f"{output}.parquet").exists()
    assert (pipeline.workdir / "results" / "report" / "tables.md").exists()
    # the efficiency report (sacct's CPU and memory use per job) of the run
    (report,) = (pipeline.workdir / "logs" / "slurm").glob("efficiency_report_*.csv")
    assert len(pd.read_csv(report)) >= len(pipeline.jobs)


def test_a_local_run_of_the_same_config_gives_the_same_numbers(
    pipeline: PipelineRun, tmp_path
) -> None:
    """Determinism across executors and job order: the same config run again with plain
    snakemake in another directory gives the SLURM run's summary. Its jobs get one core each,
    as the profile's SLURM jobs do: a CPU reduction over another number of threads may differ
    in the last bit. Every value is identical but CLIPScore, which differed by 1.7e-5
    relative (0.2372130 here, 0.2372169 under SLURM; its cause, inside the CLIP's text tower on
    a job that sees one CPU against two, was not found), so it is compared to 1e-4, and so is
    RefCLIPScore, from the same text tower (0.367753 here, 0.367758 under SLURM). The judge
    CLIP's CLIPScore and RefCLIPScore, from the text tower of a CLIP the run trained (issue
    45), differed by 1.8e-3 relative (0.526583 here, 0.527517 under SLURM) and by 5.1e-3 in a
    later CI run (0.526783 here, 0.529446 under SLURM; its weights, like the trainer CLIP's,
    are not bit-identical across the two executors), so they are compared to 1e-2; its ranks
    were identical."""
    workdir = copy_workflow(tmp_path, pipeline.config)
    cmd = ["timeout", "-k", "10", "900", SNAKEMAKE, "--cores", "1"]
    done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    local, under_slurm = (
        pd.read_csv(w / "results/metrics/summary.csv") for w in (workdir, pipeline.workdir)
    )
    text_tower = {"clipscore": 1e-4, "refclipscore": 1e-4, "judge_clipscore": 1e-2,
                  "judge_refclipscore": 1e-2}  # fmt: skip
    exact = [c for c in local.columns if c not in text_tower]
    pd.testing.assert_frame_equal(local[exact], under_slurm[exact], check_exact=True)
    for column, rel in text_tower.items():
        assert local[column].tolist() == pytest.approx(under_slurm[column].tolist(), rel=rel)


def test_gpu_rules_were_submitted_with_a_gpu_request(pipeline: PipelineRun) -> None:
    for job in pipeline.jobs:
        on_gpu = job.rule in GPU_RULES or job.rule.startswith(GROUP)
        if on_gpu:
            assert job.req_tres.get("gres/gpu") == "1", job
            assert job.req_tres.get(f"gres/gpu:{GPU_TYPE}") == "1", job
        else:
            assert "gres/gpu" not in job.req_tres, job
        # CPU rules on the CPU partition, GPU rules (and decode's group) on the GPU partition
        assert job.partition == ("gpu" if on_gpu else "cpu"), job
        # the CPU evaluate job takes the profile's 2 cores for its metrics, the others one
        assert job.req_tres["cpu"] == ("2" if job.rule == "evaluate" else "1"), job
        assert job.req_tres["node"] == "1", job


def slurm_job_of(log: Path, rule: str, wildcard: str, proc: subprocess.Popen) -> str:
    """The SLURM job id snakemake reports for `rule` with `wildcard`, once it is submitted."""
    pattern = re.compile(rf"submitted with SLURM jobid (\d+) \(log: \S*rule_{rule}/\S*{wildcard}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        match = pattern.search(log.read_text())
        if match:
            return match.group(1)
        time.sleep(0.5)
    pytest.fail(f"no {rule} job for {wildcard} submitted:\n{log.read_text()[-3000:]}")


def wait_running_with_checkpoint(job_id: str, checkpoint: Path, proc: subprocess.Popen) -> None:
    """Until SLURM runs the job and the trainer has written its first checkpoint
    (`scontrol requeue` refuses a pending job, and there must be something to resume from)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        state = slurm("squeue", "-h", "-j", job_id, "-o", "%T").strip()
        if state == "RUNNING" and checkpoint.exists():
            return
        time.sleep(0.5)
    pytest.fail(f"job {job_id} never RUNNING with {checkpoint} (snakemake rc {proc.poll()})")


def two_gpu_profile(dest: Path) -> Path:
    """The test profile with train_run asking for both GPUs of the cluster."""
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    profile["set-resources"]["train_run"]["gpu"] = 2
    profile["set-resources"]["train_run"]["mem_mb"] = "8000 * attempt"  # two trainers
    dest.mkdir()
    (dest / "config.yaml").write_text(yaml.safe_dump(profile))
    return dest


def test_requeued_two_gpu_training_job_resumes_from_its_checkpoint(pipeline: PipelineRun) -> None:
    """A train_run job with gpu=2 trains in 2 torchrun processes (gloo here: the GPUs are
    fake). Then what a preemption does: SLURM kills the running job and queues it again; the
    second start must continue from results/runs/<run>/checkpoints/last.pt and complete."""
    workdir = pipeline.workdir
    # The pipeline's config plus one run: nothing upstream reruns.
    (workdir / "config.yaml").write_text(yaml.safe_dump(probe_config(pipeline.config)))
    out_dir = workdir / "results" / "runs" / PROBE
    log = workdir / "requeue.out"
    target = f"results/runs/{PROBE}/model.pt"
    profile = two_gpu_profile(workdir / "two_gpu_profile")
    proc = start_snakemake(workdir, log, target, timeout=480, profile=profile)
    try:
        job_id = slurm_job_of(log, "train_run", PROBE, proc)
        wait_running_with_checkpoint(job_id, out_dir / "checkpoints" / "last.pt", proc)
        slurm("scontrol", "requeue", job_id)
        requeued_at = time.monotonic()
    finally:
        wait_or_cancel(proc, log)
    text = log.read_text()
    assert proc.returncode == 0, failure(proc, text, workdir)
    print(f"\nrequeue: job {job_id} completed {time.monotonic() - requeued_at:.0f} s after it")

    # SLURM: the job ran twice (sacct -D lists the requeued record), the second time completed.
    states = job_states(job_id)
    assert states[-1] == "COMPLETED" and "REQUEUED" in states[:-1], states
    assert job_restarts(job_id) == 1
    (job,) = [j for j in accounted_jobs(run_uuid(text), pipeline.since) if j.job_id == job_id]
    assert job.req_tres.get("gres/gpu") == "2", job
    # The trainer: started again from a checkpoint, and its curve runs on without a gap.
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["steps"] == PROBE_STEPS and summary["processes"] == 2
    resumed = summary["resumed_from"]
    assert resumed and resumed % PROBE_CHECKPOINT_EVERY == 0 and 0 < resumed < PROBE_STEPS
    steps = pd.read_csv(out_dir / "curve.csv").step.tolist()
    assert steps == list(range(PROBE_CHECKPOINT_EVERY, PROBE_STEPS + 1, PROBE_CHECKPOINT_EVERY))
    train_log = (workdir / "logs" / "train" / f"{PROBE}.log").read_text()
    assert f"at step {resumed}" in train_log and "resumed from" in train_log
    assert not (out_dir / "checkpoints").exists()  # removed once the run is complete


# ---------------------------------------------------------------------------------------------
# Limits: memory (cgroups) and time, each followed by snakemake's attempt-scaled retry

OOM, TIMEOUT = "oom_probe", "timeout_probe"
# Steps that take well over the probe's 1-minute limit (SLURM checks limits every 30 s, so it
# ends the job 60-90 s in): 93 steps/s on the quiet 2-core dev box (6000 steps finished in 64 s
# there, before the limit), 21 steps/s under load: 15000 steps take ~160 s at the fastest.
TIMEOUT_STEPS, TIMEOUT_CHECKPOINT_EVERY = 15000, 500


def memory_enforced() -> bool:
    """Whether the cluster enforces --mem (start.sh chose task/cgroup)."""
    return "task/cgroup" in slurm("scontrol", "show", "config")


def limits_config(config: dict) -> dict:
    """`config` plus a short run to go over its memory and a long one to go over its time
    limit (that a resumed run ends on the uninterrupted weights is test_train.py's check)."""
    config = copy.deepcopy(config)
    config["runs"][OOM] = {"method": "mle", "data": "all"}
    every = TIMEOUT_CHECKPOINT_EVERY
    long = {"steps": TIMEOUT_STEPS, "checkpoint_every": every, "log_every": every}
    config["runs"][TIMEOUT] = {"method": "mle", "data": "all", "train": long}
    return config


def limits_profile(dest: Path) -> Path:
    """The test profile with retries, and train_run's memory and time, attempt-scaled as in
    the shipped profile, but below what the probe runs need at attempt 1: 400 MB (a train_run
    job peaked at ~1.5 GB) for the OOM probe, 1 minute for the TIMEOUT probe."""
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    profile["retries"] = 1
    train = profile["set-resources"]["train_run"]
    train["mem_mb"] = f"400 * 10 ** (attempt - 1) if wildcards.run == '{OOM}' else 4000 * attempt"
    train["runtime"] = f"1 if wildcards.run == '{TIMEOUT}' and attempt == 1 else 20 * attempt"
    dest.mkdir()
    (dest / "config.yaml").write_text(yaml.safe_dump(profile))
    return dest


def attempts(jobs: list[SlurmJob], run: str) -> list[SlurmJob]:
    """The SLURM jobs of train_run for `run`, first attempt first."""
    mine = [j for j in jobs if j.rule == "train_run" and j.wildcards == run]
    return sorted(mine, key=lambda j: int(j.job_id))


def test_jobs_over_memory_or_time_end_so_and_their_retry_completes(pipeline: PipelineRun) -> None:
    """OUT_OF_MEMORY: the cgroup kills a job over its --mem and snakemake resubmits it with the
    memory of attempt 2. TIMEOUT: SLURM ends a training job at its time limit; the retry resumes
    from the last checkpoint and completes the run's steps."""
    if not memory_enforced():
        pytest.skip("the cluster does not enforce memory (no cgroups; see start.sh's warning)")
    workdir = pipeline.workdir
    (workdir / "config.yaml").write_text(yaml.safe_dump(limits_config(pipeline.config)))
    log = workdir / "limits.out"
    targets = [f"results/runs/{run}/model.pt" for run in (TIMEOUT, OOM)]
    profile = limits_profile(workdir / "limits_profile")
    t0 = time.monotonic()
    proc = start_snakemake(workdir, log, *targets, timeout=1200, profile=profile)
    wait_or_cancel(proc, log)
    text = log.read_text()
    assert proc.returncode == 0, failure(proc, text, workdir)
    print(f"\nlimits: {time.monotonic() - t0:.0f} s")
    jobs = accounted_jobs(run_uuid(text), pipeline.since)

    oom = attempts(jobs, OOM)
    assert [j.state for j in oom][1:] == ["COMPLETED"], oom
    # the cgroup kills the step that ran over and SLURM records OUT_OF_MEMORY on it; the job's
    # own record says so too unless its batch script exits first on the step's failure (FAILED)
    assert "OUT_OF_MEMORY" in [oom[0].state, *step_states(oom[0].job_id)], oom
    assert [j.req_tres["mem"] for j in oom] == ["400M", "4000M"], oom

    timeout = attempts(jobs, TIMEOUT)
    assert [j.state for j in timeout] == ["TIMEOUT", "COMPLETED"], timeout
    out_dir = workdir / "results" / "runs" / TIMEOUT
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["steps"] == TIMEOUT_STEPS
    resumed = summary["resumed_from"]
    assert resumed and resumed % TIMEOUT_CHECKPOINT_EVERY == 0 and resumed < TIMEOUT_STEPS
    steps = pd.read_csv(out_dir / "curve.csv").step.tolist()
    every = TIMEOUT_CHECKPOINT_EVERY
    assert steps == list(range(every, TIMEOUT_STEPS + 1, every))  # no gap, no repeat
    assert Captioner.load(out_dir / "model.pt").state_dict()  # the finished model loads


# ---------------------------------------------------------------------------------------------
# Bad input


def test_an_unknown_partition_fails_the_job_with_slurms_error(cluster: None, tmp_path) -> None:
    """sbatch refuses the job: snakemake must log SLURM's reason and fail, not wait."""
    (tmp_path / "work").mkdir()
    workdir = copy_workflow(tmp_path / "work", slurm_config())
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    profile["default-resources"]["slurm_partition"] = "no_such_partition"
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    log = tmp_path / "snakemake.out"
    proc = start_snakemake(
        workdir, log, "results/data/images.parquet", timeout=180, profile=tmp_path / "profile"
    )
    wait_or_cancel(proc, log)
    text = log.read_text()
    assert proc.returncode not in (0, 124, 137), text[-3000:]  # failed, not timed out
    assert "invalid partition specified: no_such_partition" in text, text[-3000:]
    assert "Error in rule prepare_data" in text or "prepare_data" in text
