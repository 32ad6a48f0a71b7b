"""Training data of a run: (image features, caption tokens) pairs and a resumable batch order.

- `ImageFeatures` holds CLIP features of a set of images (pooled (N, Dp) float32, grid
  (N, G, Dv) float16), looked up by image id. `ImageFeatures.load` is the one way to read them
  from a features index (training, decoding).
- `CaptionData` pairs captions with the row of their image and pre-tokenises every caption once
  (inputs = [bos] + tokens, labels = tokens + [eos], right-padded; `make_batch` semantics), so a
  batch is a gather of rows, not a Python loop.
- `BatchOrder`: micro-batch j of a run holds the captions at positions
  [(j mod P) * B, (j mod P + 1) * B) of the permutation of epoch j // P (P batches per epoch,
  the last incomplete batch dropped). The permutation is a pure function of (seed, epoch), so
  the data position of a resumed run is just the micro-batch counter j.
- `select_captions` picks a run's training captions: all of D, or the entropy subset D- or D+
  (UNKT §3.1), read from the subset's parquet shards.

It lives in features/, above the reader and the captioner's `make_batch` it builds on and below
the objectives and the trainer that read it (ARCHITECTURE.md, Layers)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch
from torch import Tensor

from distinctcap.captioner.model import make_batch
from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import BOS, EOS, PAD
from distinctcap.features.read import ImageFeatures

DATA_SELECTIONS = ("all", "D-", "D+")
TOKEN_DTYPE = torch.int32  # CaptionData's token rows; any vocabulary's ids fit


@dataclass
class Batch:
    grid: Tensor  # (B, G, Dv) float16 or float32
    pooled: Tensor  # (B, Dp)
    inputs: Tensor  # (B, N) [bos] + tokens, pad 0
    labels: Tensor  # (B, N) tokens + [eos], pad 0
    caption_ids: Tensor  # (B,) int64, on CPU
    image_ids: Tensor  # (B,) int64, on CPU
    image_rows: Tensor  # (B,) row of each image in the dataset's features, on CPU

    def to(self, device: torch.device | str) -> Batch:
        move = {"non_blocking": True}
        return Batch(
            self.grid.to(device, **move),
            self.pooled.to(device, **move),
            self.inputs.to(device, **move),
            self.labels.to(device, **move),
            self.caption_ids,
            self.image_ids,
            self.image_rows,
        )

    def __len__(self) -> int:
        return len(self.caption_ids)

    @property
    def n_tokens(self) -> int:
        """Label positions that count in the loss (non-pad)."""
        return int((self.labels != PAD).sum())


class CaptionData:
    """Captions of one selection, each with its image's features; `batch(idx)` gathers rows."""

    def __init__(
        self,
        features: ImageFeatures,
        caption_ids: Sequence[int] | np.ndarray,
        image_ids: Sequence[int] | np.ndarray,
        tokens: Sequence[Sequence[int]],
        max_len: int,
    ):
        if not len(caption_ids) == len(image_ids) == len(tokens):
            raise DistinctcapError("caption_ids, image_ids and tokens differ in length")
        if len(caption_ids) == 0:
            raise DistinctcapError("no captions selected: the run has nothing to train on")
        self.features = features
        self.caption_ids = torch.from_numpy(np.array(caption_ids, dtype=np.int64))
        self.image_ids = torch.from_numpy(np.array(image_ids, dtype=np.int64))
        self.image_rows = torch.as_tensor(features.rows(self.image_ids.numpy()))
        # int32: half the bytes of 590,855 COCO captions' rows (issue 55); a batch is int64
        self.inputs, self.labels = make_batch(tokens, max_len, BOS, EOS, PAD, TOKEN_DTYPE)
        self.lengths = (self.labels != PAD).sum(dim=1)  # (C,)

    def __len__(self) -> int:
        return len(self.caption_ids)

    @classmethod
    def from_table(cls, captions: pd.DataFrame, features: ImageFeatures, max_len: int):
        return cls(
            features,
            captions.caption_id.to_numpy(),
            captions.image_id.to_numpy(),
            captions.tokens.to_numpy(),
            max_len,
        )

    def state(self) -> dict:
        """Tensors and plain values only, so `torch.load(weights_only=True)` reads it back
        (`from_state`): job data crosses a process boundary as a file (train.launch)."""
        features = {
            f.name: getattr(self.features, f.name)
            for f in fields(ImageFeatures)
            if f.name not in ("grid_file", "pooled_file")  # saved as tensors, read back so
        }
        features["image_ids"] = torch.from_numpy(np.asarray(self.features.image_ids))
        return {**vars(self), "features": features}

    @classmethod
    def from_state(cls, state: dict) -> CaptionData:
        features = dict(state["features"])
        features["image_ids"] = features["image_ids"].numpy()
        data = cls.__new__(cls)
        vars(data).update({**state, "features": ImageFeatures(**features)})
        return data

    def batch(self, idx: Tensor | Sequence[int]) -> Batch:
        """Captions at positions `idx` (B,), trimmed to the longest one (N <= max_len)."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        n = max(int(self.lengths[idx].max()), 1)
        rows = self.image_rows[idx]
        return Batch(
            self.features.grid_at(rows),
            self.features.pooled_at(rows),
            self.inputs[idx, :n].long(),
            self.labels[idx, :n].long(),
            self.caption_ids[idx],
            self.image_ids[idx],
            rows,
        )

    def batches(self, batch_size: int) -> list[Batch]:
        """Every caption once, in order (for validation)."""
        return [
            self.batch(torch.arange(s, min(s + batch_size, len(self))))
            for s in range(0, len(self), batch_size)
        ]


class BatchOrder:
    """Micro-batch j -> caption positions; a pure function of (seed, j) (see module doc).

    With `groups` (the image row of each caption) an epoch visits the images in a random order
    and each image's captions one after another, in a random order: a batch of B captions then
    holds about B / 5 images on COCO or the shapes world, each encoded once (`encode_batch`;
    the classic seq_per_img = 5 of captioning code), a large saving when the encoder dominates.
    """

    def __init__(self, n: int, batch_size: int, seed: int, groups: Tensor | None = None):
        if batch_size < 1:
            raise DistinctcapError(f"batch_size = {batch_size}: allowed >= 1")
        if groups is not None and len(groups) != n:
            raise DistinctcapError(f"{len(groups)} groups for {n} captions")
        self.n, self.seed, self.groups = n, seed, groups
        self.batch_size = min(batch_size, n)  # fewer captions than a batch: one smaller batch
        self.per_epoch = n // self.batch_size
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def permutation(self, epoch: int) -> Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(self.n, generator=g)
            if self.groups is not None:  # images in a random order, captions within at random
                _, dense = torch.unique(self.groups, return_inverse=True)
                rank = torch.randperm(int(dense.max()) + 1, generator=g)[dense]  # (n,)
                perm = perm[torch.argsort(rank[perm], stable=True)]
            self._epoch, self._perm = epoch, perm
        return self._perm

    def epoch_of(self, j: int) -> int:
        return j // self.per_epoch

    def indices(self, j: int) -> Tensor:
        """Caption positions of micro-batch j (B,)."""
        epoch, pos = divmod(j, self.per_epoch)
        start = pos * self.batch_size
        return self.permutation(epoch)[start : start + self.batch_size]


def distinct_images(batch: Batch) -> tuple[Tensor, Tensor]:
    """The batch's distinct images: `first` (U,), the position in the batch of a caption of
    each (in image-row order), and `inverse` (B,), each caption's index into them (CPU)."""
    uniq, inverse = torch.unique(batch.image_rows, return_inverse=True)
    first = torch.zeros(len(uniq), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(inverse)), "amin", include_self=False
    )
    return first, inverse


def encode_batch(model: torch.nn.Module, batch: Batch) -> Tensor:
    """Memory (B, M, W) of the batch's images, each distinct image encoded once and shared by
    its captions (the gradient sums over them, as if encoded per caption; encoder dropout
    masks are then shared by an image's captions)."""
    first, inverse = distinct_images(batch)
    if len(first) == len(inverse):
        return model.encode(batch.grid, batch.pooled)
    # pageable copies without waiting for the device: no host sync inside a step
    first = first.to(batch.grid.device, non_blocking=True)
    memory = model.encode(batch.grid[first], batch.pooled[first])  # (U, M, W)
    return memory[inverse.to(memory.device, non_blocking=True)]


def select_captions(
    captions: pd.DataFrame,
    split: str,
    data: str = "all",
    subset_dir: str | os.PathLike | None = None,
) -> pd.DataFrame:
    """Captions of `split`; for data D- / D+ only those listed in the subset's parquet shards
    (`subset_dir`, a folder of part-*.parquet with a caption_id column, or one parquet file)."""
    if data not in DATA_SELECTIONS:
        raise DistinctcapError(f"run data = {data!r}: choose one of {list(DATA_SELECTIONS)}")
    chosen = captions[captions.split == split]
    if data == "all":
        return chosen.reset_index(drop=True)
    if subset_dir is None:
        raise DistinctcapError(f"run data = {data!r} needs the subset's shards (subset_dir)")
    path = Path(subset_dir)
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise DistinctcapError(f"no parquet shards in {path} for data subset {data}")
    ids = np.concatenate(
        [pq.read_table(f, columns=["caption_id"]).column(0).to_numpy() for f in files]
    )
    return chosen[chosen.caption_id.isin(ids)].reset_index(drop=True)
