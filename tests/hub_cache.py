"""A Hugging Face hub cache laid out exactly as huggingface_hub writes it, for offline tests:
<cache>/models--<org>--<name>/refs/main holds the revision, snapshots/<revision>/ the files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from huggingface_hub import constants

from distinctcap.core.hub import snapshot_folder


def copy_into_hub(cache: Path, repo_id: str, folder: Path) -> Path:
    """A save_pretrained folder's files as `repo_id`'s snapshot."""
    snapshot = snapshot_folder(cache, repo_id)
    for file in Path(folder).iterdir():
        shutil.copy(file, snapshot / file.name)
    return snapshot


def point_hub_at(mp: pytest.MonkeyPatch, cache, offline: bool = True) -> None:
    """huggingface_hub reads its cache folder and offline switch at import: set both ways."""
    mp.setenv("HF_HUB_CACHE", str(cache))
    mp.setattr(constants, "HF_HUB_CACHE", str(cache))
    mp.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    mp.setattr(constants, "HF_HUB_OFFLINE", offline)
