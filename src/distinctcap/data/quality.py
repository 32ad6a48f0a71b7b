"""Bad input never vanishes silently: each bad image or caption is quarantined with its reason
(`on_bad_input: skip`) or stops the stage naming it (`fail`)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from PIL import Image

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.logs import progress

QUARANTINE_COLUMNS = ["kind", "id", "file", "reason"]
OUTSIDE = "outside the images folder"


def outside(root: str | Path, file: str) -> bool:
    """Whether `file`, a path relative to the images folder `root`, leads out of it: an
    absolute path, a `..` or a symlink to a file elsewhere. Decided on the names alone, before
    any file is opened (a symlinked root is fine: both sides resolve)."""
    try:
        base = Path(root).resolve()
        return not (base / file).resolve().is_relative_to(base)
    except (OSError, TypeError, ValueError):  # a NUL byte, a loop, not text: not followed
        return True


def image_problem(path: Path) -> str | None:
    """Why the image at `path` is unusable, or None if it decodes fully."""
    return inspect_image(path)[0]


def inspect_image(path: Path) -> tuple[str | None, str | None]:
    """(why the image at `path` is unusable or None, its kind where it decodes: PIL's mode,
    "+progressive" for a progressive JPEG; later stages convert every mode to RGB)."""
    if not path.is_file():
        return "missing file", None
    try:
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            im.load()
            progressive = im.info.get("progressive") or im.info.get("progression")
            return None, im.mode + ("+progressive" if progressive else "")
    except Exception as error:  # PIL raises many types for broken files
        return f"unreadable image: {type(error).__name__}: {error}", None


@contextmanager
def decoding(path: str | os.PathLike) -> Iterator[None]:
    """Decode the image at `path` in this block: a file broken after the data stage checked it
    stops the stage naming it. Later stages cannot skip it: every table after the data stage
    expects features of each of its images, so the data stage is where images are quarantined."""
    try:
        yield
    except DistinctcapError:
        raise
    except Exception as error:  # PIL raises many types for broken files
        raise DistinctcapError(
            f"image {path} is unreadable ({type(error).__name__}: {error}); it changed after the "
            "data stage checked it: replace it, or rerun that stage (snakemake --forcerun "
            "prepare_data), which quarantines it (on_bad_input: skip) or stops naming it (fail)"
        ) from error


def file_problem(root: Path, file: str) -> tuple[str | None, str | None]:
    """(why the image `file` of the images folder `root` is unusable, its kind): outside the
    folder (never opened), else `inspect_image`."""
    return (OUTSIDE, None) if outside(root, file) else inspect_image(root / file)


def _image_problems(root: Path, files: list[str], kinds: Counter) -> list[str | None]:
    """`file_problem` of each file, in order, on a thread pool (decoding releases the GIL, so
    COCO's 123k images check in parallel); the usable images' kinds counted into `kinds`."""
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        checks = pool.map(lambda f: file_problem(root, f), files, chunksize=64)
        found = list(progress(checks, total=len(files), desc="check images", unit="images"))
    kinds.update(kind for _, kind in found if kind)
    return [problem for problem, _ in found]


def caption_problem(text: object) -> str | None:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return "caption is not valid UTF-8"
    if not isinstance(text, str):
        return f"caption is not text ({type(text).__name__})"
    if not text.strip():
        return "empty caption"
    return None


def _repeated_captions(captions: pd.DataFrame, image_ids: set) -> pd.Series:
    """Captions of `image_ids` (images listed twice, each listing with its captions) whose text
    an earlier caption of the same image has."""
    of_twins = captions.image_id.isin(image_ids)
    return of_twins & captions.duplicated(["image_id", "text"], keep="first")


def bad_input(kind: str, item_id: object, file: str, reason: str) -> DistinctcapError:
    """The error that stops the data stage under `on_bad_input: fail`."""
    return DistinctcapError(f"bad {kind} {item_id} ({file}): {reason}")


def set_aside(rows: list[tuple[str, str, str, str]], on_bad_input: str) -> pd.DataFrame:
    """A source's own bad rows (kind, id, file, reason) as a quarantine, or the first one's
    error under `on_bad_input: fail`."""
    if rows and on_bad_input == "fail":
        raise bad_input(*rows[0])
    return pd.DataFrame(rows, columns=QUARANTINE_COLUMNS)


def check_tables(
    images: pd.DataFrame,
    captions: pd.DataFrame,
    image_root: str | Path,
    on_bad_input: str,
    kinds: Counter | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Drop bad images/captions (and captions of dropped images); return them as a quarantine.
    `kinds` counts the decodable images' kinds (`inspect_image`: grayscale "L", "CMYK", ...).

    What is kept is usable by every later stage: each image id once, each caption of an image
    listed twice once, and every image with at least one caption in its split (an evaluation
    of a test image without reference captions would stop after every run has trained)."""
    root = Path(image_root)
    bad: list[tuple[str, str, str, str]] = []

    def flag(kind, item_id, file, reason):
        if on_bad_input == "fail":
            raise bad_input(kind, item_id, file, reason)
        bad.append((kind, str(item_id), str(file), reason))

    dup_images = images.image_id.duplicated(keep="first")
    listed_twice = set(images.image_id[dup_images].tolist())
    for row in images[dup_images].itertuples():
        flag("image", row.image_id, row.file, "duplicate image_id")
    images = images[~dup_images]
    reasons = _image_problems(root, list(images.file), Counter() if kinds is None else kinds)
    for row, reason in zip(images.itertuples(), reasons, strict=True):
        if reason:
            flag("image", row.image_id, row.file, reason)
    images = images[[reason is None for reason in reasons]]

    dup_captions = captions.caption_id.duplicated(keep="first")
    for row in captions[dup_captions].itertuples():
        flag("caption", row.caption_id, "", "duplicate caption_id")
    captions = captions[~dup_captions]
    valid_images = set(images.image_id.tolist())
    keep = []
    for row in captions.itertuples():
        reason = caption_problem(row.text)
        if reason is None and row.image_id not in valid_images:
            reason = f"its image {row.image_id} is missing or quarantined"
        if reason:
            flag("caption", row.caption_id, "", reason)
        keep.append(reason is None)
    captions = captions[keep].copy()
    captions["text"] = [t.decode() if isinstance(t, bytes) else t for t in captions.text]
    repeated = _repeated_captions(captions, listed_twice)
    for row in captions[repeated].itertuples():
        flag("caption", row.caption_id, "",
             f"repeats a caption of image {row.image_id}, whose id is listed twice")  # fmt: skip
    captions = captions[~repeated]
    captioned = set(zip(captions.image_id, captions.split, strict=True))
    usable = [(i, s) in captioned for i, s in zip(images.image_id, images.split, strict=True)]
    for row, ok in zip(images.itertuples(), usable, strict=True):
        if not ok:
            flag("image", row.image_id, row.file, f"no usable caption in its split ({row.split})")
    images = images[usable]
    quarantine = pd.DataFrame(bad, columns=QUARANTINE_COLUMNS)
    return images.reset_index(drop=True), captions.reset_index(drop=True), quarantine
