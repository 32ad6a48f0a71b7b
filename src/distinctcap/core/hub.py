"""The Hugging Face hub cache as huggingface_hub sees it: where it is, whether downloads are off
(HF_HUB_OFFLINE), and a switch to answer from the cache only. Both the CLIP (open_clip) and the
pre-trained captioner (transformers) download through huggingface_hub, so its cache and its
offline switch are the jobs' one source of weights. `pretrained_type` probes a pre-trained
captioner's model type while the config is checked (a local folder, the cache, then the hub).
Light: huggingface_hub loads on first use.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from distinctcap.core.errors import DistinctcapError

OFFLINE_LINE = "export HF_HUB_OFFLINE=1"  # what compute nodes without network set


def hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def downloads_off() -> bool:
    from huggingface_hub import constants

    return constants.is_offline_mode()


@contextmanager
def hub_cache_only() -> Iterator[None]:
    """huggingface_hub answers from its cache only, through its own HF_HUB_OFFLINE switch (a
    library that calls it without a local_files_only argument, like open_clip, then finds
    what it downloaded before without asking the network)."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


LOCAL_REVISION = "0123456789abcdef0123456789abcdef01234567"  # of folders put in by hand


def snapshot_folder(cache, repo_id: str, revision: str = LOCAL_REVISION):
    """The snapshot folder of `repo_id` in hub cache `cache`, laid out as huggingface_hub writes
    it (models--org--name/refs/main naming the revision, snapshots/<revision>/), created; files
    put there are what the libraries find offline (tests; bench/rehearsal.py's random CLIP)."""
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    folder = repo / "snapshots" / revision
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# ---------------------------------------------------------------------------------------------
# The model type of a pre-trained captioner (captioner.pretrained), probed at config time


def pretrained_type(source: str) -> str:
    """model_type of `source`'s config.json: a local folder, or a hub id (its cached copy when
    offline). Raises a DistinctcapError saying what was tried."""
    key = f"captioner.pretrained = {source!r}"
    path = Path(source).expanduser()
    looks_local = path.is_absolute() or source.startswith((".", "~")) or source.count("/") > 1
    if path.exists() or looks_local:
        config = path / "config.json"
        if not config.is_file():
            what = "no config.json in that folder" if path.is_dir() else "no such folder"
            raise DistinctcapError(f"{key}: tried the local folder {path}: {what}")
        return _read_model_type(config, key)
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, "config.json")  # no network: every parse runs this
    if isinstance(cached, str):
        return _read_model_type(Path(cached), key)
    if _offline():
        raise DistinctcapError(
            f"{key}: no local folder of that name, and as a hub id it is not in the "
            "Hugging Face cache while HF_HUB_OFFLINE is set; download it with internet "
            "access (unset HF_HUB_OFFLINE) or point at a local folder"
        )
    return _hub_model_type(source, key)


def _offline() -> bool:
    truthy = ("1", "on", "yes", "true")
    return any(os.environ.get(v, "").lower() in truthy
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _read_model_type(config: Path, key: str) -> str:
    try:
        return str(json.loads(config.read_text()).get("model_type"))
    except (OSError, ValueError) as error:
        raise DistinctcapError(f"{key}: cannot read {config} ({error})") from error


def _hub_model_type(source: str, key: str) -> str:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return _read_model_type(Path(hf_hub_download(source, "config.json")), key)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as error:
        raise DistinctcapError(
            f"{key}: no local folder of that name, and the hub gave no config.json for it "
            f"({type(error).__name__})"
        ) from error
