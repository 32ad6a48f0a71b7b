"""A run folder's card, `results/runs/<run>/run.json`: what makes the folder self-contained.

It records the run's effective config block, the decoding settings of its config, the captioner
vocabulary (a copy, `vocab.json`, beside `model.pt`) and the CLIP whose features the run was
trained on: architecture, where its weights were (a tag, or a path relative to the run folder,
so a moved `results/` keeps working) and their sha256 (the features index records it), and the
sha256 of `model.pt`, and (`familiarity`) the threshold beyond which an image is far from the
training images (distinctcap.runs.calibrate). Rule `run_card` writes it (workflow/rules/train.smk);
`distinctcap.runs.caption.load_run` reads it and stops with one line naming the file when
`model.pt` or the CLIP is missing or differs from its checksum, before deserialising either.

Light (json only): the rule file imports it while Snakemake parses the DAG.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, file_sha256, read_json, write_json

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
    familiarity: dict | None = None,
) -> dict:
    """Copy the vocabulary into the run folder and write its card (module docstring);
    `familiarity` is distinctcap.runs.calibrate's block, absent from cards written before it."""
    run_dir = Path(run_dir)
    manifest = read_json(features_index)["manifest"]
    card = {
        "name": name,
        "method": run.get("method", "mle"),
        "run": run,
        "decoding": decoding,
        "model": MODEL,
        "model_sha256": file_sha256([run_dir / MODEL]),
        "vocab": VOCAB,
        "clip": {
            "arch": manifest["arch"],
            **clip_reference(clip_pretrained, run_dir),
            **({"tag": manifest["tag"]} if manifest.get("tag") else {}),
            "weights_sha256": manifest["weights_sha256"],
            "preprocess": manifest["preprocess"],
            "precision": manifest["precision"],
        },
    } | ({"familiarity": familiarity} if familiarity else {})
    with atomic_path(run_dir / VOCAB) as tmp:
        shutil.copyfile(vocab, tmp)
    write_json(card, run_dir / CARD)
    return card


def read_run_card(run_dir: str | os.PathLike) -> dict:
    """The card of a run folder; a clear error when the folder is not a finished run."""
    run_dir = Path(run_dir)
    path = run_dir / CARD
    if not run_dir.is_dir():
        raise DistinctcapError(f"{run_dir} does not exist{_did_you_mean_run(run_dir)}")
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
    try:
        card = read_json(path)
    except (OSError, ValueError) as error:
        raise DistinctcapError(
            f"{path} is unreadable ({type(error).__name__}: {error}); write it again with "
            "`snakemake --forcerun run_card`"
        ) from error
    if not isinstance(card, dict):
        raise DistinctcapError(f"{path} is not a run card; write it again with "
                               "`snakemake --forcerun run_card`")  # fmt: skip
    return card


def _did_you_mean_run(run_dir: Path) -> str:
    """"; did you mean <sibling>?" for the closest run folder beside a misspelt one, else
    where the run folders are listed."""
    import difflib

    parent = run_dir.parent
    siblings = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
    close = difflib.get_close_matches(run_dir.name, siblings, n=1)
    if close:
        return f"; did you mean {parent / close[0]}?"
    if siblings:
        return f"; the run folders in {parent} are {', '.join(siblings)}"
    return "; pass a folder under results/runs/ (`distinctcap runs` lists them)"


def verified_model(card: dict, run_dir: str | os.PathLike) -> Path:
    """The run's model.pt, once its sha256 is the card's: a missing, truncated or replaced
    file stops here with one line, before anything deserialises it."""
    path = Path(run_dir) / card.get("model", MODEL)
    if not path.is_file():
        raise DistinctcapError(
            f"{path} is missing: the run folder is incomplete; copy the whole folder again, or "
            "train the run again with `snakemake`"
        )
    recorded = card.get("model_sha256")
    if recorded is None:
        raise DistinctcapError(
            f"{Path(run_dir) / CARD} records no sha256 of {path.name} (written before cards "
            "did): record it with `snakemake --forcerun run_card`"
        )
    found = file_sha256([path])
    if found != recorded:
        raise DistinctcapError(
            f"{path} has sha256 {found[:16]}..., but its card records {recorded[:16]}...: the "
            "file was cut short, damaged or replaced after training, so it was not loaded; "
            "copy the run folder again from where it was trained, or train the run again"
        )
    return path


def list_runs(results: str | os.PathLike) -> list[dict]:
    """The cards of every run folder under `results`/runs that has one, by name, each with
    `problem`: None, or why the folder cannot caption (an unreadable card, model.pt gone)."""
    runs = Path(results) / "runs"
    paths = sorted(runs.glob(f"*/{CARD}")) if runs.is_dir() else []
    return [_listed(path.parent) for path in paths]


def _listed(run_dir: Path) -> dict:
    try:
        card = read_run_card(run_dir)
    except DistinctcapError:
        return {"name": run_dir.name, "method": "?", "run": {}, "problem": f"unreadable {CARD}"}
    missing = not (run_dir / card.get("model", MODEL)).is_file()
    return {**card, "problem": f"{MODEL} missing" if missing else None}
