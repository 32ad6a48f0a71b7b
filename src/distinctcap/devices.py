"""Which torch device a stage runs on: the one `resolve_device` behind every `device:` setting
(config `device`, CLIP training and features, decoding, evaluation, training). It imports only
torch and the project's error type, so any module can use it without an import cycle."""

from __future__ import annotations

import torch

from distinctcap.errors import DistinctcapError


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """`auto` (or None) -> the GPU when one is visible, else the CPU; any other value is a torch
    device (`cpu`, `cuda`, `cuda:1`, a torch.device). A CUDA device without a visible GPU is a
    DistinctcapError naming the `device` setting."""
    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DistinctcapError(
            f"device = {str(device)!r} but no GPU is visible; use 'auto' or 'cpu'"
        )
    return dev
