"""A run's training data: its captions (the run's data selection) and all validation captions with
their image features, and a batch moved to the device.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from distinctcap.core.io import read_table
from distinctcap.data.batches import Batch, CaptionData, select_captions
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


def load_run_data(cfg: dict) -> RunData:
    """Training captions of the run's data selection and all validation captions, with their
    image features, from the files in `cfg["paths"]` (captions, vocab, features, subset)."""
    from distinctcap.data.tokenizer import CaptionTokenizer

    paths = cfg["paths"]
    captions = read_table(paths["captions"], "captions")
    features = ImageFeatures.load(paths["features"])
    max_len = cfg["captioner"]["max_len"]
    if pretrained_kind(cfg):  # the model's own tokenizer (distinctcap.captioner.hf)
        from distinctcap.captioner.hf import retokenize

        captions, tokenizer = retokenize(captions, cfg["captioner"]["pretrained"])
    else:
        tokenizer = CaptionTokenizer.load(paths["vocab"])
    chosen = select_captions(captions, "train", cfg.get("data", "all"), paths.get("subset"))
    val = select_captions(captions, "val")
    log.info(
        "run %s: %d training captions (data %s), %d validation captions",
        cfg.get("name"),
        len(chosen),
        cfg.get("data", "all"),
        len(val),
    )
    return RunData(
        CaptionData.from_table(chosen, features, max_len),
        CaptionData.from_table(val, features, max_len) if len(val) else None,
        tokenizer,
    )


def pretrained_kind(cfg: dict) -> bool:
    """Whether the run's captioner is a pre-trained transformers model (captioner.kind)."""
    return cfg.get("captioner", {}).get("kind", "native") == "transformers"


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
