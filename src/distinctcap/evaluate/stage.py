"""The evaluation stage: one metrics row per (run, split, decoding), its CIDEr-vs-n curve and
its per-image table (`PER_IMAGE`: CLIP rank and CLIPScore of each image's first caption and,
on the shapes world, its scene-retrieval rank, for the paired bootstrap against the reference
in distinctcap.report.versus).

`evaluate_decoding(paths, split, decoding, settings)` reads a run's generated captions and
the references (evaluate.inputs), takes the torch part (evaluate.device: CLIP retrieval,
CLIPScore and RefCLIPScore, the judge CLIP's, the captioner's self-retrieval, GPT-2
perplexity, the scene-retrieval judge) from the evaluate_gpu job or computes it, and computes
with `distinctcap.evaluate.metrics`:

- quality, diversity, novelty, oracle best-of-n and consensus re-ranking (UNKT §4.1-4.3,
  specificity paper §4) in one `evaluate_captions` call (metrics/text.py), so each Java tool
  starts once; the consensus neighbours are the nearest training images by pooled CLIP
  features;
- scene precision/recall/F1 on the shapes world (distinctcap.data.scene).

`evaluate_stage` is the evaluate rule: every (split, decoding) of a run in one job, sharing
one COCO tools session and one `JobLoads` (evaluate.loaded), so each table, model and
feature file is read once per job.

Single-caption metrics (quality, length, vocab, novelty, retrieval, CLIPScore,
RefCLIPScore, PPL, scene) use
sample 0 of each image: the greedy or best-beam caption, or the first sample of a sampling
run. Metrics that cannot be computed (SPICE without its jars, diversity of one caption per
image, oracle over more samples than decoded, ...) are NaN with the reason in `skipped`.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from distinctcap.core import work
from distinctcap.core.devices import CPU
from distinctcap.core.io import atomic_path, write_json, write_table
from distinctcap.core.settings import EvalSettings
from distinctcap.data.scene import scene_f1
from distinctcap.evaluate import judge
from distinctcap.evaluate.device import (
    PER_IMAGE,
    DeviceMetrics,
    device_metrics,
    read_device_metrics,
)
from distinctcap.evaluate.distinctive import SimilarSets, distinctive_columns, similar_sets
from distinctcap.evaluate.headline import HEADLINE_DIVERSITY, HEADLINE_FIELD, HEADLINE_QUALITY
from distinctcap.evaluate.inputs import (
    DecodingInputs,
    EvalPaths,
    log_timings,
    stage_paths,
    timed,
    warn_if_capped,
)
from distinctcap.evaluate.loaded import JobLoads
from distinctcap.evaluate.metrics import (
    DIVERSITY_METRICS,
    ORACLE_METRICS,
    QUALITY_METRICS,
    CocoTools,
    evaluate_captions,
)
from distinctcap.evaluate.scene_judge import NO_SCENES, split_scenes
from distinctcap.scores.result import MetricResult

log = logging.getLogger(__name__)

TEXT_METRICS = (
    *QUALITY_METRICS,
    "length",
    "vocab",
    "distinct_corpus",
    "novelty",
    *DIVERSITY_METRICS,
)


def metric_columns(settings: EvalSettings) -> list[str]:
    """Every metric column of a metrics row, in order; the same for every decoding."""
    ks = settings.retrieval_ks
    oracle = [f"oracle_{m}_{n}" for n in sorted(set(settings.oracle_ns)) for m in ORACLE_METRICS]
    consensus = [f"consensus_{m}" for m in (*QUALITY_METRICS, *DIVERSITY_METRICS)]
    return [
        *TEXT_METRICS,
        *[f"r_at_{k}" for k in ks],
        "mean_rank",
        "clipscore",
        "refclipscore",
        *judge.judge_columns(ks),
        *[f"hard_r_at_{k}" for k in ks],
        "hard_mean_rank",
        *[f"self_r_at_{k}" for k in settings.self_retrieval_ks],
        "self_mean_rank",
        *oracle,
        *consensus,
        "ppl",
        "scene_precision",
        "scene_recall",
        "scene_f1",
        *[f"scene_r_at_{k}" for k in ks],
        "scene_mean_rank",
        *distinctive_columns(),
    ]


@dataclass
class Evaluation:
    row: dict  # run, split, decoding, n_images, n_samples, every metric column
    skipped: dict[str, str]
    curve: pd.DataFrame  # run, split, decoding, n, cider (oracle CIDEr over the first n)
    timings: dict[str, list[float]] = field(default_factory=dict)
    per_image: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=PER_IMAGE))
    # captions (or pairs) each metric's source scored (distinctcap.core.work), for work.json
    work: dict[str, int] = field(default_factory=dict)


def evaluate_decoding(
    paths: EvalPaths,
    split: str,
    decoding: str,
    settings: EvalSettings | None = None,
    tools: CocoTools | None = None,
    device: DeviceMetrics | None = None,
    loads: JobLoads | None = None,
) -> Evaluation:
    """Every metric of one decoding of one run (see the module docstring). `tools`: a
    running COCO tools session to share (else one is started and stopped here). `device`:
    the torch part computed by another job (`device_metrics`), else computed here. `loads`:
    the job's tables, models and features (evaluate.loaded), else read here."""
    settings = settings or EvalSettings()
    loads = loads or JobLoads()
    inputs = DecodingInputs.read(paths, split, loads)
    device = device or device_metrics(paths, split, settings, inputs, loads)
    with work.counting() as counted:
        evaluation = _cpu_metrics(split, decoding, settings, tools, device, inputs, loads,
                                  paths.features, paths.judge_features)  # fmt: skip
    done = Counter(device.work) + counted
    evaluation.work = {k: int(done[k]) for k in sorted(done)}
    return evaluation


def _cpu_metrics(
    split: str,
    decoding: str,
    settings: EvalSettings,
    tools: CocoTools | None,
    device: DeviceMetrics,
    inputs: DecodingInputs,
    loads: JobLoads,
    features: str,
    judge_features: str | None = None,
) -> Evaluation:
    ids, n_samples = inputs.ids, inputs.n_samples
    timings: dict[str, list[float]] = {}
    with timed(timings, "consensus neighbours (nearest training images)"):
        neighbours = consensus_captions(features, inputs, settings, loads)
    with timed(timings, "similar images (CIDErBtw, DisWordRate)"):
        similar = similar_sets(judge_features, ids, inputs.images, loads)

    out = MetricResult()
    with timed(timings, "text metrics (PTB, METEOR, BLEU, ROUGE-L, CIDEr-D, diversity)"):
        out.merge(
            text_metrics(
                inputs.gts,
                inputs.samples,
                n_samples,
                inputs.train_refs,
                neighbours,
                settings,
                tools,
                similar,
            )
        )
    out.merge(device.result)
    with timed(timings, "scene F1"):
        out.merge(scene_metrics(inputs.first, ids, inputs.images))

    columns = metric_columns(settings)
    row = {
        "run": inputs.run,
        "split": split,
        "decoding": decoding,
        "n_images": len(ids),
        "n_samples": n_samples,
        **{c: float(out.values.get(c, math.nan)) for c in columns},
    }
    skipped = {c: out.skipped[c] for c in columns if c in out.skipped}
    curve_ns = [n for n in sorted(set(settings.curve_ns)) if n <= n_samples]
    curve = (
        pd.DataFrame(
            {
                "run": inputs.run,
                "split": split,
                "decoding": decoding,
                "n": curve_ns,
                "cider": [out.values.get(f"oracle_cider_{n}", math.nan) for n in curve_ns],
            }
        )
        if n_samples > 1
        else pd.DataFrame(columns=["run", "split", "decoding", "n", "cider"])
    )
    timings = {**device.timings, **timings}
    return Evaluation(row, skipped, curve, timings, device.per_image)


def consensus_captions(
    features: str, inputs: DecodingInputs, settings: EvalSettings, loads: JobLoads
) -> dict[int, list[str]] | None:
    """Each image's consensus references: the captions of its `consensus_neighbours` nearest
    training images by pooled CLIP features; None for a one-sample decoding (nothing to
    re-rank) or when no training image has features."""
    if inputs.n_samples < 2:
        return None
    k = settings.consensus_neighbours
    near, train = loads.training_neighbours(features, inputs.ids, inputs.train_refs, k)
    if not train:
        return None
    warn_if_capped("consensus_neighbours", k, len(train), "training images")
    return neighbour_captions(inputs.ids, near, train, inputs.train_refs)


def neighbour_captions(
    ids: Sequence[int],
    near: np.ndarray,
    train: Sequence[int],
    train_refs: dict[int, list[str]],
) -> dict[int, list[str]]:
    """Image ids[n] -> the captions of its nearest training images, train[r] for each row r
    of near[n] (evaluate.nearest)."""
    return {i: [c for r in near[n] for c in train_refs[train[r]]] for n, i in enumerate(ids)}


def text_metrics(
    gts: dict[int, list[str]],
    samples: dict[int, list[str]],
    n_samples: int,
    train_refs: dict[int, list[str]],
    neighbours: dict[int, list[str]] | None,
    settings: EvalSettings,
    tools: CocoTools | None = None,
    similar: SimilarSets | None = None,
) -> MetricResult:
    """Quality, diversity, novelty, oracle (incl. the CIDEr-vs-n points), consensus (with
    `neighbours`, `consensus_captions`) and, with `similar`, the field's distinctiveness
    columns (evaluate.distinctive)."""
    wanted = sorted(set(settings.oracle_ns) | set(settings.curve_ns))
    ns = [n for n in wanted if n <= n_samples] if n_samples > 1 else []
    neighbours = neighbours if n_samples > 1 else None
    own = tools is None
    tools = tools or CocoTools(spice=settings.spice, meteor_memory=settings.meteor_memory)
    try:
        out = evaluate_captions(
            gts,
            samples,
            train_refs=train_refs or None,
            oracle_ns=ns,
            neighbour_captions=neighbours,
            best_of=settings.best_of,
            similar=similar,
            tools=tools,
        )
    finally:
        if own:
            tools.close()
    oracle = [f"oracle_{m}_{n}" for n in settings.oracle_ns for m in ORACLE_METRICS]
    skip_unavailable(
        out,
        oracle,
        f"this decoding has {n_samples} caption(s) per image; an "
        "oracle over n needs at least n samples",
    )
    consensus = [f"consensus_{m}" for m in (*QUALITY_METRICS, *DIVERSITY_METRICS)]
    why = (
        "consensus re-ranking chooses among several samples per image; this decoding has one"
        if n_samples < 2
        else "no training image has CLIP features to find neighbours"
    )
    skip_unavailable(out, consensus, why)
    return out


def skip_unavailable(out: MetricResult, names: Sequence[str], reason: str) -> None:
    for name in names:
        if name not in out.values:
            out.skip(name, reason)


def scene_metrics(
    texts: Sequence[str], image_ids: Sequence[int], images: pd.DataFrame
) -> MetricResult:
    """Scene precision/recall/F1 against the true scene graphs (shapes world only)."""
    out = MetricResult()
    names = ("scene_precision", "scene_recall", "scene_f1")
    scenes = split_scenes(images, image_ids)
    if scenes is None:
        for name in names:
            out.skip(name, NO_SCENES)
        return out
    for name, value in scene_f1(list(texts), scenes).items():
        if math.isnan(value):
            out.skip(name, "undefined: the captions make no claim about their scenes")
        else:
            out.values[name] = value
    return out


def write_metrics(evaluation: Evaluation, path: str | Path) -> None:
    """One-row parquet: the keys, n_images, n_samples, every metric, `skipped` (JSON)."""
    row = {**evaluation.row, "skipped": json.dumps(evaluation.skipped, sort_keys=True)}
    write_table(pd.DataFrame([row]), path)


def write_per_image(evaluation: Evaluation, path: str | Path) -> None:
    """Parquet `PER_IMAGE` of the first captions: clip_rank (int64; r_at_1 is the share of
    rank 1, mean_rank the mean), clipscore (float32; the metrics row's is its mean), the
    judge CLIP's judge_rank and judge_clipscore (null without a judge; evaluate.judge), and
    scene_rank and scene_top1 (float64: the expected scene-retrieval rank and P(rank 1) under
    a random order of tied images, whose means are scene_mean_rank and scene_r_at_1; NaN off
    the shapes world)."""
    write_table(evaluation.per_image[list(PER_IMAGE)], path, "per_image")


def write_curve(evaluation: Evaluation, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        evaluation.curve.to_csv(tmp, index=False)


def headline_line(evaluation: Evaluation) -> str:
    """The headline numbers of an evaluation in one log line (README's columns; skipped ones
    say so)."""
    row = evaluation.row
    parts = []
    for header, column, digits, arrow in (*HEADLINE_QUALITY, *HEADLINE_FIELD, *HEADLINE_DIVERSITY):
        value = row.get(column)
        if column in evaluation.skipped or value is None or pd.isna(value):
            parts.append(f"{header} skipped")
        else:
            parts.append(f"{header} {arrow} {value:.{digits}f}")
    return f"{row['run']} {row['split']}/{row['decoding']}: " + ", ".join(parts)


def evaluate_stage(
    inputs: dict,
    outputs: dict,
    evaluations: Sequence[tuple[str, str]],
    block: dict,
    seed: int = 0,
    device: torch.device = CPU,
    workers: int = 1,
    cache_dir: str | None = None,
) -> list[Evaluation]:
    """The evaluate rule, one job per run: for each (split, decoding) of `evaluations`, the
    generated captions at the same position of inputs["generated"] -> outputs["metrics"]
    (parquet) and outputs["curve"] (csv) at that position. Other named inputs: images,
    captions, vocab, features, model, and either the evaluate_gpu job's inputs["device"]
    and inputs["per_image"] (then no torch model is loaded here) or else
    outputs["per_image"], written here after computing the torch part. The decodings share
    one COCO tools session with the job's `workers` cores, so METEOR's JVM loads its
    paraphrase table (about 9 CPU s) once per run, not once per decoding, the references
    are tokenised once (and kept in `cache_dir`, in the results folder, for later jobs) and
    the training captions' document frequencies are counted once."""
    settings = EvalSettings.from_config(block, seed=seed, device=str(device))
    loads = JobLoads()  # each table, model and feature file read once for all the decodings
    done = []
    options = {"workers": workers, "cache_dir": cache_dir}
    with CocoTools(spice=settings.spice, meteor_memory=settings.meteor_memory, **options) as tools:
        for k, (split, decoding) in enumerate(evaluations):
            part = None
            if "device" in inputs:
                part = read_device_metrics(inputs["device"][k], inputs["per_image"][k])
            paths = stage_paths(inputs, k)
            evaluation = evaluate_decoding(paths, split, decoding, settings, tools, part, loads)
            write_metrics(evaluation, outputs["metrics"][k])
            write_curve(evaluation, outputs["curve"][k])
            if "per_image" in outputs:
                write_per_image(evaluation, outputs["per_image"][k])
            log.info("%s", headline_line(evaluation))
            log_timings(split, decoding, evaluation.timings)
            done.append(evaluation)
    if "work" in outputs:
        write_work(done, outputs["work"])
    return done


def write_work(evaluations: Sequence[Evaluation], path: str | Path) -> None:
    """The job's work record (the work budget's, distinctcap.runs.budget): for each
    "<split>-<decoding>", the captions or pairs each metric's source scored. A side file, not
    a column of the metrics rows: those rows feed the summary, the seed pooling and the
    tables, which would each have to skip a column of dicts."""
    write_json({f"{e.row['split']}-{e.row['decoding']}": e.work for e in evaluations}, path)
