"""A training run's resume state on disk, and the fingerprint that decides whether it is resumed.

`fingerprint(config, inputs)` is what a run's result depends on: content hashes of its effective
config and of every input (RunPaths.inputs: captions, vocab, the features index and its shards, the
D-/D+ subset folder, the init/teacher/reference models, a method's own files such as the CLIP or
the neighbours table); out_dir and device are not part of it. The trainer writes it into
summary.json and into every checkpoint.

`Checkpoints` owns one resume file and its folder (a run's `<out_dir>/checkpoints/last.pt`, the
CLIP's `results/clip/checkpoints/<arch>.pt`): it writes a checkpoint dict, stamped with the
fingerprint, atomically; reads it back only if its fingerprint is the current one, and otherwise
(or when it cannot be read) sets it aside as `stale-<its hash>.pt` with one log line naming what
changed; and drops the resume state when training has succeeded (set-aside checkpoints stay). It
knows nothing about models: the trainers assemble the dict and restore from it
(distinctcap.train.trainer, distinctcap.train.clip; ARCHITECTURE.md, Invariants). `rng_state`
captures every RNG a trainer draws from, for the dict.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import pickle
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distinctcap.core.io import atomic_path, file_sha256, read_json

# ---------------------------------------------------------------------------------------------
# Fingerprint: what a run's result depends on


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Fingerprint:
    """Named parts; `hash` combines them. A run's are content hashes, `config` and one per input
    (RunPaths.inputs); the CLIP's are the fields of its training fingerprint."""

    parts: dict[str, object]

    @property
    def hash(self) -> str:
        return _sha(json.dumps(self.parts, sort_keys=True))

    def changes(self, old: dict[str, str]) -> list[str]:
        """Names of the parts that differ from `old` (parts added or dropped included)."""
        return sorted(k for k in self.parts.keys() | old.keys() if self.parts.get(k) != old.get(k))


def fingerprint(config: dict, inputs: Mapping[str, object]) -> Fingerprint:
    """A run's effective config and the content of each of its inputs (files, folders, the
    features index with its shards); where its outputs go and its device are not inputs."""
    parts = {"config": _sha(json.dumps(config, sort_keys=True, default=str))}
    for key, value in sorted(inputs.items()):
        digest = input_digest(key, value)
        if digest is not None:
            parts[key] = digest
    return Fingerprint(parts)


def input_digest(key: str, value: object) -> str | None:
    """Content hash of one input entry: a file, a folder or a list of files; None for a
    value that names no file (a CLIP tag or architecture)."""
    if key == "features" and Path(str(value)).is_file():
        return features_digest(value)
    values = list(value) if isinstance(value, list | tuple) else [value]
    if not values or not all(isinstance(v, str | Path) and Path(v).exists() for v in values):
        return None
    return _sha("".join(path_digest(v) for v in values))


def path_digest(path: str | Path) -> str:
    """Content hash of a file, or of a folder's files: their sorted relative names and contents."""
    path = Path(path)
    if path.is_file():
        return file_sha256([path])
    files = sorted((p.relative_to(path).as_posix(), p) for p in path.rglob("*") if p.is_file())
    return _sha("".join(f"{name}\0{file_sha256([p])}\n" for name, p in files))


def features_digest(index_path: str | Path) -> str:
    """Content hash of a features index and of every shard file it lists (the index's shard
    keys hash what a shard was computed from, not the shard itself)."""
    index = read_json(index_path)
    root = Path(index_path).parent
    entries = [e for kind in ("images", "texts") for e in index.get(kind, {}).get("shards", [])]
    shards = [root / e["path"] for e in entries]
    return _sha(
        path_digest(index_path)
        + "".join(f"{s.name}\0{path_digest(s) if s.is_file() else '-'}\n" for s in shards)
    )


# ---------------------------------------------------------------------------------------------
# The checkpoint folder


def run_checkpoint(out_dir: Path | None) -> Path | None:
    """Where a captioner run keeps its resume state: `<out_dir>/checkpoints/last.pt`."""
    return out_dir / "checkpoints" / "last.pt" if out_dir else None


class Checkpoints:
    """The resume checkpoint at `path`, alone in its folder but for set-aside ones (no path, and
    nothing to do, without one). `log` is the owner's logger, which says when one is set aside;
    `paths` (a run's RunPaths.inputs) names a changed input's file; only the main process
    (`is_main`) sets a checkpoint aside."""

    def __init__(
        self,
        path: str | Path | None,
        fingerprint: Fingerprint,
        log: logging.Logger,
        paths: dict | None = None,
        is_main: bool = True,
    ):
        self.path = Path(path) if path else None
        self.folder = self.path.parent if self.path else None
        self.fingerprint, self.log = fingerprint, log
        self.paths, self.is_main = paths or {}, is_main

    def save(self, state: dict) -> None:
        """Replace the checkpoint atomically with `state`, stamped with this run's fingerprint."""
        with atomic_path(self.path) as tmp:
            torch.save({"fingerprint": self.fingerprint.parts, **state}, tmp)

    def load(self) -> dict | None:
        """The checkpoint if its fingerprint is the current one; None if there is none or it was
        set aside."""
        try:
            ckpt = _read_checkpoint(self.path) if self.path else None
        except (RuntimeError, EOFError, pickle.UnpicklingError) as error:
            self.set_aside("unreadable", f"it cannot be read: {error}")
            return None
        if ckpt is None:
            return None
        reason = self.stale_reason(ckpt.get("fingerprint"))
        if reason:
            self.set_aside(ckpt.get("fingerprint"), reason)
            return None
        return ckpt

    def stale_reason(self, old: object) -> str | None:
        """What differs between a checkpoint's fingerprint and this run's; None if nothing."""
        if not isinstance(old, dict):
            return "it has an old-format fingerprint without the inputs"
        said = []
        for key in self.fingerprint.changes(old):
            value = self.paths.get(key) if key in self.fingerprint.parts else "no longer an input"
            said.append(f"{key} changed" + (f": {_show_path(value)}" if value else ""))
        return ", ".join(said) or None

    def set_aside(self, old: object, reason: str) -> None:
        """Rename a checkpoint of other inputs (or an unreadable one) to stale-<its hash>.pt and
        say why, in one line."""
        if not self.is_main:
            return
        path = self.path
        old_hash = Fingerprint(old).hash if isinstance(old, dict) else str(old or "unknown")
        stale = path.with_name(f"stale-{old_hash}.pt")
        with contextlib.suppress(FileNotFoundError):
            path.replace(stale)
        self.log.warning(
            "checkpoint %s set aside as %s (%s); training from step 0", path, stale.name, reason
        )

    def drop(self) -> None:
        """Remove the checkpoint and temporaries of killed writes; set-aside stale-*.pt stay (the
        folder goes when nothing is left)."""
        if not self.folder or not self.folder.is_dir():
            return
        for path in self.folder.glob("*"):
            if path.is_file() and not path.name.startswith("stale-"):
                path.unlink()
        with contextlib.suppress(OSError):
            self.folder.rmdir()


def _read_checkpoint(path: Path) -> dict | None:
    """The checkpoint at `path`, or None if there is none (another process may rename it)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None


def _show_path(value: object) -> str:
    if isinstance(value, list | tuple):
        return f"{value[0]} and {len(value) - 1} more" if len(value) > 1 else str(value[0])
    return str(value)


def rng_state(generator: np.random.Generator | None = None) -> dict:
    """The torch, CUDA, numpy and python RNG states, and `generator`'s when a trainer draws from
    its own numpy Generator (CLIP's epoch sampling)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": random.getstate(),
    }
    if generator is not None:
        state["generator"] = generator.bit_generator.state
    return state


def set_rng_state(state: dict, generator: np.random.Generator | None = None) -> None:
    """Restore what `rng_state` captured (`generator` to its captured state)."""
    if generator is not None:
        generator.bit_generator.state = state["generator"]
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
