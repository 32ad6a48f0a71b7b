"""Shapes-CLIP weights shipped in the repository (assets/clip/), so that the embedded default
does not spend most of its first run training the same CLIP again.

The files were produced by the pipeline itself: rule train_clip on the default config, then
`make ship-clip` (`ship_weights`). Beside `<arch>.pt` lies `<arch>.json` with its sha256 and its
training fingerprint (`train.clip.train_fingerprint`: arch, settings, seed, device and a hash of the
loaded training data). `train_clip` takes the shipped weights only when that fingerprint equals
the one it is about to train for, so a changed setting, seed or world retrains from scratch.

    python -m distinctcap.clip.assets RESULTS_CLIP_DIR ASSETS_DIR   # what make ship-clip does
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import torch

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import file_sha256, read_json, write_json

log = logging.getLogger(__name__)


def flat_fingerprint(fingerprint: dict) -> dict:
    """A training fingerprint's fields by name, `settings.<key>` for a setting (settings last);
    also the stamp of a CLIP resume checkpoint, so a stale one is named field by field."""
    fields = {k: v for k, v in fingerprint.items() if k != "settings"}
    return fields | {f"settings.{k}": v for k, v in (fingerprint.get("settings") or {}).items()}


def fingerprint_mismatch(saved: dict, current: dict) -> list[str]:
    """The fields (settings.<key> for a setting) of `current` in which `saved` differs."""
    saved_fields = flat_fingerprint(saved)
    return [k for k, v in flat_fingerprint(current).items() if saved_fields.get(k) != v]


def load_shipped(
    folder: str | Path | None, arch: str, fingerprint: dict
) -> tuple[dict, str] | None:
    """(state dict, description) of the weights shipped in `folder` for `arch` when their
    recorded fingerprint equals `fingerprint`; None (with a log line saying why) otherwise. A
    shipped file that fails its recorded sha256 is an error, not a silent retrain."""
    if not folder or not (Path(folder) / f"{arch}.json").is_file():
        return None
    weights, manifest = Path(folder) / f"{arch}.pt", read_json(Path(folder) / f"{arch}.json")
    differ = fingerprint_mismatch(manifest["fingerprint"], fingerprint)
    if differ:
        why = ", ".join(differ)
        log.info("not using the shipped %s: it was trained with a different %s", weights, why)
        return None
    found = file_sha256([weights]) if weights.is_file() else "missing"
    if found != manifest["sha256"]:
        raise DistinctcapError(
            f"{weights} fails its checksum (sha256 {found[:16]}..., {manifest['sha256'][:16]}... "
            f"recorded in {arch}.json): restore it with git checkout, or set "
            "clip.train.use_shipped: false to train the CLIP"
        )
    log.info("using the shipped %s (sha256 %s...): same training fingerprint", weights, found[:16])
    state = torch.load(weights, map_location="cpu", weights_only=True)
    return state, f"shipped {weights.name} (sha256 {found})"


def ship_weights(results_clip: str | Path, folder: str | Path) -> Path:
    """Copy the trained `<arch>.pt` of a train_clip output folder into `folder` with the
    manifest (`<arch>.json`) that `load_shipped` checks; returns the manifest's path."""
    retrieval = read_json(Path(results_clip) / "retrieval.json")
    if retrieval.get("weights") != "trained":
        raise DistinctcapError(
            f"{results_clip}/retrieval.json: these weights were not trained by this run "
            f"({retrieval.get('weights')}); run train_clip with clip.train.use_shipped: false"
        )
    arch = retrieval["arch"]
    Path(folder).mkdir(parents=True, exist_ok=True)
    target = Path(folder) / f"{arch}.pt"
    shutil.copyfile(Path(results_clip) / f"{arch}.pt", target)
    manifest = {
        "arch": arch,
        "sha256": file_sha256([target]),
        "fingerprint": retrieval["fingerprint"],
        "val_retrieval": {k: v for k, v in retrieval.items() if "R@" in k},
        "train_seconds": retrieval["train_seconds"],
        "made_by": "rule train_clip (clip.train.use_shipped: false), then make ship-clip",
    }
    write_json(manifest, Path(folder) / f"{arch}.json")
    return Path(folder) / f"{arch}.json"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m distinctcap.clip.assets RESULTS_CLIP_DIR ASSETS_DIR")
    print(ship_weights(sys.argv[1], sys.argv[2]))
