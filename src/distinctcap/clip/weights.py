"""Where a CLIP's weights come from: an open_clip tag, a local weights file, or local-dir:DIR.

A tag is resolved by open_clip's own `download_pretrained`, first with huggingface_hub answering
from its cache only (the file names and folders are open_clip's and the hub's, never guessed
here), then, where downloads are allowed, by downloading: network errors, proxies
(HTTPS_PROXY) and HF_HUB_OFFLINE are huggingface_hub's. A file or folder given with
`clip.tag` gets that tag's settings (QuickGELU, mean/std, interpolation, resize mode), as open_clip
would give the tag itself. Every failure is one DistinctcapError line naming the config key and
what was tried. Registers the shapes world's tiny architectures (model_configs/) on import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import open_clip
from open_clip.pretrained import download_pretrained

from distinctcap.core.errors import DistinctcapError, first_line
from distinctcap.core.hub import downloads_off, hub_cache, hub_cache_only

MODEL_CONFIGS = Path(__file__).parent / "model_configs"


open_clip.add_model_config(MODEL_CONFIGS)


LOCAL_DIR = "local-dir:"


CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


@dataclass(frozen=True)
class WeightsSource:
    """What to hand open_clip: a model name, a local checkpoint (None for local-dir:, whose
    folder open_clip reads itself) and a tag's settings; `files` are hashed into the features
    manifest."""

    model_name: str
    checkpoint: str | None
    files: tuple[str, ...]
    kwargs: dict = field(default_factory=dict)


def resolve_weights(arch: str, pretrained: str, tag: str | None = None) -> WeightsSource:
    """`clip.pretrained` (with `clip.tag`'s settings, if given) as a WeightsSource."""
    settings = tag_settings(tag_config(arch, tag, "clip.tag")) if tag else {}
    if pretrained.startswith(LOCAL_DIR):
        return WeightsSource(pretrained, None, local_dir_files(pretrained), settings)
    check_arch(arch)
    if os.path.isfile(pretrained):
        return WeightsSource(arch, pretrained, (pretrained,), settings)
    if pretrained.endswith(CHECKPOINT_SUFFIXES) or os.sep in pretrained:
        raise DistinctcapError(f"clip.pretrained = {pretrained!r}: no such file")
    if tag and tag != pretrained:
        raise DistinctcapError(
            f"clip.tag = {tag!r} names another tag than clip.pretrained = {pretrained!r}, which "
            "is no file; set clip.pretrained to the weights file of that tag, or drop clip.tag"
        )
    path = tag_file(arch, pretrained)
    return WeightsSource(arch, path, (path,), tag_settings(tag_config(arch, pretrained)))


def check_arch(arch: str) -> None:
    if arch not in open_clip.list_models():
        raise DistinctcapError(
            f"clip.arch = {arch!r} is not an open_clip architecture; choose one of "
            f"{', '.join(open_clip.list_models())}"
        )


def local_dir_files(pretrained: str) -> tuple[str, ...]:
    """open_clip_config.json and the weights of a local-dir:DIR, checked to be there."""
    folder = Path(pretrained[len(LOCAL_DIR) :])
    if not (folder / "open_clip_config.json").is_file():
        raise DistinctcapError(
            f"clip.pretrained = {pretrained!r}: {folder} has no open_clip_config.json; a "
            "local-dir must hold open_clip_config.json and the weights file"
        )
    files = sorted(str(p) for p in folder.iterdir() if p.suffix in CHECKPOINT_SUFFIXES)
    return (str(folder / "open_clip_config.json"), *files)


def tag_config(arch: str, tag: str, key: str = "clip.pretrained") -> dict:
    """open_clip's pretrained config of `arch`/`tag`; a DistinctcapError naming `key` if none."""
    check_arch(arch)
    cfg = open_clip.get_pretrained_cfg(arch, tag)
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        what = "neither a file, nor local-dir:DIR, nor" if key == "clip.pretrained" else "not"
        raise DistinctcapError(
            f"{key} = {tag!r} is {what} a known tag of {arch} "
            f"(tags: {', '.join(tags) or 'none'})"
        )
    return cfg


def tag_settings(cfg: dict) -> dict:
    """create_model_and_transforms keywords that give a tag's model and preprocessing."""
    return {
        "image_mean": cfg.get("mean"),
        "image_std": cfg.get("std"),
        "image_interpolation": cfg.get("interpolation"),
        "image_resize_mode": cfg.get("resize_mode"),
        "force_quick_gelu": bool(cfg.get("quick_gelu", False)),
    }


def cached_tag_file(arch: str, tag: str) -> str | None:
    """The tag's weights file in the hub cache (as open_clip looks it up), or None."""
    try:
        with hub_cache_only():
            return download_pretrained(tag_config(arch, tag))
    except (FileNotFoundError, RuntimeError):
        return None


def tag_file(arch: str, tag: str, download: bool = True) -> str:
    """The tag's weights file: from the hub cache, else downloaded by open_clip (when
    `download` and huggingface_hub's downloads are on). One line naming what was tried."""
    cached = cached_tag_file(arch, tag)
    if cached:
        return cached
    repo = tag_config(arch, tag)["hf_hub"].rstrip("/")
    tried = f"{arch}/{tag} ({repo}) is not in the hub cache {hub_cache()}"
    if not download or downloads_off():
        raise DistinctcapError(
            f"clip.pretrained = {tag!r}: {tried} and downloads are off (HF_HUB_OFFLINE); run "
            "`distinctcap fetch` where the network is reachable, or set clip.pretrained to "
            f"the weights file with clip.tag: {tag}"
        )
    try:
        return download_pretrained(tag_config(arch, tag))
    except (FileNotFoundError, RuntimeError, OSError) as error:
        raise DistinctcapError(
            f"clip.pretrained = {tag!r}: {tried} and downloading it failed: "
            f"{first_line(error)}"
        ) from error
