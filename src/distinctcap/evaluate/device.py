"""The torch part of the evaluate stage: what needs CLIP, the judge CLIP, the captioner or
GPT-2, for one (split, decoding) of a run (`device_metrics`) or a whole evaluate_gpu job
(`evaluate_device_stage`), on `settings.device`:

- CLIP self-retrieval R@k and mean rank of the first caption of every image among the split's
  images, optionally in a harder pool with each image's nearest training images (SMILE §3.1,
  after CapEnrich), CLIPScore and RefCLIPScore (Hessel et al. 2021 eqs. 1 and 2; the
  references are the image's captions in the split), by the trainer's CLIP and, scored by the
  same code, the judge CLIP (evaluate.judge);
- the captioner's own self-retrieval (CL §4.1): rank the images of a pool by log p(c | I);
- GPT-2 perplexity (SMILE §3.1) where local weights exist, and the scene-retrieval judge on
  the shapes world (evaluate.scene_judge);

with the per-image table `PER_IMAGE` of the first captions. The models and feature rows come
from the job's `JobLoads` (evaluate.loaded): read once per job, not once per decoding. The
evaluate_gpu job writes each part (`write_device_metrics`) for the CPU evaluate job
(evaluate.stage), which reads it back (`read_device_metrics`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from distinctcap.captioner.model import label_logprobs, make_batch
from distinctcap.clip.text import encode_text
from distinctcap.core import work
from distinctcap.core.devices import CPU
from distinctcap.core.io import read_table, write_table
from distinctcap.core.settings import EvalSettings
from distinctcap.evaluate import judge
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
    CLIPSCORE_PREFIX,
    clipscores,
    gpt2_perplexity,
    model_self_retrieval,
    rank_summary,
    refclipscores,
    retrieval_scores,
)
from distinctcap.evaluate.scene_judge import PER_IMAGE_SCENE, scene_retrieval_metrics
from distinctcap.scores.ranks import retrieval_ranks
from distinctcap.scores.result import MetricResult

# The per-image table of an evaluation: each image's first caption (sample 0), as the metrics
# row's single-caption columns; paired by image_id for the bootstrap against the reference
# (distinctcap.report.versus).
PER_IMAGE = ("image_id", "clip_rank", "clipscore", *judge.PER_IMAGE, *PER_IMAGE_SCENE)


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
    paths: EvalPaths,
    split: str,
    settings: EvalSettings,
    inputs: DecodingInputs | None = None,
    loads: JobLoads | None = None,
) -> DeviceMetrics:
    """CLIP retrieval and CLIPScore, model self-retrieval, GPT-2 perplexity and the
    scene-retrieval judge (shapes world) of sample 0 of every image, on `settings.device`.
    `loads`: the job's models and features (evaluate.loaded), else read here."""
    loads = loads or JobLoads()
    with work.counting() as counted:
        part = _device_metrics(paths, split, settings, inputs or DecodingInputs.read(
            paths, split, loads), loads)  # fmt: skip
    part.work = dict(counted)
    return part


def _device_metrics(
    paths: EvalPaths,
    split: str,
    settings: EvalSettings,
    inputs: DecodingInputs,
    loads: JobLoads,
) -> DeviceMetrics:
    timings: dict[str, list[float]] = {}
    ids, first = inputs.ids, inputs.first
    with timed(timings, "load CLIP features"):
        pooled = loads.pooled(paths.features, ids)
    with timed(timings, "hard pool (nearest training images)"):
        hard_extra = hard_pool_images(paths.features, inputs, settings, loads)
    out = MetricResult()
    with timed(timings, "CLIP retrieval and CLIPScore"):
        clip_out, per_caption = clip_metrics(
            loads.features_clip(paths.features, settings.device),
            first,
            [inputs.gts[i] for i in ids],
            pooled,
            hard_extra,
            settings,
        )
        out.merge(clip_out)
    with timed(timings, "judge CLIP retrieval and CLIPScore"):
        judge_out, judge_per_caption = judge.judge_metrics(
            paths.judge_features, ids, first, [inputs.gts[i] for i in ids], settings,
            clip_metrics, loads,
        )  # fmt: skip
        out.merge(judge_out)
    with timed(timings, "model self-retrieval"):
        out.merge(model_metrics(paths, ids, first, settings, inputs.n_samples, loads))
    with timed(timings, "GPT-2 perplexity"):
        out.merge(
            gpt2_perplexity(first, settings.gpt2_path, device=settings.device, load=loads.gpt2)
        )
    with timed(timings, "scene retrieval"):
        scene_out, scene_per_caption = scene_retrieval_metrics(
            first, ids, inputs.images, settings.retrieval_ks
        )
        out.merge(scene_out)
    columns = {"image_id": np.asarray(ids, dtype=np.int64), **per_caption,
               **judge_per_caption, **scene_per_caption}  # fmt: skip
    per_image = pd.DataFrame(columns)[list(PER_IMAGE)]
    return DeviceMetrics(out, per_image, timings)


def hard_pool_images(
    features: str, inputs: DecodingInputs, settings: EvalSettings, loads: JobLoads
) -> np.ndarray:
    """Pooled features of the hard pool's training images: the union of each split image's
    `hard_pool` nearest training images (0 rows when hard_pool is 0 or none has features)."""
    if settings.hard_pool <= 0:
        return np.zeros((0, 0), np.float32)
    near, train = loads.training_neighbours(features, inputs.ids, inputs.train_refs,
                                            settings.hard_pool)  # fmt: skip
    if train:
        warn_if_capped("hard_pool", settings.hard_pool, len(train), "training images")
    return loads.pooled(features, [train[r] for r in np.unique(near)])


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


def clip_metrics(
    clip,
    texts: Sequence[str],
    references: Sequence[Sequence[str]],
    pooled: np.ndarray,
    hard_extra: np.ndarray,
    settings: EvalSettings,
) -> tuple[MetricResult, dict[str, np.ndarray]]:
    """Self-retrieval of caption i's image (row i of `pooled`) among the split's images, the
    hard pool (plus the training images `hard_extra`, `hard_pool_images`), CLIPScore and
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
    if settings.hard_pool <= 0 or len(hard_extra) == 0:
        for name in hard:
            out.skip(name, "no hard retrieval pool (evaluate.hard_pool = 0)")
        return out, per_caption
    pool = np.concatenate([pooled, hard_extra])
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


def model_metrics(
    paths: EvalPaths,
    ids: list[int],
    texts: list[str],
    settings: EvalSettings,
    n_samples: int = 1,
    loads: JobLoads | None = None,
) -> MetricResult:
    """The captioner's self-retrieval of `texts`, or skipped: when no model is given, the pool
    is 0, or the decoding samples (`n_samples` > 1) and evaluate.self_retrieval_of_samples is
    off (CL §4.1 ranks the generated caption; a first sample is a noisy stand-in, and on the
    shapes default its scoring was a third of an evaluate job). `loads`: the job's captioner
    and image features (evaluate.loaded), else read here."""
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
    loads = loads or JobLoads()
    features = loads.image_features(paths.captioner_features or paths.features, ids)
    model, tokenizer = loads.captioner(paths.model, paths.vocab, settings.device)
    return self_retrieval_metrics(
        model, tokenizer, features.grid.float(), features.pooled, texts, settings
    )


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
    # one matrix filled in place: a small tensor kept per chunk landed in the heap's holes
    # between the chunks' temporaries, so each chunk's took new memory (issue 55)
    was_training, out = model.training, torch.empty((c, len(grid)), dtype=torch.float64)
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
                out[:, s : s + g] = logp.view(g, c).T
    finally:
        model.train(was_training)
    return out.numpy()


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
    loads = JobLoads()  # each model and feature file read once for all the decodings
    for k, (split, decoding) in enumerate(evaluations):
        part = device_metrics(stage_paths(inputs, k), split, settings, loads=loads)
        write_device_metrics(part, outputs["device"][k])
        write_table(part.per_image[list(PER_IMAGE)], outputs["per_image"][k], "per_image")
        log_timings(split, decoding, part.timings)
