"""The data stage: build, check and tokenise the images and captions tables."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from distinctcap.core.io import write_json, write_table
from distinctcap.data import shapes
from distinctcap.data.quality import check_tables
from distinctcap.data.tokenizer import CaptionTokenizer

log = logging.getLogger(__name__)


def shapes_tables(cfg: dict, out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    settings = {**cfg, "level_weights": tuple(cfg.get("level_weights", (0.35, 0.25, 0.2, 0.2)))}
    images, captions = shapes.generate(shapes.ShapesConfig(**settings), out_dir)
    return images, captions, out_dir


def coco_tables(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    from distinctcap.data import coco

    return coco.prepare_tables(cfg)


def tokenize(captions: pd.DataFrame) -> tuple[pd.DataFrame, CaptionTokenizer]:
    """Fit the captioner vocabulary on the train split and add a `tokens` column."""
    tokenizer = CaptionTokenizer.fit(captions.text[captions.split == "train"])
    captions = captions.assign(tokens=[tokenizer.encode(t) for t in captions.text])
    return captions, tokenizer


def prepare(data_cfg: dict, on_bad_input: str, outputs: dict) -> dict:
    """Write images, captions, quarantine and vocab; return counts for the log."""
    out_dir = Path(outputs["images"]).parent
    if data_cfg["source"] == "shapes":
        images, captions, root = shapes_tables(data_cfg["shapes"], out_dir)
    else:
        images, captions, root = coco_tables(data_cfg["coco"])
    images, captions, quarantine = check_tables(images, captions, root, on_bad_input)
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
    write_json(counts, out_dir / "counts.json")
    return counts
