"""A run's training data: its captions (the run's data selection) and all validation captions with
their image features, and a batch moved to the device.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from distinctcap.captioner.hf import retokenize
from distinctcap.core.io import read_table
from distinctcap.data.batches import Batch, CaptionData, select_captions
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.features.read import ImageFeatures
from distinctcap.train.run import RunConfig, RunPaths

log = logging.getLogger(__name__)


@dataclass
class RunData:
    train: CaptionData
    val: CaptionData | None = None
    tokenizer: object | None = None  # CaptionTokenizer; its vocab_size sizes the model

    @property
    def vocab_size(self) -> int | None:
        return getattr(self.tokenizer, "vocab_size", None)


def load_run_data(run: RunConfig, paths: RunPaths) -> RunData:
    """Training captions of the run's data selection and all validation captions, with their
    image features, from its input files (captions, vocab, features, subset)."""
    inputs = paths.inputs
    captions = read_table(inputs["captions"], "captions")
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
