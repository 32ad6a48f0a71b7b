"""Threads of the rules whose need depends on the machine (imports no torch: read while
Snakemake parses the workflow)."""

from __future__ import annotations

from pathlib import Path

# NVIDIA's kernel driver writes this file when it is loaded (distinctcap.core.devices reads the
# driver's version from it): without it no job on this machine can use a GPU
DRIVER_FILE = Path("/proc/driver/nvidia/version")

# An evaluate job's threads where cores are plenty, and on a cluster, where the job has its own
# cores (the SLURM profile's cpus_per_task)
EVALUATE_MAX_THREADS = 8


def local_cores(workflow) -> int | None:
    """`--cores` of a Snakemake run on this machine; None when not given and in a cluster
    job (local_exec is False where the SLURM executor submits, remote_exec true in the job)."""
    if not workflow.local_exec or workflow.remote_exec:
        return None
    value = workflow.global_resources.get("_cores")
    return getattr(value, "value", value)  # a Resource in some Snakemake versions


def evaluate_threads(cores: int | None, pending_runs: int | None = None) -> int:
    """The evaluate rule's threads on a machine of `cores` (`local_cores`) when `pending_runs`
    runs still have training or evaluation to do in this invocation (`pending_runs`).

    The cores shared among the runs that can go side by side, from 1 to EVALUATE_MAX_THREADS:
    the job's parallel parts (forked n-gram scorers, METEOR servers on half its threads, PTB
    JVMs per 20,000 captions) only pay at COCO size, while on the shapes default most of its
    time is serial (JVM starts, CLIP, diversity), so a job holding both cores of a 2-core box
    blocks the training or decode that is ready beside it (issue 46: 8 threads, capped at 2,
    did). One run left gets every core (up to the cap); with the count unknown, half of them.
    Without a local core count (a cluster job, on its own cores) it keeps EVALUATE_MAX_THREADS."""
    if not cores:
        return EVALUATE_MAX_THREADS
    sharing = min(cores, pending_runs) if pending_runs else 2
    return max(1, min(EVALUATE_MAX_THREADS, cores // sharing))


def pending_runs(runs, done) -> int | None:
    """How many of `runs` are not `done` (a predicate on the run's name, e.g. "its metrics
    exist"); None when all are, as in a forced rerun, where the jobs to come are unknown."""
    left = sum(1 for run in runs if not done(run))
    return left or None


def features_threads(device: str, cores: int | None, asked: int = 256) -> int:
    """Threads of a rule that computes CLIP features (extract_features, judge_features): every
    CPU it may have (`asked`, capped by Snakemake) for DataLoader workers where a GPU may
    compute; 1 where the job will surely run on this machine's CPU, since it computes on one
    torch thread there (core.jobs.set_threads, all-on-cuda), so on a 2-core box the trainer's
    and the judge's features go side by side (issue 46). Sure means `device: cpu`, or `auto`
    in a local run (`cores` from `local_cores`) on a machine without NVIDIA's driver."""
    local_without_gpu = cores is not None and not DRIVER_FILE.exists()
    return 1 if device == "cpu" or (device == "auto" and local_without_gpu) else asked
