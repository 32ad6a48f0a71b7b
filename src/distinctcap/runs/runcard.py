"""A run folder's card, `results/runs/<run>/run.json`: what makes the folder self-contained.

It records the run's effective config block, the decoding settings of its config, the captioner
vocabulary (a copy, `vocab.json`, beside `model.pt`) and the CLIP whose features the run was
trained on: architecture, where its weights were (a tag, or a path relative to the run folder,
so a moved `results/` keeps working) and their sha256 (the features index records it). Rule
`run_card` writes it (workflow/rules/train.smk); `distinctcap.runs.caption.load_run` reads it and
stops, naming the CLIP, when that CLIP is missing or different.

Light (json only): the rule file imports it while Snakemake parses the DAG.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, read_json, write_json

CARD = "run.json"
VOCAB = "vocab.json"
MODEL = "model.pt"
LOCAL_DIR = "local-dir:"  # distinctcap.clip.weights.LOCAL_DIR (that module imports torch)


def clip_reference(pretrained: str, run_dir: Path) -> dict:
    """`clip.pretrained` as seen from the run folder: {kind: tag, pretrained} for an open_clip
    tag, else {kind: file | local-dir, path} with the path relative to the run folder."""
    kind = "local-dir" if pretrained.startswith(LOCAL_DIR) else "file"
    path = Path(pretrained.removeprefix(LOCAL_DIR))
    if kind == "file" and not path.is_file():
        return {"kind": "tag", "pretrained": pretrained}
    return {"kind": kind, "path": os.path.relpath(path.resolve(), run_dir.resolve())}


def resolve_clip(reference: dict, run_dir: Path) -> tuple[str, Path | None]:
    """(what load_clip takes, the file or folder it reads or None for a tag) of a reference
    written by `clip_reference`."""
    if reference["kind"] == "tag":
        return reference["pretrained"], None
    path = run_dir / reference["path"]
    return (f"{LOCAL_DIR}{path}" if reference["kind"] == "local-dir" else str(path)), path


def write_run_card(
    run_dir: str | os.PathLike,
    name: str,
    run: dict,
    decoding: dict,
    vocab: str | os.PathLike,
    features_index: str | os.PathLike,
    clip_pretrained: str,
) -> dict:
    """Copy the vocabulary into the run folder and write its card (module docstring)."""
    run_dir = Path(run_dir)
    manifest = read_json(features_index)["manifest"]
    card = {
        "name": name,
        "method": run.get("method", "mle"),
        "run": run,
        "decoding": decoding,
        "model": MODEL,
        "vocab": VOCAB,
        "clip": {
            "arch": manifest["arch"],
            **clip_reference(clip_pretrained, run_dir),
            **({"tag": manifest["tag"]} if manifest.get("tag") else {}),
            "weights_sha256": manifest["weights_sha256"],
            "preprocess": manifest["preprocess"],
            "precision": manifest["precision"],
        },
    }
    with atomic_path(run_dir / VOCAB) as tmp:
        shutil.copyfile(vocab, tmp)
    write_json(card, run_dir / CARD)
    return card


def read_run_card(run_dir: str | os.PathLike) -> dict:
    """The card of a run folder; a clear error when the folder is not a finished run."""
    run_dir = Path(run_dir)
    path = run_dir / CARD
    if not path.is_file():
        has_model = (run_dir / MODEL).is_file()
        raise DistinctcapError(
            f"{run_dir} is not a finished run folder: it has no {CARD}"
            + (
                " (its model.pt predates run cards: run `snakemake` once more to write it)"
                if has_model
                else "; pass a folder under results/runs/ (`distinctcap runs` lists them)"
            )
        )
    return read_json(path)


def list_runs(results: str | os.PathLike) -> list[dict]:
    """The cards of every finished run under `results`/runs, by name."""
    runs = Path(results) / "runs"
    cards = sorted(runs.glob(f"*/{CARD}")) if runs.is_dir() else []
    return [read_json(path) for path in cards]
