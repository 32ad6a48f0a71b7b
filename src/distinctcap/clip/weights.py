"""Where a CLIP's weights come from: an open_clip tag (in the local hub or URL cache, or fetched
when the network allows), a local weights file, or local-dir:DIR. Fails fast with a message
naming `clip.pretrained` when a tag's weights cannot be had. Registers the shapes world's tiny
architectures (model_configs/) with open_clip on import.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import open_clip

from distinctcap.core.errors import DistinctcapError

MODEL_CONFIGS = Path(__file__).parent / "model_configs"


open_clip.add_model_config(MODEL_CONFIGS)


LOCAL_DIR = "local-dir:"


CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


@dataclass(frozen=True)
class WeightsSource:
    """What to hand open_clip: a model name, a local checkpoint (or None to let open_clip fetch a
    tag) and the tag's preprocessing overrides; `files` are hashed into the features manifest."""

    model_name: str
    checkpoint: str | None
    files: tuple[str, ...]
    kwargs: dict = field(default_factory=dict)


def resolve_weights(arch: str, pretrained: str) -> WeightsSource:
    """Turn `clip.pretrained` into a WeightsSource, failing fast with a clear message."""
    if pretrained.startswith(LOCAL_DIR):
        folder = Path(pretrained[len(LOCAL_DIR) :])
        if not (folder / "open_clip_config.json").is_file():
            raise DistinctcapError(
                f"clip.pretrained = {pretrained!r}: {folder} has no open_clip_config.json; a "
                "local-dir must hold open_clip_config.json and the weights file"
            )
        files = sorted(str(p) for p in folder.iterdir() if p.suffix in CHECKPOINT_SUFFIXES)
        return WeightsSource(pretrained, None, (str(folder / "open_clip_config.json"), *files))
    if arch not in open_clip.list_models():
        raise DistinctcapError(
            f"clip.arch = {arch!r} is not an open_clip architecture; choose one of "
            f"{', '.join(open_clip.list_models())}"
        )
    if os.path.isfile(pretrained):
        return WeightsSource(arch, pretrained, (pretrained,))
    cfg = open_clip.get_pretrained_cfg(arch, pretrained)
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise DistinctcapError(
            f"clip.pretrained = {pretrained!r} is neither a file, nor local-dir:DIR, nor a known "
            f"tag of {arch} (tags: {', '.join(tags) or 'none'})"
        )
    kwargs = {
        "image_mean": cfg.get("mean"),
        "image_std": cfg.get("std"),
        "image_interpolation": cfg.get("interpolation"),
        "image_resize_mode": cfg.get("resize_mode"),
        "force_quick_gelu": bool(cfg.get("quick_gelu", False)),
    }
    cached = cached_tag_file(cfg)
    if cached:
        return WeightsSource(arch, cached, (cached,), kwargs)
    check_can_download(arch, pretrained, cfg)
    return WeightsSource(arch, None, (), {**kwargs, "tag": pretrained})


def cached_tag_file(cfg: dict) -> str | None:
    """The tag's weights file if it is already in the hub or URL cache (no network)."""
    if cfg.get("hf_hub"):
        from huggingface_hub import try_to_load_from_cache

        repo, name = os.path.split(cfg["hf_hub"])
        name = name or "open_clip_pytorch_model.bin"
        candidates = (
            [name[:-4] + ".safetensors", name] if name.endswith((".bin", ".pth")) else [name]
        )
        for candidate in candidates:
            path = try_to_load_from_cache(repo, candidate)
            if isinstance(path, str) and os.path.isfile(path):
                return path
    if cfg.get("url"):
        path = Path("~/.cache/clip").expanduser() / os.path.basename(cfg["url"])
        if path.is_file():
            return str(path)
    return None


def check_can_download(arch: str, tag: str, cfg: dict) -> None:
    """Raise at once if the tag's weights cannot be fetched (offline, or host unreachable)."""
    source = f"https://huggingface.co/{cfg['hf_hub']}" if cfg.get("hf_hub") else cfg.get("url", "")
    host = "huggingface.co" if cfg.get("hf_hub") else urlparse(source).hostname or ""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    why = "downloads are off (HF_HUB_OFFLINE is set)" if offline else None
    if why is None and not reachable(host):
        why = f"{host} cannot be reached"
    if why:
        raise DistinctcapError(
            f"clip.pretrained = {tag!r}: the weights of {arch}/{tag} are not in the local cache "
            f"and {why}. Download them ({source}) on a machine with network access and set "
            "clip.pretrained to the local file (or to local-dir:DIR holding "
            "open_clip_config.json and the weights)"
        )


def reachable(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    """Can a TCP connection to host:port open within `timeout` s (DNS included)?"""
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(ok)
