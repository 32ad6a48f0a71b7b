"""`distinctcap fetch`: on a machine with network access (a cluster's login node), everything a
config's jobs will read, downloaded into the places the jobs read it from and checked there:
COCO (data.coco's download_dir, by the data stage's own resumable, verified download), the CLIP
tags of `clip` and `evaluate.judge` (the Hugging Face hub cache, by open_clip's download), the
pre-trained captioner (the same cache, by transformers) and SPICE's CoreNLP jars
(pycocoevalcap's folder) when evaluate.spice asks for them. With `offline` (or HF_HUB_OFFLINE
set) nothing is downloaded: it says what is there and what is missing. Every check reads the
caches with downloads off, as a compute node with `HF_HUB_OFFLINE=1` will.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from distinctcap.core.errors import DistinctcapError
from distinctcap.runs.preflight import clip_blocks


@dataclass(frozen=True)
class Fetched:
    """One thing a config needs: where it is, or why it is not there."""

    what: str
    where: str | None = None
    problem: str | None = None

    def line(self) -> str:
        if self.problem:
            return f"missing  {self.what}: {self.problem}"
        return f"ok       {self.what}: {self.where}"


def attempt(what: str, get: Callable[[], str]) -> Fetched:
    try:
        return Fetched(what, where=get())
    except DistinctcapError as error:
        return Fetched(what, problem=str(error))


def fetch_coco(block: dict, download: bool) -> str:
    from distinctcap.data.coco import CocoConfig, check_root, fetch

    config = CocoConfig.from_dict(block)
    if download:
        return str(fetch(config))
    root = Path(config.root or config.download_dir)
    check_root(root, config.split)
    return str(root)


def fetch_clip(clip: dict, download: bool) -> str:
    import open_clip

    from distinctcap.clip.weights import resolve_weights, tag_file

    if open_clip.get_pretrained_cfg(clip["arch"], clip["pretrained"]):
        if download:
            tag_file(clip["arch"], clip["pretrained"])
        path = tag_file(clip["arch"], clip["pretrained"], download=False)
    else:  # a file or local-dir: present, with the tag clip.tag names
        files = resolve_weights(clip["arch"], clip["pretrained"], clip.get("tag")).files
        path = ", ".join(files)
    for file in path.split(", "):
        verify_safetensors(file)
    return path


def verify_safetensors(path: str) -> None:
    """A .safetensors file's header and tensor index read (a truncated download fails here)."""
    if not path.endswith(".safetensors"):
        return
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt") as file:
            file.keys()
    except (SafetensorError, OSError) as error:
        raise DistinctcapError(f"{path} is not a readable safetensors file: {error}") from error


def fetch_captioner(source: str, download: bool) -> str:
    from distinctcap.runs.preflight import captioner_weights

    if download and not Path(source).expanduser().is_dir():
        from distinctcap.captioner.hf import _transformers, hub_load

        tf = _transformers()
        for loader in (tf.AutoConfig, tf.AutoProcessor, tf.AutoModelForImageTextToText):
            hub_load(loader, source)
    captioner_weights(source)
    return snapshot(source)


def snapshot(source: str) -> str:
    if Path(source).expanduser().is_dir():
        return source
    from huggingface_hub import snapshot_download

    return snapshot_download(source, local_files_only=True)


def fetch_spice(download: bool) -> str:
    from distinctcap.evaluate.metrics.spice import SPICE_CORENLP_JARS, spice_unavailable_reason

    if download and not all(p.is_file() for p in SPICE_CORENLP_JARS):
        from pycocoevalcap.spice.get_stanford_models import get_stanford_models

        get_stanford_models()
    missing = [p.name for p in SPICE_CORENLP_JARS if not p.is_file()]
    if missing:
        raise DistinctcapError(spice_unavailable_reason() or f"{', '.join(missing)} missing")
    return str(SPICE_CORENLP_JARS[0].parent)


def fetch_all(config: dict, download: bool) -> list[Fetched]:
    """Each thing `config` needs, downloaded first when `download` (from the hub only while
    huggingface_hub's own downloads are on), then checked."""
    from distinctcap.core.hub import downloads_off

    hub = download and not downloads_off()
    out = []
    if config["data"]["source"] == "coco":
        block = config["data"].get("coco", {})
        what = f"COCO ({block.get('split', 'karpathy')})"
        out.append(attempt(what, lambda: fetch_coco(block, download)))
    for key, clip in clip_blocks(config):  # the trainer's CLIP and the judge
        if clip["pretrained"] != "train":
            what = f"{'judge ' if key != 'clip' else ''}CLIP {clip['arch']} {clip['pretrained']}"
            out.append(attempt(what, partial(fetch_clip, clip, hub)))
    captioner = config.get("captioner", {})
    if captioner.get("kind") == "transformers":
        source = captioner["pretrained"]
        out.append(attempt(f"captioner {source}", lambda: fetch_captioner(source, hub)))
    if config.get("evaluate", {}).get("spice") and config.get("runs"):
        out.append(attempt("SPICE CoreNLP jars", lambda: fetch_spice(download)))
    return out


def offline_lines() -> list[str]:
    """What the jobs' environment needs so they read these caches without the network."""
    from distinctcap.core.hub import OFFLINE_LINE, hub_cache

    home = os.environ.get("HF_HOME") or os.environ.get("HF_HUB_CACHE")
    where = f"export HF_HUB_CACHE={hub_cache()}" if home else None
    return [line for line in (OFFLINE_LINE, where) if line]


def run_fetch(config: dict, offline: bool, say: Callable[[str], None] = print) -> int:
    """Print one line per thing the config needs and, when all are there, the lines compute
    nodes need; 0 when nothing is missing, else 1."""
    found = fetch_all(config, download=not offline)
    for item in found:
        say(item.line())
    if not found:
        say("nothing to fetch: this config trains its CLIP and reads no downloaded data")
    missing = [item for item in found if item.problem]
    if missing:
        say(f"{len(missing)} of {len(found)} missing (above)")
        return 1
    say("on compute nodes without network, before snakemake:")
    for line in offline_lines():
        say(f"  {line}")
    return 0
