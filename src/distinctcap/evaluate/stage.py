"""The evaluation stage: one metrics row per (run, split, decoding), its CIDEr-vs-n curve and
its per-image table (`PER_IMAGE`: CLIP rank and CLIPScore of each image's first caption and,
on the shapes world, its scene-retrieval rank, for the paired bootstrap against the reference
in distinctcap.report.versus).

`evaluate_decoding(paths, settings)` loads a run's generated captions, the references, the
CLIP features (and the CLIP itself, from the features manifest, to encode the captions), the
captioner (for its own self-retrieval) and, on the shapes world, the scene graphs, and
computes with `distinctcap.evaluate.metrics`:

- quality, diversity, novelty, oracle best-of-n and consensus re-ranking (UNKT §4.1-4.3,
  specificity paper §4) in one `evaluate_captions` call (metrics/text.py), so each Java tool
  starts once;
- CLIP self-retrieval R@k and mean rank of the first caption of every image among the split's
  images, optionally in a harder pool with each image's nearest training images (SMILE §3.1,
  after CapEnrich), CLIPScore and RefCLIPScore (Hessel et al. 2021 eqs. 1 and 2; the
  references are the image's captions in the split);
- the captioner's own self-retrieval (CL §4.1): rank the images of a pool by log p(c | I);
- GPT-2 perplexity (SMILE §3.1) where local weights exist; scene precision/recall/F1 on the
  shapes world (distinctcap.data.scene) and the scene-retrieval judge: R@k and mean rank of
  each image among the split's by how many of its caption's claims each true scene holds, ties
  at their expected rank (distinctcap.data.scene_retrieval).

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
import resource
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from distinctcap.captioner.load import caption_tokenizer, load_captioner
from distinctcap.captioner.model import label_logprobs, make_batch
from distinctcap.clip.text import encode_text
from distinctcap.core import logs, work
from distinctcap.core.config import EvalSettings
from distinctcap.core.devices import CPU
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, read_json, read_table, write_json, write_table
from distinctcap.data.scene import scene_f1
from distinctcap.evaluate import judge
from distinctcap.evaluate.metrics import (
    CLIPSCORE_PREFIX,
    DIVERSITY_METRICS,
    ORACLE_METRICS,
    QUALITY_METRICS,
    CocoTools,
    MetricResult,
    clipscores,
    evaluate_captions,
    gpt2_perplexity,
    model_self_retrieval,
    rank_summary,
    refclipscores,
    retrieval_ranks,
    retrieval_scores,
)
from distinctcap.evaluate.scene_judge import (
    NO_SCENES,
    PER_IMAGE_SCENE,
    scene_retrieval_metrics,
    split_scenes,
)
from distinctcap.features.read import ImageFeatures, feature_ids, load_image_features
from distinctcap.report.summary import HEADLINE_DIVERSITY, HEADLINE_QUALITY

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
    ]


# ---------------------------------------------------------------- inputs


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


def captions_by_image(captions: pd.DataFrame, image_ids: Sequence[int]) -> dict[int, list[str]]:
    """image id -> its reference texts, for the given ids (in that order)."""
    groups = captions[captions.image_id.isin(image_ids)].groupby("image_id").text.agg(list)
    return {int(i): list(groups[i]) for i in image_ids if i in groups.index}


def nearest(query: np.ndarray, pool: np.ndarray, k: int, chunk: int = 2048) -> np.ndarray:
    """Rows of the k most cosine-similar `pool` rows for each `query` row -> (Nq, k)."""
    k = min(k, len(pool))
    out = np.empty((len(query), k), dtype=np.int64)
    for s in range(0, len(query), chunk):
        sims = query[s : s + chunk] @ pool.T
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(-sims, top, axis=1).argsort(axis=1, kind="stable")
        out[s : s + chunk] = np.take_along_axis(top, order, axis=1)
    return out


# ---------------------------------------------------------------- timing


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


# ---------------------------------------------------------------- the parts


def encode_texts(clip, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """CLIP text embeddings (N, D), L2-normalised, float32."""
    device = next(clip.model.parameters()).device
    work.count("clip_encoded", len(texts))
    out = []
    with torch.inference_mode():
        for s in range(0, len(texts), batch_size):
            tokens = clip.tokenizer(list(texts[s : s + batch_size])).to(device)
            out.append(encode_text(clip.model, tokens, normalize=True).float().cpu())
    return torch.cat(out).numpy() if out else np.zeros((0, 0), np.float32)


def warn_if_capped(key: str, value: int, limit: int, what: str) -> None:
    """evaluate.`key` larger than the data: capped, with one warning (core.logs)."""
    logs.warn_if_capped(log, f"evaluate.{key}", value, limit, f"the {limit} {what}")


def clip_metrics(
    clip,
    texts: Sequence[str],
    references: Sequence[Sequence[str]],
    pooled: np.ndarray,
    train_pooled: np.ndarray,
    settings: EvalSettings,
) -> tuple[MetricResult, dict[str, np.ndarray]]:
    """Self-retrieval of caption i's image (row i of `pooled`) among the split's images, the
    hard pool (plus each image's `hard_pool` nearest training images), CLIPScore and
    RefCLIPScore (`references[i]`: image i's references); and caption i's own values
    (`PER_IMAGE`): clip_rank, its 1-based rank among the split's images, and clipscore.
    r_at_k is the share of clip_rank <= k, mean_rank and clipscore the means of the
    per-caption values."""
    ks = settings.retrieval_ks
    emb = encode_texts(clip, texts, settings.batch_size)
    target = np.arange(len(texts))
    ranks = retrieval_ranks(emb, pooled, target)
    out = rank_summary(ranks, ks)
    prefixed = encode_texts(clip, [CLIPSCORE_PREFIX + t for t in texts], settings.batch_size)
    scores = clipscores(prefixed, pooled)
    out.values["clipscore"] = float(np.mean(scores))
    refscores = reference_clipscores(clip, prefixed, pooled, references, settings.batch_size)
    out.values["refclipscore"] = float(np.mean(refscores))
    per_caption = {"clip_rank": ranks, "clipscore": scores}
    hard = [f"hard_r_at_{k}" for k in ks] + ["hard_mean_rank"]
    if settings.hard_pool <= 0 or len(train_pooled) == 0:
        for name in hard:
            out.skip(name, "no hard retrieval pool (evaluate.hard_pool = 0)")
        return out, per_caption
    warn_if_capped("hard_pool", settings.hard_pool, len(train_pooled), "training images")
    extra = np.unique(nearest(pooled, train_pooled, settings.hard_pool))
    pool = np.concatenate([pooled, train_pooled[extra]])
    out.merge(retrieval_scores(emb, pool, target, ks), prefix="hard_")
    return out, per_caption


def reference_clipscores(
    clip,
    prefixed: np.ndarray,
    pooled: np.ndarray,
    references: Sequence[Sequence[str]],
    batch_size: int = 256,
) -> np.ndarray:
    """RefCLIPScore (`refclipscores`) of caption i, whose CLIPSCORE_PREFIX embedding is row i
    of `prefixed`, with image i (row i of `pooled`) and its `references[i]`, encoded by the
    same CLIP with the same prefix (as Hessel et al.'s clipscore.py encodes references)."""
    owner = np.repeat(np.arange(len(references)), [len(group) for group in references])
    texts = [CLIPSCORE_PREFIX + r for group in references for r in group]
    return refclipscores(prefixed, pooled, encode_texts(clip, texts, batch_size), owner)


def retrieval_blocks(n: int, pool: int, seed: int = 0) -> list[np.ndarray]:
    """The split's n images shuffled (seeded) and cut into ceil(n / pool) blocks of nearly
    equal size (at most `pool`): each caption is ranked among the images of its block."""
    order = np.random.default_rng(seed).permutation(n)
    return np.array_split(order, math.ceil(n / max(1, min(pool, n))))


def block_logprobs(
    model,
    grid: torch.Tensor,
    pooled: torch.Tensor,
    tokens: Sequence[Sequence[int]],
    rows: int = 512,
    max_logits: int = 20_000_000,
) -> np.ndarray:
    """log p(c_i | I_j) (a sum over tokens incl. eos) of every caption i with every image j
    -> (captions, images), in eval mode without gradients. Each image is encoded once and its
    cross-attention keys/values are shared by all captions (Captioner.decode with a group of
    rows per image). Images go in chunks of about `rows` decoder rows (small chunks stay in
    the CPU caches: 500 rows ran 30% faster than 10,000 here) and at most `max_logits`."""
    device = next(model.parameters()).device
    inputs, labels = make_batch(tokens, model.cfg.max_len)  # (C, N)
    c = len(tokens)
    per_image = c * inputs.shape[1] * model.cfg.vocab_size
    chunk = max(1, min(rows // max(1, c), max_logits // per_image))
    was_training, out = model.training, []
    model.eval()
    try:
        with torch.no_grad():
            for s in range(0, len(grid), chunk):
                memory = model.encode(
                    grid[s : s + chunk].to(device), pooled[s : s + chunk].to(device)
                )
                g = len(memory)  # rows image-major: image k's c captions are rows k*c .. k*c+c-1
                x, y = inputs.to(device).repeat(g, 1), labels.to(device).repeat(g, 1)
                logp = label_logprobs(model.decode(memory, x), y)  # (g * c,)
                out.append(logp.view(g, c).T.double().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out, dim=1).numpy()


def self_retrieval_metrics(
    model,
    tokenizer,
    grid: torch.Tensor,
    pooled: torch.Tensor,
    texts: Sequence[str],
    settings: EvalSettings,
) -> MetricResult:
    """CL §4.1 with the run's own captioner: caption i (of image i) ranks the images of its
    block (`retrieval_blocks`: pools of at most `self_retrieval_pool` images of the split,
    all of them when the split is smaller) by log p(c_i | I)."""
    warn_if_capped(
        "self_retrieval_pool", settings.self_retrieval_pool, len(texts), "images of the split"
    )
    tokens = [tokenizer.encode(t) for t in texts]
    blocks = []  # log p matrices; caption k of a block belongs to the block's image k
    for block in retrieval_blocks(len(texts), settings.self_retrieval_pool, settings.seed):
        idx = torch.as_tensor(block)
        blocks.append(block_logprobs(model, grid[idx], pooled[idx], [tokens[i] for i in block]))
    width = max(m.shape[1] for m in blocks)  # smaller blocks: pad with -inf columns
    matrix = np.concatenate(
        [np.pad(m, ((0, 0), (0, width - m.shape[1])), constant_values=-np.inf) for m in blocks]
    )
    target = np.concatenate([np.arange(len(m)) for m in blocks])
    return model_self_retrieval(matrix, target, settings.self_retrieval_ks)


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


def skip_unavailable(out: MetricResult, names: Sequence[str], reason: str) -> None:
    for name in names:
        if name not in out.values:
            out.skip(name, reason)


# ---------------------------------------------------------------- the stage


# The per-image table of an evaluation: each image's first caption (sample 0), as the metrics
# row's single-caption columns; paired by image_id for the bootstrap against the reference
# (distinctcap.report.versus).
PER_IMAGE = ("image_id", "clip_rank", "clipscore", *judge.PER_IMAGE, *PER_IMAGE_SCENE)


@dataclass
class Evaluation:
    row: dict  # run, split, decoding, n_images, n_samples, every metric column
    skipped: dict[str, str]
    curve: pd.DataFrame  # run, split, decoding, n, cider (oracle CIDEr over the first n)
    timings: dict[str, list[float]] = field(default_factory=dict)
    per_image: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=PER_IMAGE))
    # captions (or pairs) each metric's source scored (distinctcap.core.work), for work.json
    work: dict[str, int] = field(default_factory=dict)


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
    def read(cls, paths: EvalPaths, split: str) -> DecodingInputs:
        run, samples = read_generated(paths.generated)
        images = read_table(paths.images)
        captions = read_table(paths.captions)
        ids = list(samples)
        gts = captions_by_image(captions[captions.split == split], ids)
        if len(gts) != len(ids):
            missing = sorted(set(ids) - set(gts))[:5]
            raise DistinctcapError(
                f"{paths.generated}: image ids {missing} have no {split} captions"
            )
        train_ids = images[images.split == "train"].image_id.astype(int).tolist()
        train_refs = captions_by_image(captions[captions.split == "train"], train_ids)
        return cls(run, samples, gts, train_refs, images)


@dataclass
class DeviceMetrics:
    """The torch part of one decoding's evaluation (CLIP retrieval and CLIPScore, the
    captioner's self-retrieval, GPT-2 perplexity): the GPU work, which the evaluate_gpu rule
    computes in its own job so the CPU evaluate job holds no GPU."""

    result: MetricResult
    per_image: pd.DataFrame  # PER_IMAGE
    timings: dict[str, list[float]] = field(default_factory=dict)
    work: dict[str, int] = field(default_factory=dict)  # distinctcap.core.work's counts


def device_metrics(
    paths: EvalPaths, split: str, settings: EvalSettings, inputs: DecodingInputs | None = None
) -> DeviceMetrics:
    """CLIP retrieval and CLIPScore, model self-retrieval, GPT-2 perplexity and the
    scene-retrieval judge (shapes world) of sample 0 of every image, on `settings.device`."""
    with work.counting() as counted:
        part = _device_metrics(paths, split, settings, inputs)
    part.work = dict(counted)
    return part


def _device_metrics(
    paths: EvalPaths, split: str, settings: EvalSettings, inputs: DecodingInputs | None
) -> DeviceMetrics:
    inputs = inputs or DecodingInputs.read(paths, split)
    timings: dict[str, list[float]] = {}
    ids, first = inputs.ids, inputs.first
    with timed(timings, "load CLIP features"):
        pooled, train_pooled, _ = load_pooled(paths.features, ids, inputs.train_refs)
    out = MetricResult()
    with timed(timings, "CLIP retrieval and CLIPScore"):
        clip_out, per_caption = clip_metrics(
            load_features_clip(paths.features, settings.device),
            first,
            [inputs.gts[i] for i in ids],
            pooled,
            train_pooled,
            settings,
        )
        out.merge(clip_out)
    with timed(timings, "judge CLIP retrieval and CLIPScore"):
        judge_out, judge_per_caption = judge.judge_metrics(
            paths.judge_features, ids, first, [inputs.gts[i] for i in ids], settings, clip_metrics
        )
        out.merge(judge_out)
    with timed(timings, "model self-retrieval"):
        out.merge(model_metrics(paths, ids, first, settings, inputs.n_samples))
    with timed(timings, "GPT-2 perplexity"):
        out.merge(gpt2_perplexity(first, settings.gpt2_path, device=settings.device))
    with timed(timings, "scene retrieval"):
        scene_out, scene_per_caption = scene_retrieval_metrics(
            first, ids, inputs.images, settings.retrieval_ks
        )
        out.merge(scene_out)
    columns = {"image_id": np.asarray(ids, dtype=np.int64), **per_caption,
               **judge_per_caption, **scene_per_caption}  # fmt: skip
    per_image = pd.DataFrame(columns)[list(PER_IMAGE)]
    return DeviceMetrics(out, per_image, timings)


def evaluate_decoding(
    paths: EvalPaths,
    split: str,
    decoding: str,
    settings: EvalSettings | None = None,
    tools: CocoTools | None = None,
    device: DeviceMetrics | None = None,
) -> Evaluation:
    """Every metric of one decoding of one run (see the module docstring). `tools`: a
    running COCO tools session to share (else one is started and stopped here). `device`:
    the torch part computed by another job (`device_metrics`), else computed here."""
    settings = settings or EvalSettings()
    inputs = DecodingInputs.read(paths, split)
    device = device or device_metrics(paths, split, settings, inputs)
    with work.counting() as counted:
        evaluation = _cpu_metrics(paths, split, decoding, settings, tools, device, inputs)
    done = Counter(device.work) + counted
    evaluation.work = {k: int(done[k]) for k in sorted(done)}
    return evaluation


def _cpu_metrics(
    paths: EvalPaths,
    split: str,
    decoding: str,
    settings: EvalSettings,
    tools: CocoTools | None,
    device: DeviceMetrics,
    inputs: DecodingInputs,
) -> Evaluation:
    ids, n_samples = inputs.ids, inputs.n_samples
    timings: dict[str, list[float]] = {}
    with timed(timings, "load CLIP features (consensus neighbours)"):
        pooled, train_pooled, train_with_feat = load_pooled(
            paths.features, ids, inputs.train_refs
        )

    out = MetricResult()
    with timed(timings, "text metrics (PTB, METEOR, BLEU, ROUGE-L, CIDEr-D, diversity)"):
        out.merge(
            text_metrics(
                inputs.gts,
                inputs.samples,
                n_samples,
                inputs.train_refs,
                train_with_feat,
                pooled,
                train_pooled,
                settings,
                tools,
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


def load_pooled(
    features: str | Path, ids: Sequence[int], train_ids: Iterable[int]
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(pooled of `ids`, pooled of the training images that have features, those ids): only
    these rows of the pooled column are read, never the grid."""
    have = set(feature_ids(features).tolist())
    train_with_feat = [i for i in train_ids if i in have]
    _, both, _ = load_image_features(features, grid=False, image_ids=list(ids) + train_with_feat)
    return both[: len(ids)], both[len(ids) :], train_with_feat


def text_metrics(
    gts: dict[int, list[str]],
    samples: dict[int, list[str]],
    n_samples: int,
    train_refs: dict[int, list[str]],
    train_with_feat: list[int],
    pooled: np.ndarray,
    train_pooled: np.ndarray,
    settings: EvalSettings,
    tools: CocoTools | None = None,
) -> MetricResult:
    """Quality, diversity, novelty, oracle (incl. the CIDEr-vs-n points) and consensus."""
    wanted = sorted(set(settings.oracle_ns) | set(settings.curve_ns))
    ns = [n for n in wanted if n <= n_samples] if n_samples > 1 else []
    neighbours = None
    if n_samples > 1 and train_with_feat:
        warn_if_capped("consensus_neighbours", settings.consensus_neighbours,
                       len(train_pooled), "training images")  # fmt: skip
        near = nearest(pooled, train_pooled, settings.consensus_neighbours)
        neighbours = {
            i: [c for r in near[k] for c in train_refs[train_with_feat[r]]]
            for k, i in enumerate(samples)
        }
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


def load_features_clip(index_path: str | Path, device: str = "cpu"):
    """The CLIP that computed the features (arch and weights from the index's manifest)."""
    # open_clip takes seconds to import; a process that only reads metrics does not need it
    from distinctcap.clip.load import load_clip

    manifest = read_json(index_path)["manifest"]
    return load_clip(manifest["arch"], manifest["pretrained"], device, manifest.get("tag"))


def model_metrics(
    paths: EvalPaths,
    ids: list[int],
    texts: list[str],
    settings: EvalSettings,
    n_samples: int = 1,
) -> MetricResult:
    """The captioner's self-retrieval of `texts`, or skipped: when no model is given, the pool
    is 0, or the decoding samples (`n_samples` > 1) and evaluate.self_retrieval_of_samples is
    off (CL §4.1 ranks the generated caption; a first sample is a noisy stand-in, and on the
    shapes default its scoring was a third of an evaluate job)."""
    names = [f"self_r_at_{k}" for k in settings.self_retrieval_ks] + ["self_mean_rank"]
    why = None
    if paths.model is None or settings.self_retrieval_pool < 2 or len(ids) < 2:
        why = "model self-retrieval off (no captioner given or evaluate.self_retrieval_pool < 2)"
    elif n_samples > 1 and not settings.self_retrieval_of_samples:
        why = "a sampling decoding (evaluate.self_retrieval_of_samples: false)"
    if why:
        out = MetricResult()
        for name in names:
            out.skip(name, why)
        return out
    # these images' rows only; a pre-trained captioner reads its own vision states
    features = ImageFeatures.load(paths.captioner_features or paths.features, ids)
    model = load_captioner(paths.model, map_location=settings.device)
    tokenizer = caption_tokenizer(model, paths.vocab)
    return self_retrieval_metrics(
        model, tokenizer, features.grid.float(), features.pooled, texts, settings
    )


# ---------------------------------------------------------------- outputs


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
    for header, column, digits, arrow in (*HEADLINE_QUALITY, *HEADLINE_DIVERSITY):
        value = row.get(column)
        if column in evaluation.skipped or value is None or pd.isna(value):
            parts.append(f"{header} skipped")
        else:
            parts.append(f"{header} {arrow} {value:.{digits}f}")
    return f"{row['run']} {row['split']}/{row['decoding']}: " + ", ".join(parts)


def log_timings(split: str, decoding: str, timings: dict[str, list[float]]) -> None:
    for name, (wall, cpu, child) in timings.items():
        log.info(
            "%s-%s: time %-60s %6.1f s wall %6.1f s CPU %6.1f s child CPU",
            split, decoding, name, wall, cpu, child,
        )


def write_device_metrics(part: DeviceMetrics, path: str | Path) -> None:
    """One-row parquet of the torch part's metric values and `skipped` (JSON)."""
    row = {
        **part.result.values,
        "skipped": json.dumps(part.result.skipped, sort_keys=True),
        "work": json.dumps(part.work, sort_keys=True),
    }
    write_table(pd.DataFrame([row]), path)


def read_device_metrics(path: str | Path, per_image: str | Path) -> DeviceMetrics:
    """`write_device_metrics`' table and its per-image table back as DeviceMetrics."""
    row = read_table(path).iloc[0].to_dict()
    skipped, done = json.loads(row.pop("skipped")), json.loads(row.pop("work", "{}"))
    values = {k: float(v) for k, v in row.items()}
    per_image_table = read_table(per_image, "per_image")
    return DeviceMetrics(MetricResult(values, skipped), per_image_table, work=done)


def stage_paths(inputs: dict, k: int) -> EvalPaths:
    """The EvalPaths of the k-th generated table of a rule's named inputs."""
    names = ("images", "captions", "vocab", "features", "model", "captioner_features",
             "judge_features")  # fmt: skip
    common = {n: str(inputs[n]) for n in names if n in inputs}
    return EvalPaths(generated=str(inputs["generated"][k]), **common)


def evaluate_device_stage(
    inputs: dict,
    outputs: dict,
    evaluations: Sequence[tuple[str, str]],
    block: dict,
    seed: int = 0,
    device: torch.device = CPU,
) -> None:
    """The evaluate_gpu rule, one job per run: the torch part (`device_metrics`) of each
    (split, decoding) of `evaluations` -> outputs["device"] (`write_device_metrics`) and
    outputs["per_image"] (`write_per_image`) at its position, for the CPU evaluate job."""
    settings = EvalSettings.from_config(block, seed=seed, device=str(device))
    for k, (split, decoding) in enumerate(evaluations):
        part = device_metrics(stage_paths(inputs, k), split, settings)
        write_device_metrics(part, outputs["device"][k])
        write_table(part.per_image[list(PER_IMAGE)], outputs["per_image"][k], "per_image")
        log_timings(split, decoding, part.timings)


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
    done = []
    options = {"workers": workers, "cache_dir": cache_dir}
    with CocoTools(spice=settings.spice, meteor_memory=settings.meteor_memory, **options) as tools:
        for k, (split, decoding) in enumerate(evaluations):
            part = None
            if "device" in inputs:
                part = read_device_metrics(inputs["device"][k], inputs["per_image"][k])
            paths = stage_paths(inputs, k)
            evaluation = evaluate_decoding(paths, split, decoding, settings, tools, part)
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
