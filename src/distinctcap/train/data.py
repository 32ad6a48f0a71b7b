"""A run's training data: its captions (the run's data selection) and all validation captions with
their image features, and a batch moved to the device.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
from dataclasses import dataclass

import torch

from distinctcap.captioner.hf import retokenize
from distinctcap.core import logs
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, read_table
from distinctcap.core.run import RunConfig, RunPaths
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.features.batches import Batch, CaptionData, select_captions
from distinctcap.features.read import ImageFeatures

log = logging.getLogger(__name__)


@dataclass
class RunData:
    train: CaptionData
    val: CaptionData | None = None
    tokenizer: object | None = None  # CaptionTokenizer; its vocab_size sizes the model

    @property
    def vocab_size(self) -> int | None:
        return getattr(self.tokenizer, "vocab_size", None)


def save_run_data(data: RunData, path: str | os.PathLike) -> None:
    """`data` as a file of tensors and plain values (`read_run_data` reads it back), for
    train.launch's processes; only the native tokenizer is saved with it."""
    tokenizer = data.tokenizer
    if tokenizer is not None and not isinstance(tokenizer, CaptionTokenizer):
        raise DistinctcapError(
            "job data holds a transformers tokenizer, which is not saved; give the "
            "processes no data file, so that they load the run's inputs"
        )
    state = {
        "train": data.train.state(),
        "val": data.val.state() if data.val is not None else None,
        "clip_ids": tokenizer.clip_ids if tokenizer is not None else None,
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def read_run_data(path: str | os.PathLike) -> RunData:
    """The RunData of a `save_run_data` file, read with weights_only=True: a file that holds
    anything but tensors and plain values runs no code and stops with a line naming it."""
    if not os.path.isfile(path):
        raise DistinctcapError(f"job data {path} is missing: start the job again with launch()")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise DistinctcapError(
            f"job data {path} is not a file written by train.data.save_run_data "
            f"({type(error).__name__}); it was not loaded: start the job again with launch()"
        ) from error
    val = state["val"]
    return RunData(
        CaptionData.from_state(state["train"]),
        CaptionData.from_state(val) if val is not None else None,
        CaptionTokenizer(state["clip_ids"]) if state["clip_ids"] is not None else None,
    )


def load_run_data(run: RunConfig, paths: RunPaths) -> RunData:
    """Training captions of the run's data selection and all validation captions, with their
    image features, from its input files (captions, vocab, features, subset)."""
    inputs = paths.inputs
    # the text only where the pre-trained model's tokenizer encodes it: 590,855 COCO captions'
    # strings held beside their tokens while training (issue 55)
    columns = None if run.pretrained else ["caption_id", "image_id", "split", "tokens"]
    captions = read_table(inputs["captions"], "captions", columns)
    features = ImageFeatures.load(inputs["features"])
    max_len = run.captioner["max_len"]
    if run.pretrained:  # the model's own tokenizer (distinctcap.captioner.hf)
        captions, tokenizer = retokenize(captions, run.captioner["pretrained"])
    else:
        tokenizer = CaptionTokenizer.load(inputs["vocab"])
    chosen = select_captions(captions, "train", run.data, inputs.get("subset"))
    val = select_captions(captions, "val")
    log.info(
        "run %s: %d training captions (data %s), %d validation captions",
        run.name,
        len(chosen),
        run.data,
        len(val),
    )
    return RunData(
        CaptionData.from_table(chosen, features, max_len),
        CaptionData.from_table(val, features, max_len) if len(val) else None,
        tokenizer,
    )


def warn_if_capped(run: str, key: str, value: int, limit: int, which: str) -> None:
    """train.`key` larger than the run's `which` captions: capped, with one warning."""
    logs.warn_if_capped(log, f"run {run}: train.{key}", value, limit,
                        f"the run's {limit} {which} captions")  # fmt: skip


def validation_batches(
    val: CaptionData | None, run: str, n: int, batch_size: int, seed: int
) -> list[Batch]:
    """The validation captions a run scores, in batches of `batch_size`: all of them, or `n`
    drawn with the run's `seed` (train.val_captions; 0: all)."""
    if val is None:
        return []
    idx = torch.arange(len(val))
    warn_if_capped(run, "val_captions", n, len(val), "validation")
    if 0 < n < len(val):
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(len(val), generator=g)[:n].sort().values
    return [val.batch(idx[s : s + batch_size]) for s in range(0, len(idx), batch_size)]


def to_device(batch: Batch, device: torch.device) -> Batch:
    """`batch` on `device`; to a GPU through pinned memory, so the copy is asynchronous and the
    host goes on preparing the next batch (the caching host allocator keeps the pinned buffer
    until the copy is done)."""
    if device.type != "cuda":
        return batch.to(device)
    move = {"device": device, "non_blocking": True}
    return dataclasses.replace(
        batch,
        grid=batch.grid.pin_memory().to(**move),
        pooled=batch.pooled.pin_memory().to(**move),
        inputs=batch.inputs.pin_memory().to(**move),
        labels=batch.labels.pin_memory().to(**move),
    )


# The share of the GPU's free memory (measured after the models are loaded) that the resident
# caption data may take; the rest is left to activations, the optimiser and the allocator
RESIDENT_SHARE = 0.5


def fits_on_device(nbytes: int, device: torch.device) -> bool:
    """Do `nbytes` fit in RESIDENT_SHARE of `device`'s free memory? (Always on the CPU.)"""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return nbytes <= RESIDENT_SHARE * free


class DeviceCaptions:
    """The batches of `data` (a CaptionData) gathered where the step runs: equal to
    `to_device(data.batch(idx), device)`, without a host sync.

    Resident (the default where the image features and the caption tokens fit,
    `fits_on_device`; COCO's ViT-B/32 grid is ~9 GB in float16): they are copied to the device
    once and a batch is a gather there, from the batch's positions copied without waiting.
    Otherwise each batch is gathered on the host straight into pinned memory and copied
    asynchronously; either way the host goes on to the next step while the device computes,
    so the next batch's gather overlaps the current step. On the CPU both are `data.batch`."""

    def __init__(self, data: CaptionData, device: torch.device, resident: bool | None = None):
        self.data, self.device = data, device
        f = data.features
        self.store = {"grid": f.grid, "pooled": f.pooled,
                      "inputs": data.inputs, "labels": data.labels}  # fmt: skip
        nbytes = sum(t.numel() * t.element_size() for t in self.store.values())
        self.resident = fits_on_device(nbytes, device) if resident is None else resident
        if self.resident:
            self.store = {k: t.to(device) for k, t in self.store.items()}
        self.nbytes = nbytes

    def tokens(self, idx: torch.Tensor) -> int:
        """Label positions that count in the loss of the captions at `idx` (`Batch.n_tokens`,
        read from the host's copy)."""
        return int(self.data.lengths[idx].sum())

    def batch(self, idx: torch.Tensor | list[int]) -> Batch:
        idx = torch.as_tensor(idx, dtype=torch.long)
        d = self.data
        n = max(int(d.lengths[idx].max()), 1)
        rows = d.image_rows[idx]
        s = self.store
        if self.resident:
            rows_at, idx_at = self._to_device(rows), self._to_device(idx)
            if self.device.type == "cuda":
                grid, pooled = s["grid"][rows_at], s["pooled"][rows_at]
            else:
                grid, pooled = d.features.grid_at(rows), d.features.pooled_at(rows)
            tokens = (s["inputs"][idx_at, :n].long(), s["labels"][idx_at, :n].long())
            parts = (grid, pooled, *tokens)
        else:
            gather, read = self._pinned, self._pinned_rows
            parts = (read(d.features.grid_at, s["grid"], rows),
                     read(d.features.pooled_at, s["pooled"], rows),
                     gather(s["inputs"][:, :n], idx).long(),
                     gather(s["labels"][:, :n], idx).long())  # fmt: skip
        return Batch(*parts, d.caption_ids[idx], d.image_ids[idx], rows)

    def _to_device(self, index: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return index
        return index.pin_memory().to(self.device, non_blocking=True)

    def _pinned_rows(self, read, table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The batch's rows of a feature table read into pinned memory (`read`:
        `ImageFeatures.grid_at` or `pooled_at`, from the cache's file, not through its map),
        then copied without waiting."""
        if self.device.type != "cuda":
            return read(rows)
        out = torch.empty((len(rows), *table.shape[1:]), dtype=table.dtype, pin_memory=True)
        return read(rows, out).to(self.device, non_blocking=True)

    def _pinned(self, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """table[index] gathered on the host into pinned memory, then copied without waiting
        (the caching host allocator keeps the buffer until the copy is done)."""
        if self.device.type != "cuda":
            return table[index]
        out = torch.empty((len(index), *table.shape[1:]), dtype=table.dtype, pin_memory=True)
        torch.index_select(table, 0, index, out=out)
        return out.to(self.device, non_blocking=True)
