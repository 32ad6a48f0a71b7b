"""Reading a run's captioner: `load_captioner` for either kind of model.pt (native `Captioner`
or transformers `HFCaptioner`), its tokenizer, and the export of a transformers run as a folder
`from_pretrained` loads."""

from __future__ import annotations

import logging
import os
import pickle

import torch
from torch import nn

from distinctcap.captioner.hf import HFCaptioner
from distinctcap.captioner.model import Captioner
from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import CaptionTokenizer

log = logging.getLogger(__name__)


def load_captioner(path: str | os.PathLike, map_location: str | torch.device = "cpu"):
    """A run's model.pt, native (`Captioner`) or transformers (distinctcap.captioner.hf). A file
    that is not one (cut short, damaged, or holding code as well as weights) stops with one
    line naming it; torch's own text would advise weights_only=False, the wrong advice for a
    file received from someone else."""
    if not os.path.isfile(path):
        raise DistinctcapError(f"{path} is missing: train the run again with `snakemake`")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise DistinctcapError(
            f"{path} is not a readable captioner checkpoint ({type(error).__name__}): it is cut "
            "short, damaged, or holds more than weights, so it was not loaded; copy the run "
            "folder again from where it was trained, or train the run again"
        ) from error
    if not isinstance(ckpt, dict):
        raise DistinctcapError(f"{path} is not a captioner checkpoint (no dict of weights)")
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
