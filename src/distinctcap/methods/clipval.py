"""Checkpoint selection through a frozen CLIP: the greedy captions of the validation images
retrieve their own image among those images by CLIP cosine.

- `val_mean_rank`: the specificity paper's early stopping on the lowest validation mean rank
  (§2.2, §4);
- `val_clip_r1`: SMILE §3.3, "we choose the checkpoints according to the best self-retrieval
  performance on the validation set" (CLIP self-retrieval, §3.1), R@1.

Both share `clip_val_ranks`; the objectives that select on them build the text encoder once
(`ClipSelection`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from distinctcap.captioner.model import Captioner
from distinctcap.captioner.search import greedy
from distinctcap.core import work
from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import EOS, PAD
from distinctcap.scores.ranks import retrieval_ranks

if TYPE_CHECKING:
    from distinctcap.clip.text import ClipTextEncoder
    from distinctcap.features.batches import CaptionData


def load_clip_model(paths: Mapping, method: str) -> nn.Module:
    """The CLIP model of a run's inputs (clip: weights file or tag, clip_arch, clip_tag)."""
    # open_clip takes seconds to import: only runs that select through a CLIP pay for it
    from distinctcap.clip.load import load_clip

    if not paths.get("clip") or not paths.get("clip_arch"):
        raise DistinctcapError(
            f"method {method} needs the CLIP model: paths.clip (weights "
            "file or tag) and paths.clip_arch (open_clip architecture)"
        )
    return load_clip(paths["clip_arch"], str(paths["clip"]), tag=paths.get("clip_tag")).model


def caption_ids_tensor(token_lists: Sequence[Sequence[int]], device: torch.device) -> Tensor:
    """Decoded captions (tokens without eos) -> ids (B, T) with eos appended, pad after it."""
    t = max((len(x) for x in token_lists), default=0) + 1
    out = torch.full((len(token_lists), t), PAD, dtype=torch.long)
    for i, toks in enumerate(token_lists):
        out[i, : len(toks) + 1] = torch.tensor([*toks, EOS], dtype=torch.long)
    return out.to(device)


@torch.no_grad()
def clip_val_ranks(
    model: Captioner,
    val: CaptionData,
    encoder: ClipTextEncoder,
    images: int = 0,
    batch_size: int = 128,
    autocast: Callable | None = None,
) -> np.ndarray:
    """Rank of its own image for the greedy caption of each validation image (the first
    `images` by feature row, 0 = all) among those images, by CLIP cosine (1-based, ties counted
    against the caption, as `scores.ranks`)."""
    rows = torch.unique(val.image_rows, sorted=True)
    rows = rows[:images] if images else rows
    device = next(model.parameters()).device
    texts = []
    for s in range(0, len(rows), batch_size):
        r = rows[s : s + batch_size]
        grid, pooled = val.features.grid_at(r).to(device), val.features.pooled_at(r).to(device)
        with autocast() if autocast else contextlib.nullcontext():
            caps = greedy(model, grid.float(), pooled.float())
            seqs = caption_ids_tensor([c.tokens for c in caps], device)
            texts.append(encoder(seqs).float().cpu())
    text = torch.cat(texts)
    work.count("clip_scored", len(text))
    return retrieval_ranks(text, val.features.pooled_at(rows).float(), np.arange(len(rows)))


def val_mean_rank(model, val, encoder, images=0, batch_size=128, autocast=None) -> float:
    """Mean of `clip_val_ranks` (specificity paper §4); lower is better."""
    return float(np.mean(clip_val_ranks(model, val, encoder, images, batch_size, autocast)))


def val_clip_r1(model, val, encoder, images=0, batch_size=128, autocast=None) -> float:
    """CLIP self-retrieval R@1 of `clip_val_ranks` (SMILE §3.3); higher is better."""
    return float(np.mean(clip_val_ranks(model, val, encoder, images, batch_size, autocast) == 1))


CLIP_VAL = {"mean_rank": val_mean_rank, "clip_self_retrieval": val_clip_r1}
