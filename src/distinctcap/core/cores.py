"""Threads of the rules whose need depends on the machine (imports no torch: read while
Snakemake parses the workflow)."""

from __future__ import annotations

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


def evaluate_threads(cores: int | None) -> int:
    """The evaluate rule's threads on a machine of `cores` (`local_cores`).

    Half the cores, from 1 to EVALUATE_MAX_THREADS: the job's parallel parts (forked n-gram
    scorers, METEOR servers on half its threads, PTB JVMs per 20,000 captions) only pay at
    COCO size, while on the shapes default most of its time is serial (JVM starts, CLIP,
    diversity), so a job holding both cores of a 2-core box would block the training or
    decode that is ready beside it (issue 46: 8 threads, capped at 2, did). Without a local
    core count (a cluster job, on its own cores) it keeps EVALUATE_MAX_THREADS."""
    if not cores:
        return EVALUATE_MAX_THREADS
    return max(1, min(EVALUATE_MAX_THREADS, cores // 2))
