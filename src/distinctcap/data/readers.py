"""What the file-based sources (coco, karpathy, folder) share: caption normalisation as the
papers describe it (CL §4.1, specificity §4: lowercase, punctuation removed), text files
whose bytes may not be valid UTF-8, and image sizes from their headers.

Captions whose bytes are not valid UTF-8 are kept as ``bytes`` so that
``distinctcap.data.quality.check_tables`` quarantines them (or fails naming them).
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pandas as pd
from PIL import Image

from distinctcap.core.logs import progress
from distinctcap.data.quality import outside

_APOSTROPHES = re.compile(r"['\u2019`]")
_NOT_ALNUM = re.compile(r"[\W_]+")


def normalize_caption(text: str, max_words: int = 20) -> str:
    """NFKC, lowercase, apostrophes deleted ("man's" -> "mans"), every other character that is
    not a letter or digit a space, whitespace collapsed, the first `max_words` words kept (CL
    truncates to 18 words rather than dropping longer captions)."""
    text = _APOSTROPHES.sub("", unicodedata.normalize("NFKC", text).lower())
    return " ".join(_NOT_ALNUM.sub(" ", text).split()[:max_words])


def normalize_texts(captions: pd.DataFrame, max_words: int) -> pd.DataFrame:
    """`captions` with each text normalised; bytes (invalid UTF-8) stay as they are."""
    texts = [normalize_caption(t, max_words) if isinstance(t, str) else t for t in captions.text]
    return captions.assign(text=texts)


def read_text(path: Path) -> str:
    """A text file whose bytes may hold invalid UTF-8 (kept as lone surrogates)."""
    return path.read_bytes().decode("utf-8", "surrogateescape")


def load_json(path: Path) -> dict:
    """Parse JSON whose strings may hold invalid UTF-8 (kept as lone surrogates)."""
    return json.loads(read_text(path))


def raw_text(text: object) -> object:
    """Invalid UTF-8 (lone surrogates after surrogateescape) back to its raw bytes."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogateescape")
    return text


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) from the header; (0, 0) when unreadable (quality checks report why)."""
    try:
        with Image.open(path) as im:
            return im.size
    except Exception:  # missing or broken: check_tables quarantines it with the reason
        return 0, 0


def images_table(rows: list[tuple[int, str, str]], root: Path) -> pd.DataFrame:
    """The images table of (image_id, file relative to `root`, split) rows, sizes read (a
    file outside `root` is never opened: (0, 0), and check_tables quarantines it)."""
    sizes = [
        (0, 0) if outside(root, f) else image_size(root / f)
        for _, f, _ in progress(rows, unit="images", desc="image sizes", leave=False)
    ]
    return pd.DataFrame(
        [(*row, *size) for row, size in zip(rows, sizes, strict=True)],
        columns=["image_id", "file", "split", "width", "height"],
    )
