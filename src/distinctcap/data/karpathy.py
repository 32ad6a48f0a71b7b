"""Any data set in Karpathy's ``dataset_<name>.json`` format (the split files of COCO, Flickr8k
and Flickr30k in ``caption_datasets.zip``): ``images[]`` with ``filename``, optional
``filepath``, ``split`` (train / restval / val / test), ``imgid``, ``cocoid`` where present,
and ``sentences[]`` with ``raw`` and ``sentid``.

Image ids are ``cocoid`` where present (COCO, so ids match the COCO annotations), else
``imgid``; caption ids are ``sentid``; ``restval`` joins train, as SMILE §4 and the
specificity paper §4 use the split. Files are ``filepath/filename`` (or ``filename``)
relative to the configured image root; one that leads out of it (absolute, ``..``, a symlink
out) is quarantined by ``quality.check_tables`` as outside the images folder, never opened.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from distinctcap.core.errors import DistinctcapError
from distinctcap.data.readers import images_table, load_json, normalize_texts, raw_text

SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def image_file(entry: dict) -> str:
    folder = entry.get("filepath")
    return f"{folder}/{entry['filename']}" if folder else entry["filename"]


def image_id(entry: dict) -> int:
    return int(entry["cocoid"] if "cocoid" in entry else entry["imgid"])


def read_karpathy_file(path: Path, root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Unchecked (images, captions) of Karpathy's file at `path`, images under `root`."""
    try:
        entries = load_json(path)["images"]
    except (ValueError, KeyError, TypeError) as error:
        raise DistinctcapError(
            f"{path} is not a Karpathy split file (expected {{\"images\": [...]}}): {error}"
        ) from error
    images, captions = [], []
    for n, entry in enumerate(entries):
        try:
            split = SPLITS[entry["split"]]
            img = image_id(entry)
            images.append((img, image_file(entry), split))
            captions += [(s["sentid"], img, split, raw_text(s["raw"])) for s in entry["sentences"]]
        except KeyError as error:
            raise DistinctcapError(
                f"{path}: images[{n}] lacks {error} or has an unknown split "
                f"(allowed: {', '.join(SPLITS)})"
            ) from error
    captions = pd.DataFrame(captions, columns=["caption_id", "image_id", "split", "text"])
    return images_table(images, root), captions


def prepare_tables(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    """The data stage's karpathy source (the ``data.karpathy`` block): unchecked (images,
    captions normalised, image root); the caller runs quality.check_tables."""
    path, root = Path(cfg["file"]), Path(cfg["images"])
    if not path.is_file():
        raise DistinctcapError(f"data.karpathy.file = {str(path)!r}: no such file")
    if not root.is_dir():
        raise DistinctcapError(f"data.karpathy.images = {str(root)!r}: no such folder")
    images, captions = read_karpathy_file(path, root)
    return images, normalize_texts(captions, cfg.get("max_words", 20)), root
