"""The train rule's entry: train one run in this process or in W torchrun processes.

`train_with_gpus(run, paths, device, gpus, log_file)` is what workflow/scripts/train.py calls.
A run whose job holds W > 1 GPUs (the `gpu` resource of `train_run`, set by the profile) is
trained by `launch(run, paths, device, W)`: it writes the run's effective config, paths and
device to a JSON job file and starts `python -m torch.distributed.run --standalone
--nproc-per-node W -m distinctcap.train.launch JOB.json`; each of the W processes (`main`)
calls `distinctcap.train.trainer.train`, which joins the process group through
distinctcap.core.distributed (DDP's arithmetic is described there).

Kept apart from distinctcap.core.distributed, whose collective helpers the trainer imports: this
module imports the trainer, so neither imports the other back (no import cycle).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from distinctcap.core import logs
from distinctcap.core.devices import resolve_device
from distinctcap.core.distributed import DistEnv
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.run import RunConfig, RunPaths
from distinctcap.train.data import read_run_data
from distinctcap.train.trainer import train

log = logging.getLogger(__name__)


def torchrun_command(nproc: int, *args: str) -> list[str]:
    """`python -m torch.distributed.run` with `nproc` processes on this node, running
    `python -m distinctcap.train.launch ARGS` in each (the rendezvous uses a free local port)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "distinctcap.train.launch",
        *args,
    ]


def launch(
    run: RunConfig,
    paths: RunPaths,
    device: torch.device,
    nproc: int,
    log_file: str | None = None,
    data_file: str | None = None,
):
    """Train `run` in `nproc` torchrun processes and wait; a failed process raises
    DistinctcapError. `log_file` (the rule's log) gets rank 0's log lines appended.
    `data_file`: a RunData written by train.data.save_run_data (tensors only, read with
    weights_only=True) to train on instead of loading the run's inputs.

    The processes get one argument, a JSON job file (`job_json`): options after the module
    name would be parsed (as abbreviations) by torchrun itself."""
    if nproc < 2:
        raise DistinctcapError(f"launch needs >= 2 processes, got {nproc}; call train() instead")
    out_dir = Path(paths.out_dir or tempfile.gettempdir())
    out_dir.mkdir(parents=True, exist_ok=True)
    job = job_json(run, paths, device, log_file, data_file)
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=out_dir, delete=False) as f:
        json.dump(job, f)
    log.info("run %s: training in %d torchrun processes (%s)", run.name, nproc, f.name)
    try:
        done = subprocess.run(torchrun_command(nproc, f.name), check=False)
    finally:
        Path(f.name).unlink(missing_ok=True)
    if done.returncode != 0:
        raise DistinctcapError(
            f"run {run.name}: distributed training over {nproc} processes failed "
            f"(exit {done.returncode}); each failing process's error is in "
            f"{log_file or 'the output above'}"
        )


def train_with_gpus(
    run: RunConfig, paths: RunPaths, device: torch.device, gpus: int, log_file: str | None = None
):
    """The train rule's entry: `gpus` > 1 trains in that many torchrun processes (one per
    GPU), otherwise in this process. Returns the TrainResult of an in-process run, else None."""
    if gpus > 1:
        launch(run, paths, device, gpus, log_file)
        return None
    return train(run, paths, device)


def job_json(
    run: RunConfig,
    paths: RunPaths,
    device: torch.device,
    log_file: str | None = None,
    data_file: str | None = None,
) -> dict:
    """What each torchrun process is given: {"run": the effective run config, "paths":
    RunPaths.to_json, "device", "log": rule log or null, "data": RunData file or null (then
    the data is loaded from the run's inputs)}."""
    return {
        "run": run.effective(),
        "paths": paths.to_json(),
        "device": str(device),
        "log": log_file and str(log_file),
        "data": data_file and str(data_file),
    }


def _worker_logging(log_file: str | None, env: DistEnv) -> None:
    """Every rank appends to the rule's log and writes to stderr: rank 0 its log lines, the
    others their warnings; an error that stops any rank lands in the log (logs.log_uncaught)."""
    logs.setup_append(
        log_file,
        level=logging.INFO if env.is_main else logging.WARNING,
        fmt=f"%(asctime)s %(levelname)s rank{env.rank} %(name)s: %(message)s",
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Entry of each torchrun process: `python -m distinctcap.train.launch JOB.json`, the job
    file `launch` writes (`job_json`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        raise SystemExit("usage: python -m distinctcap.train.launch JOB.json (written by launch)")
    job = json.loads(Path(args[0]).read_text())
    _worker_logging(job.get("log"), DistEnv.from_env())
    data = read_run_data(job["data"]) if job.get("data") else None
    run, paths = RunConfig.from_effective(job["run"]), RunPaths.from_json(job["paths"])
    train(run, paths, resolve_device(job["device"]), data)


if __name__ == "__main__":
    main()
