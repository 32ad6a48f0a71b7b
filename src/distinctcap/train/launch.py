"""The train rule's entry: train one run in this process or in W torchrun processes.

`train_with_gpus(cfg, gpus, log_file)` is what workflow/scripts/train.py calls. A run whose
job holds W > 1 GPUs (the `gpu` resource of `train_run`, set by the profile) is trained by
`launch(cfg, W)`: it writes the run config to a JSON job file and starts
`python -m torch.distributed.run --standalone --nproc-per-node W -m distinctcap.train.launch
JOB.json`; each of the W processes (`main`) calls `distinctcap.train.trainer.train(cfg)`, which
joins
the process group through distinctcap.core.distributed (DDP's arithmetic is described there).

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
from distinctcap.core.distributed import DistEnv
from distinctcap.core.errors import DistinctcapError
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


def launch(cfg: dict, nproc: int, log_file: str | None = None, data_file: str | None = None):
    """Train run `cfg` in `nproc` torchrun processes and wait; a failed process raises
    DistinctcapError. `log_file` (the rule's log) gets rank 0's log lines appended.
    `data_file`: a `torch.save`d RunData to train on instead of loading `cfg["paths"]`.

    The processes get one argument, a JSON job file ({"cfg", "log", "data"}): options after
    the module name would be parsed (as abbreviations) by torchrun itself."""
    if nproc < 2:
        raise DistinctcapError(f"launch needs >= 2 processes, got {nproc}; call train() instead")
    out_dir = Path(cfg.get("paths", {}).get("out_dir") or tempfile.gettempdir())
    out_dir.mkdir(parents=True, exist_ok=True)
    job = {"cfg": cfg, "log": log_file and str(log_file), "data": data_file and str(data_file)}
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=out_dir, delete=False) as f:
        json.dump(job, f)
    log.info("run %s: training in %d torchrun processes (%s)", cfg.get("name"), nproc, f.name)
    try:
        done = subprocess.run(torchrun_command(nproc, f.name), check=False)
    finally:
        Path(f.name).unlink(missing_ok=True)
    if done.returncode != 0:
        raise DistinctcapError(
            f"run {cfg.get('name')}: distributed training over {nproc} processes failed "
            f"(exit {done.returncode}); each failing process's error is in "
            f"{log_file or 'the output above'}"
        )


def train_with_gpus(cfg: dict, gpus: int, log_file: str | None = None):
    """The train rule's entry: `gpus` > 1 trains in that many torchrun processes (one per
    GPU), otherwise in this process. Returns the TrainResult of an in-process run, else None."""
    if gpus > 1:
        launch(cfg, gpus, log_file)
        return None
    return train(cfg)


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
    file `launch` writes: {"cfg": run config, "log": rule log or null, "data": RunData file
    or null (then the data is loaded from cfg["paths"])}."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        raise SystemExit("usage: python -m distinctcap.train.launch JOB.json (written by launch)")
    job = json.loads(Path(args[0]).read_text())
    _worker_logging(job.get("log"), DistEnv.from_env())
    data = torch.load(job["data"], weights_only=False) if job.get("data") else None
    train(job["cfg"], data)


if __name__ == "__main__":
    main()
