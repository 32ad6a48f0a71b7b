"""Reading a run's captioner: `load_captioner` for either kind of model.pt (native `Captioner`
or transformers `HFCaptioner`), its tokenizer, and the export of a transformers run as a folder
`from_pretrained` loads."""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from distinctcap.captioner.hf import HFCaptioner
from distinctcap.captioner.model import Captioner
from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import CaptionTokenizer

log = logging.getLogger(__name__)


def load_captioner(path: str | os.PathLike, map_location: str | torch.device = "cpu"):
    """A run's model.pt, native (`Captioner`) or transformers (distinctcap.captioner.hf)."""
    ckpt = torch.load(path, map_location=map_location, weights_only=True)
    if ckpt.get("kind") == "transformers":
        return HFCaptioner.from_checkpoint(ckpt, map_location)
    return Captioner.from_checkpoint(ckpt, map_location)


def export_run(model_path: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """The run's model.pt as a folder `transformers` loads (from_pretrained, pipeline)."""
    model = load_captioner(model_path)
    if not isinstance(model, HFCaptioner):
        raise DistinctcapError(f"{model_path} is a native captioner; only transformers runs export")
    model.export(out_dir)
    log.info("exported %s to %s", model_path, out_dir)


def caption_tokenizer(model: nn.Module, vocab_path: str | os.PathLike):
    """The tokenizer of a loaded captioner: its own (transformers) or the data's vocab."""
    own = getattr(model, "tokenizer", None)
    if own is not None:
        return own
    return CaptionTokenizer.load(vocab_path)
