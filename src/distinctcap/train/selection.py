"""Caption-quality selection metrics on the validation images (CIDEr-D), for the trainer's
`train.select_metric` (distinctcap.train.selection.VAL_METRICS):

- `cider`: CIDEr-D of the greedy caption of each image against its validation references.
  CL trains the target "until [it] saturates its performance on the validation set" (CL §5.3,
  reference replacement), measured by the captioning metrics of its tables; we take CIDEr.
- `oracle_cider`: the best CIDEr-D among `SAMPLES` sampled captions per image (UNKT §4.2,
  Table 1's oracle over n samples, here n = 5 to stay cheap): high only when the samples are
  both good and different, so it selects on quality and diversity at once. UNKT does not say
  how it selects; this is our choice.
- `sample_cider`: the mean CIDEr-D of those samples (the quality of the distribution's tail).

Captions are compared as token ids (the captioner's BPE vocabulary, data/tokenizer.py: n-grams
of BPE pieces, which differ from word n-grams where a word has several pieces), with the
document frequencies of the scored images' references, as pycocoevalcap.
The first `IMAGES` validation images by feature row are scored; sampling is seeded, so a
resumed run scores the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from distinctcap.captioner.model import Captioner
from distinctcap.captioner.search import greedy, sample, sequence_logprob
from distinctcap.core import work
from distinctcap.data.tokenizer import EOS, PAD
from distinctcap.features.batches import Batch, CaptionData, encode_batch
from distinctcap.scores.cider import CiderD
from distinctcap.train.select_metrics import SELECT_METRICS

IMAGES = 100  # validation images scored
SAMPLES = 5  # samples per image for oracle_cider / sample_cider


def _words(tokens) -> str:
    return " ".join(str(int(t)) for t in tokens if int(t) not in (PAD, EOS))


def references(val, rows: torch.Tensor) -> list[list[str]]:
    """The validation captions of each image row in `rows`, as token-id sentences."""
    where = {int(r): i for i, r in enumerate(rows)}
    refs: list[list[str]] = [[] for _ in rows]
    for c, row in enumerate(val.image_rows.tolist()):
        if row in where:
            refs[where[row]].append(_words(val.labels[c]))
    return refs


def _scored_rows(val, images: int) -> torch.Tensor:
    return torch.unique(val.image_rows, sorted=True)[:images]


def _decode(model, val, rows, autocast, n: int):
    """Greedy captions (n = 0) or n samples per image of the rows, as token-id sentences."""
    device = next(model.parameters()).device
    grid = val.features.grid_at(rows).to(device).float()
    pooled = val.features.pooled_at(rows).to(device)
    with autocast() if autocast else contextlib.nullcontext():
        if n == 0:
            return [[_words(c.tokens)] for c in greedy(model, grid, pooled)]
        gen = torch.Generator(device=device).manual_seed(0)
        caps = sample(model, grid, pooled, n, generator=gen)
    return [[_words(c.tokens) for c in per_image] for per_image in caps]


def _cider_table(model, val, autocast: Callable | None, n: int, images: int) -> np.ndarray:
    """(images, max(n, 1)) CIDEr-D of each decoded caption against its image's references."""
    rows = _scored_rows(val, images)
    refs = references(val, rows)
    scorer = CiderD(refs)
    candidates = _decode(model, val, rows, autocast, n)
    work.count("cider_scored", sum(map(len, candidates)))
    each = [(c, r) for cs, r in zip(candidates, refs, strict=True) for c in cs]
    table = scorer.score_each([c for c, _ in each], [r for _, r in each])
    return table.reshape(len(candidates), -1)


def val_cider(model, val, batches=None, autocast=None, images: int = IMAGES) -> float:
    return float(_cider_table(model, val, autocast, 0, images).mean())


def val_oracle_cider(model, val, batches=None, autocast=None, images: int = IMAGES) -> float:
    return float(_cider_table(model, val, autocast, SAMPLES, images).max(axis=1).mean())


def val_sample_cider(model, val, batches=None, autocast=None, images: int = IMAGES) -> float:
    return float(_cider_table(model, val, autocast, SAMPLES, images).mean())


@dataclass
class ValMetric:
    """fn(model, val data, val batches, autocast) -> value; `mode` min or max is better.
    `val batches` is the fixed subset of `train.val_captions` validation captions."""

    fn: Callable[[Captioner, CaptionData, list[Batch], Callable], float]
    mode: str


def val_loss(model: Captioner, val: CaptionData, batches: list[Batch], autocast: Callable):
    """Token cross-entropy of the validation captions (UNKT eq. 1), mean over all their
    non-pad tokens (token-weighted, so it does not depend on batch boundaries)."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            b = batch.to(device)
            work.count("teacher_forced", b.labels.shape[0])
            with autocast():
                logits = model.decode(encode_batch(model, b), b.inputs)
            nll = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), b.labels.flatten(), ignore_index=PAD, reduction="sum"
            )
            total += float(nll)
            count += b.n_tokens
    return total / max(count, 1)


def self_retrieval(
    model: Captioner,
    val: CaptionData,
    batches: list[Batch],
    autocast: Callable,
    images: int = 100,
) -> float:
    """Model-based self-retrieval R@1 (CL §4.1, with the captioner as the retrieval model):
    greedy-decode a caption for each of the first `images` validation images and count how
    often log p(c_i | I_j) is largest for its own image j = i among those images."""
    rows = torch.unique(val.image_rows, sorted=True)[:images]
    grid, pooled = val.features.grid_at(rows).float(), val.features.pooled_at(rows)
    caps = greedy(model, grid, pooled)
    m = len(rows)
    pairs_img = torch.arange(m).repeat(m)  # caption i paired with every image j
    tokens = [c.tokens for c in caps for _ in range(m)]
    scores = sequence_logprob(model, grid, pooled, tokens, image_index=pairs_img).view(m, m)
    return float((scores.argmax(dim=1) == torch.arange(m)).float().mean())


# The trainer's function of each metric every method has; their names and modes are
# distinctcap.train.select_metrics (the objectives compute their own `val_metrics`).
VAL_METRICS: dict[str, ValMetric] = {
    name: ValMetric(fn, SELECT_METRICS[name])
    for name, fn in {
        "val_loss": val_loss,
        "self_retrieval": self_retrieval,
        "cider": val_cider,
        "oracle_cider": val_oracle_cider,
        "sample_cider": val_sample_cider,
    }.items()
}
