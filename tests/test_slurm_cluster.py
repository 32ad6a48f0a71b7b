"""Smoke test of the local SLURM cluster started by .ci/slurm/start.sh.

Submits real batch jobs and reads their records back from accounting (sacct via slurmdbd),
which is what the snakemake slurm executor relies on. Skipped when no cluster answers (the
`cluster` fixture, tests/conftest.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import slurm

pytestmark = pytest.mark.slurm

GPU_TYPE = os.environ.get("SLURM_FAKE_GPU_TYPE", "fakegpu")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


def _submit(workdir: Path, name: str, script: str, *options: str) -> str:
    args = ["-J", name, "--comment", f"rule_{name}", "-D", str(workdir), "-o", f"{name}.out"]
    out = slurm("sbatch", "--parsable", *args, *options, "--wrap", script)
    return out.strip().split(";")[0]


def _wait_accounted(job_id: str, timeout: float = 90) -> dict[str, str]:
    """Poll sacct until the job's own record (not its steps) is terminal and has its TRES.

    slurmdbd may store the end state before ReqTRES (seen empty right after COMPLETED).
    """
    fields = ["State", "ReqTRES", "AllocTRES", "Comment"]
    deadline = time.monotonic() + timeout
    while True:
        out = slurm("sacct", "-X", "-j", job_id, f"--format={','.join(fields)}", "-P", "-n")
        lines = out.strip().splitlines()
        if lines:
            record = dict(zip(fields, lines[0].split("|"), strict=True))
            if record["State"].split()[0] in TERMINAL and record["ReqTRES"]:
                return record
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} not finished in sacct after {timeout}s: {out!r}")
        time.sleep(1)


def _tres(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if item)


def _mebibytes(value: str) -> float:
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}
    return float(value[:-1]) * units[value[-1]] if value[-1] in units else float(value)


def test_plain_job_completes_with_default_memory(cluster: None, tmp_path: Path) -> None:
    job = _submit(tmp_path, "plain", "echo plain-ok")
    record = _wait_accounted(job)
    assert record["State"] == "COMPLETED", record
    # AccountingStoreFlags=job_comment: the snakemake plugin's rule_<name> comment is kept.
    assert record["Comment"] == "rule_plain"
    assert (tmp_path / "plain.out").read_text().strip() == "plain-ok"
    alloc = _tres(record["AllocTRES"])
    assert "gres/gpu" not in _tres(record["ReqTRES"])
    assert alloc["cpu"] == "1"
    node_mem = int(slurm("sinfo", "-h", "-o", "%m").split()[0].rstrip("+"))
    # DefMemPerCPU keeps a 1-CPU job from taking the whole node's memory.
    assert _mebibytes(alloc["mem"]) < node_mem


@pytest.mark.parametrize("request_gpu", ["--gres=gpu:1", "--gpus=1", f"--gpus={GPU_TYPE}:1"])
def test_gpu_job_gets_a_fake_gpu(cluster: None, tmp_path: Path, request_gpu: str) -> None:
    # The snakemake plugin emits --gpus=1 for `gpu=1`, --gpus=MODEL:1 with `gpu_model`,
    # and --gres=gpu:1 for `gres="gpu:1"`.
    job = _submit(tmp_path, "gpu", 'echo "CVD=${CUDA_VISIBLE_DEVICES-unset}"', request_gpu)
    record = _wait_accounted(job)
    assert record["State"] == "COMPLETED", record
    assert _tres(record["ReqTRES"]).get("gres/gpu") == "1", record
    assert _tres(record["AllocTRES"]).get("gres/gpu") == "1", record
    assert _tres(record["AllocTRES"]).get(f"gres/gpu:{GPU_TYPE}") == "1", record
    if GPU_TYPE in request_gpu:
        assert _tres(record["ReqTRES"]).get(f"gres/gpu:{GPU_TYPE}") == "1", record
    visible = (tmp_path / "gpu.out").read_text().strip().removeprefix("CVD=")
    assert visible in {"0", "1"}, visible
