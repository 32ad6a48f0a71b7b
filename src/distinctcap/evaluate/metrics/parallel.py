"""The text metrics' use of a job's cores: `fork_map` runs a pure-Python function over items in
forked worker processes (the n-gram metrics hold the GIL, so threads would not help).

The function and its inputs reach the workers through the fork, never through pickling: a
closure over a CIDEr-D scorer with the document frequencies of 591k training captions costs
nothing to hand over. Only the results travel back. Each item is computed by the same code as
in the serial path and the results come back in item order, so every number is the serial
one to the last digit.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")

_TASK: tuple[Callable, Sequence] | None = None  # what the forked workers compute
CHUNKS_PER_WORKER = 4  # a few chunks each, so a slow chunk does not leave a core idle


def _run_chunk(bounds: tuple[int, int]) -> list:
    fn, items = _TASK
    return [fn(item) for item in items[bounds[0] : bounds[1]]]


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """[start, end) of `chunks` contiguous, nearly equal parts of range(n) (none empty)."""
    chunks = max(1, min(chunks, n))
    edges = [n * k // chunks for k in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def fork_map(fn: Callable[[T], R], items: Sequence[T], workers: int = 1) -> list[R]:
    """[fn(item) for item in items], over `workers` forked processes when workers > 1."""
    return fork_map_beside(fn, items, workers, lambda: None)[0]


def fork_map_beside(
    fn: Callable[[T], R], items: Sequence[T], workers: int, beside: Callable[[], S]
) -> tuple[list[R], S]:
    """(`fork_map(fn, items, workers)`, beside()): `beside` runs in this process while the
    workers compute (e.g. threads feeding the Java tools); it starts after the fork, so no
    thread of it is copied into a worker."""
    global _TASK
    items = list(items)
    if workers <= 1 or len(items) < 2:
        return [fn(item) for item in items], beside()
    _TASK = (fn, items)
    try:
        context = multiprocessing.get_context("fork")
        bounds = chunk_bounds(len(items), workers * CHUNKS_PER_WORKER)
        with ProcessPoolExecutor(min(workers, len(bounds)), mp_context=context) as pool:
            futures = [pool.submit(_run_chunk, b) for b in bounds]  # forks every worker
            side = beside()
            parts = [f.result() for f in futures]
    finally:
        _TASK = None
    return [result for part in parts for result in part], side
