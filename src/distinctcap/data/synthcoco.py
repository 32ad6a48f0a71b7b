"""A synthetic COCO of any size, in COCO's shapes and formats, for rehearsing the COCO pipeline
without COCO (bench/rehearsal.py).

`write_synthetic_coco(out, n_images)` writes, under `out`, the official archives at their
official URL paths (`distinctcap.data.mirror`; serve `out` with `MirrorServer` and point
`data.coco.base_url` at it):

* real baseline JPEGs at COCO's sizes (640 on the long side, the short side one of COCO's common
  values; a quarter portrait), a smooth two-colour background, a coloured box and a textured
  tile, so each file costs a decoder about what a photo of its size does;
* five captions per image from a small grammar (colours, things, relations, places), mixed case
  and punctuated as COCO's are;
* the splits in both styles, in COCO's proportions (`split_counts`): 2014 train/val
  (`captions_train2014.json`-style annotations, Karpathy's `dataset_coco.json` with
  train/restval/val/test, filepath/filename, imgid, cocoid, sentences with raw and tokens) and
  2017 train/val. At 123,287 images every count is COCO's: 82,783 / 40,504 (2014), Karpathy
  113,287 / 5,000 / 5,000, 2017 118,287 / 5,000.

Images are encoded in worker processes and written once per archive that holds them (2014 and
2017 archives store the same bytes under their own names). Returns the archives' md5s (for
`data.coco.checksums`) and the counts.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

import numpy as np
from PIL import Image

from distinctcap.data.coco import COCO_IMAGES, SPLIT_ARCHIVES
from distinctcap.data.mirror import archive_path

COCO_SHARES = {  # of COCO_IMAGES
    "val2014": 40_504,
    "karpathy_val": 5_000,
    "karpathy_test": 5_000,
    "val2017": 5_000,
}
LONG_SIDE = 640
SHORT_SIDES = (480, 427, 426, 428, 424, 360, 512, 383)
COLOURS = {
    "red": (200, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 70, 200),
    "yellow": (230, 210, 50),
    "white": (235, 235, 235),
    "black": (25, 25, 25),
    "brown": (120, 80, 40),
    "orange": (240, 140, 30),
    "grey": (128, 128, 128),
    "pink": (230, 140, 170),
}
THINGS = (
    "dog",
    "cat",
    "bus",
    "kite",
    "pizza",
    "man",
    "woman",
    "train",
    "horse",
    "bicycle",
    "umbrella",
    "giraffe",
    "elephant",
    "plate",
    "laptop",
    "clock",
    "boat",
    "bench",
    "surfboard",
    "sandwich",
)
RELATIONS = ("next to", "on top of", "in front of", "behind", "near", "under", "beside")
PLACES = (
    "street",
    "kitchen",
    "park",
    "beach",
    "field",
    "room",
    "table",
    "city",
    "snow",
    "water",
)
OPENINGS = ("A", "The", "Two", "An image of a", "There is a", "A photo of a")


@dataclass(frozen=True)
class SplitCounts:
    """How many images each split holds (2014 and 2017 are two splittings of the same ids)."""

    train2014: int
    val2014: int
    karpathy_restval: int
    karpathy_val: int
    karpathy_test: int
    train2017: int
    val2017: int
    mrnn_val_images: int  # data.coco.mrnn_val_images keeping UNKT's 4:1 val:test of val2017


def share(n_images: int, of_coco: int, least: int) -> int:
    return max(least, round(n_images * of_coco / COCO_IMAGES))


def split_counts(n_images: int, cocos_val: bool = False) -> SplitCounts:
    """COCO's split sizes scaled to `n_images` (COCO's own at 123,287); at least two images in
    every val and test split, Karpathy's and mrnn's (the validation selection's CIDEr-D needs
    two images' references for its document frequencies), so every split exists at any size
    >= 8. `cocos_val`: val2017 holds COCO's 5,000 images (mrnn's 4,000 val and 1,000 test) at
    every size that leaves as many train images, so that decoding and evaluation do COCO's
    work whatever the size and only the train split grows (bench/rehearsal.py's sizes)."""
    if n_images < 8:
        raise ValueError(f"a synthetic COCO needs at least 8 images, not {n_images}")
    val2017 = share(n_images, COCO_SHARES["val2017"], 4)
    if cocos_val:
        val2017 = max(val2017, min(COCO_SHARES["val2017"], n_images // 2))
    val2014 = max(share(n_images, COCO_SHARES["val2014"], 6), val2017)  # val2017 is within it
    kval = share(n_images, COCO_SHARES["karpathy_val"], 2)
    ktest = share(n_images, COCO_SHARES["karpathy_test"], 2)
    return SplitCounts(
        train2014=n_images - val2014,
        val2014=val2014,
        karpathy_restval=val2014 - kval - ktest,
        karpathy_val=kval,
        karpathy_test=ktest,
        train2017=n_images - val2017,
        val2017=val2017,
        mrnn_val_images=min(val2017 - 2, max(2, round(val2017 * 4 / 5))),
    )


def image_ids(n_images: int) -> list[int]:
    """Sparse, COCO-like ids (COCO's are not 1..N)."""
    return [9 + 7 * i for i in range(n_images)]


def image_size(image_id: int) -> tuple[int, int]:
    """(width, height): landscape three times in four, as in COCO."""
    rng = np.random.default_rng(image_id)
    short = int(rng.choice(SHORT_SIDES))
    return (short, LONG_SIDE) if rng.random() < 0.25 else (LONG_SIDE, short)


def captions(image_id: int) -> list[str]:
    """Five raw captions of the image (seeded by its id), 6-14 words, COCO's punctuation."""
    rng = np.random.default_rng(image_id + 1)
    colours, texts = list(COLOURS), []
    for _ in range(5):
        a, b = rng.choice(colours, 2)
        x, y = rng.choice(THINGS, 2)
        text = f"{rng.choice(OPENINGS)} {a} {x} {rng.choice(RELATIONS)} a {b} {y}"
        if rng.random() < 0.6:
            text += f" in the {rng.choice(PLACES)}"
        texts.append(text + ("." if rng.random() < 0.7 else ""))
    return texts


# Texture: noise in [0, 48] added to colours scaled into [0, 207], so uint8 sums never wrap.
_TEXTURE = np.tile(
    np.random.default_rng(0).integers(0, 49, (64, 64, 3), dtype=np.uint8), (10, 10, 1)
)
_PALETTE = np.array(list(COLOURS.values()), np.float32) * (207 / 255)


# The odd files a real download holds, each on one image in `every` (by its index, offset so
# that no two kinds meet): COCO has grayscale and CMYK JPEGs and progressive ones; a truncated
# file is what a broken transfer or disk leaves. The data stage keeps the first three (decoded
# to RGB) and quarantines the last with its reason.
ODD_FILES = {  # kind: (every, offset)
    "grayscale": (97, 13),
    "progressive": (211, 29),
    "cmyk": (503, 41),
    "truncated": (1009, 59),
}


def odd_kind(image_id: int) -> str | None:
    """Which odd file (ODD_FILES) the image with `image_id` is, or None for a plain one."""
    index = (image_id - 9) // 7  # image_ids' inverse
    return next((k for k, (every, at) in ODD_FILES.items() if index % every == at), None)


def odd_counts(n_images: int) -> dict[str, int]:
    """How many of each odd file a synthetic COCO of `n_images` holds (an image two kinds'
    rules pick is the first kind's)."""
    kinds = Counter(odd_kind(i) for i in image_ids(n_images))
    return {k: kinds[k] for k in ODD_FILES}


def jpeg_bytes(image_id: int, quality: int = 85) -> bytes:
    """A COCO-sized baseline JPEG: a vertical gradient between two colours, a box of a third,
    a repeated noise tile for texture (photo-like file sizes); one uint8 pass, then the
    encoder. An odd image (`odd_kind`) is grayscale, CMYK, progressive or cut short."""
    width, height = image_size(image_id)
    rng = np.random.default_rng(image_id + 2)
    top, bottom, box = _PALETTE[rng.choice(len(_PALETTE), 3)]
    t = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    gradient = (top * (1 - t) + bottom * t).astype(np.uint8)
    pixels = gradient + _TEXTURE[:height, :width]
    x0, y0 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
    rows, cols = slice(y0, y0 + height // 3), slice(x0, x0 + width // 3)
    pixels[rows, cols] = box.astype(np.uint8) + _TEXTURE[rows, cols]
    odd, image, out = odd_kind(image_id), Image.fromarray(pixels), BytesIO()
    if odd in ("grayscale", "cmyk"):
        image = image.convert("L" if odd == "grayscale" else "CMYK")
    image.save(out, "JPEG", quality=quality, progressive=odd == "progressive")
    data = out.getvalue()
    return data[: len(data) * 3 // 5] if odd == "truncated" else data


def _encoded(ids: list[int]) -> list[bytes]:
    return [jpeg_bytes(i) for i in ids]


def encode_all(ids: list[int], workers: int, chunk: int = 64):
    """(id, JPEG bytes) in id order, encoded by `workers` processes (0: in this process), at
    most 4 batches per worker in flight so memory stays bounded however slow the writer."""
    batches = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
    if workers <= 0:
        for batch in batches:
            yield from zip(batch, _encoded(batch), strict=True)
        return
    window = 4 * workers
    with ProcessPoolExecutor(workers) as pool:
        for start in range(0, len(batches), window):
            part = batches[start : start + window]
            for batch, data in zip(part, pool.map(_encoded, part), strict=True):
                yield from zip(batch, data, strict=True)


@dataclass(frozen=True)
class Layout:
    """Which part (train2014, val2014, train2017, val2017) and Karpathy split each id has."""

    part2014: dict[int, str]
    part2017: dict[int, str]
    karpathy: dict[int, str]
    counts: SplitCounts

    @classmethod
    def of(cls, n_images: int, cocos_val: bool = False) -> Layout:
        ids, counts = image_ids(n_images), split_counts(n_images, cocos_val)
        val2014 = ids[counts.train2014 :]
        in_val2014 = set(val2014)  # built once: a set per id was quadratic (130 s at 123k ids)
        karpathy = dict.fromkeys(ids[: counts.train2014], "train")
        restval, rest = val2014[: counts.karpathy_restval], val2014[counts.karpathy_restval :]
        karpathy.update(dict.fromkeys(restval, "restval"))
        karpathy.update(dict.fromkeys(rest[: counts.karpathy_val], "val"))
        karpathy.update(dict.fromkeys(rest[counts.karpathy_val :], "test"))
        val2017 = set(val2014[-counts.val2017 :])  # as COCO's: val2017 is drawn from val2014
        return cls(
            part2014={i: "val2014" if i in in_val2014 else "train2014" for i in ids},
            part2017={i: "val2017" if i in val2017 else "train2017" for i in ids},
            karpathy=karpathy,
            counts=counts,
        )


def kept_by_part(n_images: int, cocos_val: bool = False) -> dict[str, int]:
    """The images of each 2017 part (train2017: mrnn's train split; val2017: its val and test)
    that the data stage keeps: all but the truncated files, which it quarantines."""
    layout = Layout.of(n_images, cocos_val)
    kept = Counter(p for i, p in layout.part2017.items() if odd_kind(i) != "truncated")
    return {part: kept[part] for part in ("train2017", "val2017")}


def file_name(image_id: int, part: str) -> str:
    """COCO's file names: COCO_train2014_%012d.jpg in 2014, %012d.jpg in 2017."""
    return f"COCO_{part}_{image_id:012d}.jpg" if part.endswith("2014") else f"{image_id:012d}.jpg"


def annotations(layout: Layout, part: str) -> dict:
    """captions_<part>.json: images (id, file_name, width, height), annotations (image_id, id,
    caption)."""
    ids = [i for i in layout.part2014 if part in (layout.part2014[i], layout.part2017[i])]
    images = [
        {"id": i, "file_name": file_name(i, part), "width": w, "height": h}
        for i in ids
        for w, h in [image_size(i)]
    ]
    notes = [
        {"image_id": i, "id": i * 10 + k, "caption": text}
        for i in ids
        for k, text in enumerate(captions(i))
    ]
    return {"info": {"description": "synthetic COCO"}, "images": images, "annotations": notes}


def karpathy_json(layout: Layout) -> dict:
    """Karpathy's dataset_coco.json over the 2014 files."""
    entries = []
    for imgid, (i, split) in enumerate(layout.karpathy.items()):
        part = layout.part2014[i]
        sentences = [
            {
                "tokens": text.lower().rstrip(".").split(),
                "raw": text,
                "imgid": imgid,
                "sentid": i * 10 + k,
            }
            for k, text in enumerate(captions(i))
        ]
        entries.append(
            {
                "filepath": part,
                "filename": file_name(i, part),
                "imgid": imgid,
                "split": split,
                "cocoid": i,
                "sentids": [s["sentid"] for s in sentences],
                "sentences": sentences,
            }
        )
    return {"images": entries, "dataset": "coco"}


def _open_zip(out: Path, name: str) -> zipfile.ZipFile:
    path = out / archive_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return zipfile.ZipFile(path, "w")  # stored, as COCO's image zips effectively are


def _write_json_zip(out: Path, name: str, members: dict[str, dict]) -> None:
    with _open_zip(out, name) as zf:
        for member, obj in members.items():
            zf.writestr(member, json.dumps(obj))


def write_synthetic_coco(
    out: str | Path,
    n_images: int,
    styles: tuple[str, ...] = ("mrnn",),
    workers: int = 0,
    cocos_val: bool = False,
) -> tuple[dict[str, str], SplitCounts]:
    """The archives of split `styles` (karpathy, mrnn) for `n_images` images under `out`
    (see the module doc; `cocos_val`: split_counts'); returns ({archive name: md5}, counts)."""
    out, layout = Path(out), Layout.of(n_images, cocos_val)
    names = sorted({n for style in styles for n in SPLIT_ARCHIVES[style]})
    parts = ("train2014", "val2014", "train2017", "val2017")
    image_zips = {p: _open_zip(out, f"{p}.zip") for p in parts if f"{p}.zip" in names}
    try:
        for part, zf in image_zips.items():
            zf.writestr(part + "/", b"")
        for image_id, data in encode_all(list(layout.part2014), workers):
            for part in (layout.part2014[image_id], layout.part2017[image_id]):
                if part in image_zips:
                    image_zips[part].writestr(f"{part}/{file_name(image_id, part)}", data)
    finally:
        for zf in image_zips.values():
            zf.close()
    for year in ("2014", "2017"):
        name = f"annotations_trainval{year}.zip"
        if name in names:
            parts = (f"train{year}", f"val{year}")
            members = {f"annotations/captions_{p}.json": annotations(layout, p) for p in parts}
            _write_json_zip(out, name, members)
    if "caption_datasets.zip" in names:
        _write_json_zip(out, "caption_datasets.zip", {"dataset_coco.json": karpathy_json(layout)})
    return {n: md5_of(out / archive_path(n)) for n in names}, layout.counts


def md5_of(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
