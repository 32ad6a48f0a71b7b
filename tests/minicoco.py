"""A generated mini-COCO in the official layouts, and a local HTTP server that serves it.

`build_minicoco(out)` writes 20 tiny noisy JPEGs with five captions each:

* `out/tree/`: an extracted copy (train2014/COCO_train2014_%012d.jpg, val2014/...,
  train2017/%012d.jpg, val2017/..., annotations/captions_*.json, dataset_coco.json);
* `out/serve/`: the same as the official archives, at the official URL paths
  (zips/train2014.zip, annotations/annotations_trainval2017.zip,
  people/karpathy/deepimagesent/caption_datasets.zip, ...).

Splits: 2014 has 12 train and 8 val images; Karpathy's file puts train2014 plus 2 restval in
train (14), then 3 val and 3 test. 2017's val holds 5 of the images and train the other 15.
`defects` plants one bad input of each named kind (see DEFECTS).

`MiniServer` is the package's mirror server (distinctcap.data.mirror.MirrorServer).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from distinctcap.data.mirror import ARCHIVE_MEMBERS, archive_path
from distinctcap.data.mirror import MirrorServer as MiniServer  # noqa: F401 (the tests' name)

IDS = [7 * i + 3 for i in range(20)]  # COCO-like sparse image ids
TRAIN2014, VAL2014 = IDS[:12], IDS[12:]
RESTVAL, KVAL, KTEST = VAL2014[:2], VAL2014[2:5], VAL2014[5:]
VAL2017 = [IDS[2], IDS[7], IDS[12], IDS[15], IDS[19]]
TRAIN2017 = [i for i in IDS if i not in VAL2017]
LONG_RAW = " ".join(f"Word{i}," for i in range(25))  # 25 words: truncated to max_words
STYLED_RAW = "A Man's  RED-hat, on   the\ttable."  # -> "a mans red hat on the table"
BAD_BYTES = b"caf\xe9 au lait"  # latin-1, not UTF-8
DEFECTS = {  # defect -> (kind, id of the bad item) as the quarantine reports it
    "truncated_jpeg": ("image", IDS[3]),
    "missing_file": ("image", IDS[4]),
    "empty_caption": ("caption", IDS[5] * 10 + 1),
    "non_utf8_caption": ("caption", IDS[6] * 10 + 2),
    "duplicate_image_id": ("image", IDS[8]),
    "duplicate_caption_id": ("caption", IDS[9] * 10 + 2),
}
_MARKER = "@@NOT-UTF8@@"
COLOURS = ["red", "green", "blue", "yellow", "white"]
THINGS = ["dog", "cat", "bus", "kite", "pizza"]


def caption_id(image_id: int, k: int) -> int:
    return image_id * 10 + k


def raw_captions(image_id: int) -> list[str]:
    """Five raw captions, mixed case and punctuation; image IDS[0] gets the long/styled ones."""
    texts = [
        f"A {COLOURS[(image_id + k) % 5]} {THINGS[(image_id * k) % 5]}, near image {image_id}!"
        for k in range(5)
    ]
    if image_id == IDS[0]:
        texts[0], texts[1] = LONG_RAW, STYLED_RAW
    return texts


@dataclass
class MiniCoco:
    tree: Path
    serve: Path
    md5: dict[str, str] = field(default_factory=dict)
    karpathy_counts = {"train": 14, "val": 3, "test": 3}
    mrnn_counts = {"train": 15, "val": 3, "test": 2}  # with mrnn_val_images = 3


def build_minicoco(out: str | Path, defects: tuple[str, ...] = (), zips: bool = True) -> MiniCoco:
    out = Path(out)
    unknown = set(defects) - set(DEFECTS)
    assert not unknown, f"unknown defects {unknown}"
    tree = out / "tree"
    _write_images(tree)
    _write_annotations(tree, defects)
    _write_karpathy(tree, defects)
    _plant_file_defects(tree, defects)
    mini = MiniCoco(tree=tree, serve=out / "serve")
    if zips:
        mini.md5 = _write_zips(tree, mini.serve)
    return mini


def _image_files(image_id: int) -> list[str]:
    files = []
    if image_id in TRAIN2014:
        files.append(f"train2014/COCO_train2014_{image_id:012d}.jpg")
    else:
        files.append(f"val2014/COCO_val2014_{image_id:012d}.jpg")
    files.append(f"{'val' if image_id in VAL2017 else 'train'}2017/{image_id:012d}.jpg")
    return files


def _size(image_id: int) -> tuple[int, int]:
    return 32 + 8 * (image_id % 3), 24


def _write_images(tree: Path) -> None:
    rng = np.random.default_rng(0)
    for image_id in IDS:
        w, h = _size(image_id)
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)  # noise: many JPEG bytes
        for rel in _image_files(image_id):
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(tree / rel, quality=90)


def _captions_of(image_id: int, defects) -> list[tuple[int, str]]:
    pairs = [(caption_id(image_id, k), t) for k, t in enumerate(raw_captions(image_id))]
    if "empty_caption" in defects and image_id == IDS[5]:
        pairs[1] = (pairs[1][0], "")
    if "non_utf8_caption" in defects and image_id == IDS[6]:
        pairs[2] = (pairs[2][0], _MARKER)
    if "duplicate_caption_id" in defects and image_id == IDS[9]:
        pairs[3] = (pairs[2][0], pairs[3][1])
    return pairs


def _dump(obj: object, path: Path) -> None:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.replace(_MARKER.encode(), BAD_BYTES))


def _write_annotations(tree: Path, defects) -> None:
    for part, ids in [
        ("train2014", TRAIN2014),
        ("val2014", VAL2014),
        ("train2017", TRAIN2017),
        ("val2017", VAL2017),
    ]:
        images = [
            {
                "id": i,
                "file_name": Path(_file_in(i, part)).name,
                "width": _size(i)[0],
                "height": _size(i)[1],
            }
            for i in ids
        ]
        if "duplicate_image_id" in defects and IDS[8] in ids:
            images.append(dict(images[ids.index(IDS[8])]))
        annotations = [
            {"image_id": i, "id": cid, "caption": text}
            for i in ids
            for cid, text in _captions_of(i, defects)
        ]
        _dump(
            {"info": {"description": "mini COCO"}, "images": images, "annotations": annotations},
            tree / "annotations" / f"captions_{part}.json",
        )


def _file_in(image_id: int, part: str) -> str:
    return next(f for f in _image_files(image_id) if f.startswith(part))


def _write_karpathy(tree: Path, defects) -> None:
    entries = []
    for imgid, image_id in enumerate(IDS):
        split = (
            "train"
            if image_id in TRAIN2014
            else "restval"
            if image_id in RESTVAL
            else "val"
            if image_id in KVAL
            else "test"
        )
        rel = _image_files(image_id)[0]
        sentences = [
            {"tokens": text.lower().split(), "raw": text, "imgid": imgid, "sentid": cid}
            for cid, text in _captions_of(image_id, defects)
        ]
        entries.append(
            {
                "filepath": rel.split("/")[0],
                "filename": rel.split("/")[1],
                "imgid": imgid,
                "split": split,
                "cocoid": image_id,
                "sentids": [s["sentid"] for s in sentences],
                "sentences": sentences,
            }
        )
    if "duplicate_image_id" in defects:
        twin = json.loads(json.dumps(entries[8]))
        for k, s in enumerate(twin["sentences"]):
            s["sentid"] = 900_000 + k
        entries.append(twin)
    _dump({"images": entries, "dataset": "coco"}, tree / "dataset_coco.json")


def _plant_file_defects(tree: Path, defects) -> None:
    if "truncated_jpeg" in defects:
        for rel in _image_files(IDS[3]):
            data = (tree / rel).read_bytes()
            (tree / rel).write_bytes(data[: len(data) // 2])
    if "missing_file" in defects:
        for rel in _image_files(IDS[4]):
            (tree / rel).unlink()


def _write_zips(tree: Path, serve: Path) -> dict[str, str]:
    layout = {archive_path(name): members for name, members in ARCHIVE_MEMBERS.items()}
    md5 = {}
    for rel, members in layout.items():
        path = serve / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w") as zf:
            for member in members:
                src = tree / member
                files = sorted(src.iterdir()) if src.is_dir() else [src]
                if src.is_dir():
                    zf.writestr(member + "/", b"")
                for f in files:
                    zf.write(f, f.relative_to(tree).as_posix())
        md5[path.name] = hashlib.md5(path.read_bytes()).hexdigest()
    return md5
