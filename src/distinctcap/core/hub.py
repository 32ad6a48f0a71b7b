"""The Hugging Face hub cache as huggingface_hub sees it: where it is, whether downloads are off
(HF_HUB_OFFLINE), and a switch to answer from the cache only. Both the CLIP (open_clip) and the
pre-trained captioner (transformers) download through huggingface_hub, so its cache and its
offline switch are the jobs' one source of weights. Light: huggingface_hub loads on first use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
    from pathlib import Path

    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    folder = repo / "snapshots" / revision
    folder.mkdir(parents=True, exist_ok=True)
    return folder
