"""The models a run trains and reads: its captioner, new (the native one sized by the run's
data, or a pre-trained transformers model) or started from its `init` run's weights, and the
frozen final models of the runs its method needs (a teacher, a reference).
"""

from __future__ import annotations

import torch

from distinctcap.captioner.hf import HFCaptioner
from distinctcap.captioner.load import load_captioner
from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.run import RunConfig, RunPaths
from distinctcap.train.data import RunData


def build_model(run: RunConfig, paths: RunPaths, data: RunData) -> Captioner:
    """The captioner run `run` starts from: a new one, with its `init` run's weights (the
    model file `paths.inputs["init"]`) where it has one."""
    model = new_model(run, data)
    init = paths.inputs.get("init")
    if run.init:
        if not init:
            raise DistinctcapError(
                f"run {run.name}: init = {run.init!r} but no init model path given"
            )
        try:
            model.load_state_dict(load_captioner(init).state_dict())
        except RuntimeError as error:
            raise DistinctcapError(
                f"init model {init} does not fit the captioner config: {str(error)[:300]}"
            ) from error
    return model


def new_model(run: RunConfig, data: RunData) -> Captioner:
    """A new captioner of the run's `captioner` block: the pre-trained transformers model, or
    a native one whose vocabulary is the tokenizer's (or captioner.vocab_size) and whose
    input widths are the image features'."""
    cap = dict(run.captioner)
    if run.pretrained:
        vision = cap.get("vision", "frozen")
        return HFCaptioner.from_pretrained(cap["pretrained"], cap["max_len"], vision)
    vocab = cap.pop("vocab_size", None) or data.vocab_size
    if vocab is None:
        raise DistinctcapError(
            "captioner vocab_size unknown: give a tokenizer or captioner.vocab_size"
        )
    feats = data.train.features
    return Captioner(
        CaptionerConfig(
            vocab_size=vocab,
            visual_dim=feats.grid.shape[-1],
            pooled_dim=feats.pooled.shape[-1],
            **cap,
        )
    )


def load_frozen(run: RunConfig, paths: RunPaths, edge: str, device: torch.device) -> Captioner:
    """The final model of the run at `edge` (teacher, reference) on `device`, in eval mode and
    without gradients."""
    path = paths.inputs.get(edge)
    if not getattr(run, edge) or not path:
        raise DistinctcapError(
            f"run {run.name}: method {run.method!r} needs a "
            f"{edge} run (runs.<name>.{edge}) and its model path"
        )
    model = load_captioner(path, map_location=device).eval()
    return model.requires_grad_(False)
