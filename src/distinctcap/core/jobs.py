"""The start of a job script that runs on a device: its rule's log, its device and its torch
threads, in that order, before it writes anything. The stage it then calls takes the returned
torch.device and never resolves a device again."""

from __future__ import annotations

from typing import Literal

import torch

from distinctcap.core import logs
from distinctcap.core.devices import job_device

# How many torch threads a job runs with:
# - "all": the job's CPUs (snakemake.threads);
# - "all-on-cuda": the job's CPUs on a GPU, one on the CPU, where CPU numbers must not depend
#   on the machine's core count (a conv's sums split over threads differ in the last bit);
# - "unchanged": torch's own default (the machine's cores).
ThreadPolicy = Literal["all", "all-on-cuda", "unchanged"]


def start_job(snakemake, threads: ThreadPolicy) -> torch.device:
    """Set up the rule's log (`logs.setup`), claim the job's GPUs and resolve its device
    (`job_device`: a job that needs a GPU stops here when CUDA is unusable), set the torch
    threads by `threads` (ThreadPolicy) and return the device."""
    logs.setup(snakemake.log[0])
    device = job_device(snakemake.params.device, snakemake.resources.get("gpu", 0))
    set_threads(threads, snakemake.threads, device)
    return device


def set_threads(policy: ThreadPolicy, job_threads: int, device: torch.device) -> None:
    """torch's thread count for a job holding `job_threads` CPUs on `device` (ThreadPolicy)."""
    if policy == "all":
        torch.set_num_threads(job_threads)
    elif policy == "all-on-cuda":
        torch.set_num_threads(job_threads if device.type == "cuda" else 1)
    elif policy != "unchanged":
        raise ValueError(f"threads = {policy!r}: one of all, all-on-cuda, unchanged")
