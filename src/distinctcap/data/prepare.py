"""The data stage: build, check and tokenise the images and captions tables."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pandas as pd

from distinctcap.core.io import write_json, write_table
from distinctcap.data import shapes
from distinctcap.data.quality import check_tables, set_aside
from distinctcap.data.tokenizer import CaptionTokenizer

log = logging.getLogger(__name__)


def shapes_tables(cfg: dict, out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    settings = {**cfg, "level_weights": tuple(cfg.get("level_weights", (0.35, 0.25, 0.2, 0.2)))}
    images, captions = shapes.generate(shapes.ShapesConfig(**settings), out_dir)
    return images, captions, out_dir


def coco_tables(cfg: dict, _out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    from distinctcap.data import coco

    return coco.prepare_tables(cfg)


def karpathy_tables(cfg: dict, _out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    from distinctcap.data import karpathy

    return karpathy.prepare_tables(cfg)


def folder_tables(cfg: dict, _out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, Path, list]:
    from distinctcap.data import folder

    return folder.prepare_tables(cfg)


# data.source -> its reader: (images, captions, image root[, rows it set aside itself])
SOURCES = {
    "shapes": shapes_tables,
    "coco": coco_tables,
    "karpathy": karpathy_tables,
    "folder": folder_tables,
}


def tokenize(captions: pd.DataFrame) -> tuple[pd.DataFrame, CaptionTokenizer]:
    """Fit the captioner vocabulary on the train split and add a `tokens` column."""
    tokenizer = CaptionTokenizer.fit(captions.text[captions.split == "train"])
    captions = captions.assign(tokens=[tokenizer.encode(t) for t in captions.text])
    return captions, tokenizer


def reason_counts(quarantine: pd.DataFrame) -> dict[str, int]:
    """How many items each kind of reason set aside ("caption: empty caption": 3); reasons
    that name an item ("its image 7 is missing") count under their first words."""
    general = quarantine.reason.str.replace(r"(?:\s\d|\s*[(:']).*", "", regex=True)
    kinds = quarantine.kind + ": " + general
    return {k: int(v) for k, v in kinds.value_counts().sort_index().items()}


def prepare(data_cfg: dict, on_bad_input: str, outputs: dict) -> dict:
    """Write images, captions, quarantine and vocab; return counts for the log."""
    out_dir = Path(outputs["images"]).parent
    source = data_cfg["source"]
    images, captions, root, *own = SOURCES[source](data_cfg.get(source, {}), out_dir)
    set_apart = set_aside(own[0] if own else [], on_bad_input)
    kinds: Counter = Counter()
    images, captions, quarantine = check_tables(images, captions, root, on_bad_input, kinds)
    if len(set_apart):
        quarantine = pd.concat([set_apart, quarantine], ignore_index=True)
    if len(quarantine):
        log.warning("skipped %d bad items, listed in %s", len(quarantine), outputs["quarantine"])
    captions, tokenizer = tokenize(captions)
    images = images.assign(file=[str(Path(root) / f) for f in images.file])
    write_table(quarantine, outputs["quarantine"], "quarantine")
    write_table(captions, outputs["captions"], "captions")
    tokenizer.save(outputs["vocab"])
    write_table(images, outputs["images"], "images")
    counts = {"images": len(images), "captions": len(captions), "skipped": len(quarantine),
              "vocab": tokenizer.vocab_size}
    if len(quarantine):
        counts["skipped_by_reason"] = reason_counts(quarantine)
    counts["checked_image_kinds"] = dict(sorted(kinds.items()))  # the decodable files checked
    write_json(counts, out_dir / "counts.json")
    return counts
