"""What one (split, decoding) evaluation reads, and the helpers both of its parts share.

The evaluate stage's two parts, the torch part (evaluate.device: CLIP, the judge CLIP, the
captioner, GPT-2) and the CPU part (evaluate.stage: the text metrics), read the same inputs:
the rule's paths (`EvalPaths`, `stage_paths`), a run's generated captions and the split's
and the training images' references (`DecodingInputs`; the tables through the job's
evaluate.loaded.JobLoads); and time their parts alike (`timed`, `log_timings`).
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from distinctcap.core import logs
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_table
from distinctcap.evaluate.loaded import JobLoads, captions_by_image

log = logging.getLogger(__name__)


@dataclass
class EvalPaths:
    """Where one evaluation reads from: the rule's named inputs."""

    generated: str  # results/generated/{run}/{split}-{decoding}.parquet
    images: str
    captions: str
    vocab: str
    features: str  # the CLIP features index JSON (distinctcap.features.extract)
    model: str | None = None  # the run's captioner, for model-based self-retrieval
    captioner_features: str | None = None  # the captioner's own image features, if not CLIP's
    judge_features: str | None = None  # the judge CLIP's pooled features (evaluate.judge), if any


def read_generated(path: str | Path) -> tuple[str, dict[int, list[str]]]:
    """(run, image id -> captions in sample order) of a generated table."""
    table = read_table(path, "generated").sort_values(["image_id", "sample"])
    runs = table.run.unique()
    if len(runs) != 1:
        raise DistinctcapError(f"{path}: a generated table holds one run, found {list(runs)}")
    if table.empty:
        raise DistinctcapError(f"{path}: no generated captions")
    groups = table.groupby("image_id", sort=True).text.agg(list)
    return str(runs[0]), {int(i): list(caps) for i, caps in groups.items()}


@dataclass
class DecodingInputs:
    """What both parts of one decoding's evaluation read: its captions and references."""

    run: str
    samples: dict[int, list[str]]  # image id -> captions in sample order
    gts: dict[int, list[str]]  # image id -> its references in the split
    train_refs: dict[int, list[str]]  # training image id -> its captions
    images: pd.DataFrame

    @property
    def ids(self) -> list[int]:
        return list(self.samples)

    @property
    def n_samples(self) -> int:
        return min(len(c) for c in self.samples.values())

    @property
    def first(self) -> list[str]:
        return [self.samples[i][0] for i in self.samples]

    @classmethod
    def read(cls, paths: EvalPaths, split: str, loads: JobLoads | None = None) -> DecodingInputs:
        """The decoding's captions and references; the tables and the training references
        from the job's `loads` (read once per job), else read here."""
        loads = loads or JobLoads()
        run, samples = read_generated(paths.generated)
        ids = list(samples)
        gts = captions_by_image(loads.split_captions(paths.captions, split), ids)
        if len(gts) != len(ids):
            missing = sorted(set(ids) - set(gts))[:5]
            raise DistinctcapError(
                f"{paths.generated}: image ids {missing} have no {split} captions"
            )
        train_refs = loads.train_refs(paths.images, paths.captions)
        return cls(run, samples, gts, train_refs, loads.table(paths.images))


def warn_if_capped(key: str, value: int, limit: int, what: str) -> None:
    """evaluate.`key` larger than the data: capped, with one warning (core.logs)."""
    logs.warn_if_capped(log, f"evaluate.{key}", value, limit, f"the {limit} {what}")


def stage_paths(inputs: dict, k: int) -> EvalPaths:
    """The EvalPaths of the k-th generated table of a rule's named inputs."""
    names = ("images", "captions", "vocab", "features", "model", "captioner_features",
             "judge_features")  # fmt: skip
    common = {n: str(inputs[n]) for n in names if n in inputs}
    return EvalPaths(generated=str(inputs["generated"][k]), **common)


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def timed(timings: dict[str, list[float]] | None, part: str) -> Iterator[None]:
    """Add [wall s, own CPU s, finished children's CPU s (the Java tools)] of the block."""
    start, cpu, child = time.perf_counter(), time.process_time(), _child_cpu()
    yield
    spent = [time.perf_counter() - start, time.process_time() - cpu, _child_cpu() - child]
    log.debug("%s: %.1f s wall, %.1f s CPU, %.1f s child CPU", part, *spent)
    if timings is not None:
        timings[part] = spent


def log_timings(split: str, decoding: str, timings: dict[str, list[float]]) -> None:
    for name, (wall, cpu, child) in timings.items():
        log.info(
            "%s-%s: time %-60s %6.1f s wall %6.1f s CPU %6.1f s child CPU",
            split, decoding, name, wall, cpu, child,
        )
