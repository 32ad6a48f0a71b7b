"""A folder of images and a captions file: JSONL (one ``{"image": ..., "caption": ...,
"split": ...}`` object a line) or CSV (a header row naming ``image``, ``caption`` and
optionally ``split``). ``image`` is a path relative to the folder.

Images are numbered in the order of their paths (sorted), captions by their row. An image
whose rows give no split is drawn into train / val / test by the seeded ratio
(``val_fraction``, ``test_fraction``, ``split_seed``); ``restval`` counts as train.

Rows that cannot be used are returned as quarantine rows with their reason (a line that is not
JSON, a missing field, an image path outside the images folder (absolute, through ``..`` or a
symlink that leads out; never opened), an unknown split, a split other than the image's first,
the same image and caption again); unreadable images, missing files and empty or non-UTF-8
captions are quarantined later by ``quality.check_tables``, as for every source.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from distinctcap.core.errors import DistinctcapError
from distinctcap.data.karpathy import SPLITS
from distinctcap.data.quality import OUTSIDE, outside
from distinctcap.data.readers import images_table, normalize_texts, raw_text, read_text

FIELDS = ("image", "caption")


def read_rows(path: Path) -> list[dict | str]:
    """The captions file's rows: a dict per row, or the reason a row is unusable."""
    text = read_text(path)
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        missing = [f for f in FIELDS if f not in (reader.fieldnames or [])]
        if missing:
            raise DistinctcapError(
                f"data.folder.captions = {str(path)!r}: the CSV header lacks {missing} "
                f"(columns: image, caption, optional split)"
            )
        return list(reader)
    return [json_row(line) for line in text.splitlines() if line.strip()]


def json_row(line: str) -> dict | str:
    try:
        row = json.loads(line)
    except ValueError as error:
        return f"not a JSON line: {error}"
    return row if isinstance(row, dict) else "not a JSON object"


def row_problem(row: dict | str, root: Path) -> str | None:
    if isinstance(row, str):
        return row
    missing = [f for f in FIELDS if not isinstance(row.get(f), str)]
    if missing:
        return f"no {' or '.join(missing)} field"
    if not row["image"].strip():
        return "empty image path"
    if outside(root, row["image"].strip()):
        return OUTSIDE
    split = row.get("split") or ""
    if split not in SPLITS and split:
        return f"unknown split {split!r} (allowed: {', '.join(SPLITS)})"
    return None


def row_image(row: dict | str) -> str:
    """The row's image path, stripped and normalised (``./a.png`` and ``b/../a.png`` are
    ``a.png``: one image; invalid UTF-8 shown as U+FFFD), else ""."""
    image = row.get("image") if isinstance(row, dict) else None
    if not isinstance(image, str) or not image.strip():
        return ""
    image = os.path.normpath(image.strip())
    return image.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def seeded_splits(files: list[str], cfg: dict) -> dict[str, str]:
    """file -> train / val / test, drawn by the seeded ratio."""
    order = np.random.default_rng(cfg.get("split_seed", 0)).permutation(len(files))
    n_val = round(len(files) * cfg.get("val_fraction", 0.1))
    n_test = round(len(files) * cfg.get("test_fraction", 0.1))
    names = ["val"] * n_val + ["test"] * n_test
    names += ["train"] * (len(files) - len(names))
    return {files[k]: names[rank] for rank, k in enumerate(order)}


def read_folder(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame, list[tuple[str, str, str, str]]]:
    """Unchecked (images, captions) of the ``data.folder`` block and its set-aside rows
    (kind, id, file, reason), each row of the file either in the tables or set aside."""
    rows, root = read_rows(Path(cfg["captions"])), Path(cfg["images"])
    bad: list[tuple[str, str, str, str]] = []
    kept: list[tuple[int, str, object, str]] = []  # (row number, image, caption, split)
    split_of: dict[str, str] = {}
    seen: dict[tuple[str, object], int] = {}
    for n, row in enumerate(rows, start=1):
        reason = row_problem(row, root)
        image = row_image(row)
        if reason is None:
            split = SPLITS.get(row.get("split") or "", "")
            caption = raw_text(row["caption"])
            first = seen.setdefault((image, caption), n)
            if first != n:
                reason = f"duplicate row: the same image and caption as row {first}"
            elif split and split_of.setdefault(image, split) != split:
                reason = f"split {split!r} differs from the image's first split {split_of[image]!r}"
        if reason:
            bad.append(("caption", f"row {n}", image, reason))
        else:
            kept.append((n, image, caption, split))
    files = sorted({image for _, image, _, _ in kept})
    drawn = seeded_splits([f for f in files if f not in split_of], cfg)
    split_of = {**drawn, **split_of}
    ids = {f: i for i, f in enumerate(files)}
    images = images_table([(ids[f], f, split_of[f]) for f in files], root)
    captions = pd.DataFrame(
        [(n, ids[image], split_of[image], caption) for n, image, caption, _ in kept],
        columns=["caption_id", "image_id", "split", "text"],
    )
    return images, captions, bad


def prepare_tables(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame, Path, list]:
    """The data stage's folder source: unchecked (images, captions normalised, image root,
    rows set aside); the caller runs quality.check_tables."""
    root, path = Path(cfg["images"]), Path(cfg["captions"])
    if not root.is_dir():
        raise DistinctcapError(f"data.folder.images = {str(root)!r}: no such folder")
    if not path.is_file():
        raise DistinctcapError(f"data.folder.captions = {str(path)!r}: no such file")
    images, captions, bad = read_folder(cfg)
    return images, normalize_texts(captions, cfg.get("max_words", 20)), root, bad
