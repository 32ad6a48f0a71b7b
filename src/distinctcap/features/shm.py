"""/dev/shm against the feature loader's workers: a DataLoader worker's prefetched batches sit
in shared memory, and a container's 64 MB default otherwise ends the job with a bus error.
The extraction takes fewer workers with a warning (`workers_fitting_shm`); the preflight job
checks the same before anything runs (distinctcap.runs.preflight).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

GB = 1e9
SHM_SAFETY = 2  # a worker's batch sits in shared memory twice (its tensors, then collated)
LOADER_PREFETCH = 4  # batches each feature-loader worker prepares ahead (features.extract)


def shm_workers(workers: int, batch_bytes: float, prefetch: int, shm_free: float) -> int:
    """The most DataLoader workers (<= `workers`) whose prefetched batches fit /dev/shm."""
    per_worker = batch_bytes * prefetch * SHM_SAFETY
    return min(workers, int(shm_free // per_worker)) if per_worker else workers


def check_shm(workers: int, batch_bytes: float, prefetch: int, shm_free: float):
    """A warning, not a stop: the feature loader runs with fewer workers (shm_workers)."""
    fits = shm_workers(workers, batch_bytes, prefetch, shm_free)
    if fits >= workers:
        return None
    need = workers * batch_bytes * prefetch * SHM_SAFETY
    return (
        f"/dev/shm has {shm_free / GB:.2f} GB free, {workers} loader workers need about "
        f"{need / GB:.2f} GB: feature extraction runs with {fits} (set clip.features.workers: "
        f"{fits} to silence this, or give the job more shared memory, e.g. docker --shm-size)"
    )


def shm_free() -> float:
    return shutil.disk_usage("/dev/shm").free if Path("/dev/shm").is_dir() else float("inf")


def workers_fitting_shm(workers: int, batch_bytes: float) -> int:
    """The feature loader's workers, fewer with a warning when /dev/shm is too small for them
    (a container's 64 MB default otherwise ends the job with a bus error)."""
    line = check_shm(workers, batch_bytes, LOADER_PREFETCH, shm_free())
    if line is None:
        return workers
    log.warning(line)
    return shm_workers(workers, batch_bytes, LOADER_PREFETCH, shm_free())
