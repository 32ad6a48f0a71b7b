"""MS COCO: download (or find a local copy), unzip, and build the images / captions tables.

Two split styles:

* ``karpathy`` (SMILE §4, specificity §4): Karpathy's ``dataset_coco.json`` from
  ``caption_datasets.zip``, over the COCO 2014 images: 113,287 train (its ``train`` plus
  ``restval``), 5,000 val, 5,000 test.
* ``mrnn`` (UNKT §4.1, "118,287 for training, 4K and 1K for validation and testing"): COCO 2017
  train (118,287) for training; val2017 (5,000) sorted by image id, the first
  ``mrnn_val_images`` (4,000) for val and the rest (1,000) for test. The paper names the sizes
  but not the image lists, so this deterministic rule stands in for them.

Captions are normalised the way the papers describe (``readers.normalize_caption``); Karpathy's
file is read by ``distinctcap.data.karpathy``, the reader of every data set in its format.
"""

from __future__ import annotations

import logging
import os
import zipfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pandas as pd

from distinctcap.core.download import download, remote_size
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path
from distinctcap.core.logs import progress
from distinctcap.data.karpathy import read_karpathy_file
from distinctcap.data.quality import check_tables
from distinctcap.data.readers import load_json, normalize_texts, raw_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Archive:
    """One downloadable zip: official URL, and its size / md5 where they are known."""

    name: str
    url: str
    size: int | None = None
    md5: str | None = None


# Sizes and md5s as served by images.cocodataset.org (the md5 is the S3 ETag). Karpathy's zip
# has none recorded: it is checked against the server's Content-Length.
ARCHIVES: dict[str, Archive] = {
    a.name: a
    for a in (
        Archive(
            "train2014.zip",
            "http://images.cocodataset.org/zips/train2014.zip",
            13_510_573_713,
            "0da8c0bd3d6becc4dcb32757491aca88",
        ),
        Archive(
            "val2014.zip",
            "http://images.cocodataset.org/zips/val2014.zip",
            6_645_013_297,
            "a3d79f5ed8d289b7a7554ce06a5782b3",
        ),
        Archive(
            "train2017.zip",
            "http://images.cocodataset.org/zips/train2017.zip",
            19_336_861_798,
            "cced6f7f71b7629ddf16f17bbcfab6b2",
        ),
        Archive(
            "val2017.zip",
            "http://images.cocodataset.org/zips/val2017.zip",
            815_585_330,
            "442b8da7639aecaf257c1dceb8ba8c80",
        ),
        Archive(
            "annotations_trainval2014.zip",
            "http://images.cocodataset.org/annotations/annotations_trainval2014.zip",
            252_872_794,
            "0a379cfc70b0e71301e0f377548639bd",
        ),
        Archive(
            "annotations_trainval2017.zip",
            "http://images.cocodataset.org/annotations/annotations_trainval2017.zip",
            252_907_541,
            "f4bbac642086de4f52a3fdda2de5fa2c",
        ),
        Archive(
            "caption_datasets.zip",
            "https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip",
        ),
    )
}

COCO_IMAGES = 123_287  # train2014 + val2014 = train2017 + val2017: either split style's images

# What each split style downloads, and what a prepared root must hold.
SPLIT_ARCHIVES = {
    "karpathy": ("train2014.zip", "val2014.zip", "caption_datasets.zip"),
    "mrnn": ("train2017.zip", "val2017.zip", "annotations_trainval2017.zip"),
}
REQUIRED = {
    "karpathy": ("train2014", "val2014", "dataset_coco.json"),
    "mrnn": (
        "train2017",
        "val2017",
        "annotations/captions_train2017.json",
        "annotations/captions_val2017.json",
    ),
}
# Where a local copy may keep Karpathy's file (the zip has it at the top level).
KARPATHY_JSON = (
    "dataset_coco.json",
    "karpathy/dataset_coco.json",
    "caption_datasets/dataset_coco.json",
)


@dataclass(frozen=True)
class CocoConfig:
    """The ``data.coco`` config block (descriptions in workflow/schemas/config.schema.yaml)."""

    split: str = "karpathy"
    download_dir: str = "resources/coco"
    root: str | None = None
    base_url: str | None = None
    max_words: int = 20
    mrnn_val_images: int = 4000
    checksums: dict[str, str | None] = field(default_factory=dict)
    retries: int = 5
    backoff: float = 1.0
    timeout: float = 30.0
    keep_zips: bool = True

    @classmethod
    def from_dict(cls, cfg: dict | None) -> CocoConfig:
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(cfg or {}) - set(allowed))
        if unknown:
            raise DistinctcapError(
                f"unknown key data.coco.{unknown[0]}; allowed keys: {', '.join(allowed)}"
            )
        config = cls(**(cfg or {}))
        if config.split not in SPLIT_ARCHIVES:
            raise DistinctcapError(
                f"data.coco.split = {config.split!r} is not allowed; "
                f"choose one of {sorted(SPLIT_ARCHIVES)}"
            )
        bad = sorted(set(config.checksums) - set(ARCHIVES))
        if bad:
            raise DistinctcapError(
                f"data.coco.checksums names unknown archive {bad[0]!r}; known: {sorted(ARCHIVES)}"
            )
        if config.max_words < 1 or config.mrnn_val_images < 1:
            raise DistinctcapError("data.coco.max_words and mrnn_val_images must be >= 1")
        return config


# ---------------------------------------------------------------------------------------------
# download and unzip


def rebase_url(url: str, base_url: str | None) -> str:
    """Replace the scheme and host of `url` by those of `base_url` (its path, if any, prefixes)."""
    if not base_url:
        return url
    base, parts = urlsplit(base_url), urlsplit(url)
    path = base.path.rstrip("/") + parts.path
    return urlunsplit((base.scheme, base.netloc, path, parts.query, ""))


def archives(config: CocoConfig) -> list[Archive]:
    """The split's archives with `base_url` applied and md5s overridden by `checksums`.

    An archive named in `checksums` keeps its recorded size only when its md5 is not
    overridden (a different md5 means a different file); null disables the md5 check.
    """
    out = []
    for name in SPLIT_ARCHIVES[config.split]:
        archive = ARCHIVES[name]
        archive = replace(archive, url=rebase_url(archive.url, config.base_url))
        if name in config.checksums:
            archive = replace(archive, size=None, md5=config.checksums[name])
        out.append(archive)
    return out


def done_file(zip_name: str, dest: str | os.PathLike) -> Path:
    """The file `extract` writes (the zip's size) once every member of `zip_name` is on disk."""
    return Path(dest) / f".{zip_name}.done"


def extract(zip_path: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Unzip into `dest`, resumably: a done-file marks a finished archive, and members already
    on disk with the right size are skipped, so an interrupted extraction continues."""
    zip_path, dest = Path(zip_path), Path(dest)
    done = done_file(zip_path.name, dest)
    stamp = str(zip_path.stat().st_size)
    if done.is_file() and done.read_text().strip() == stamp:
        log.info("%s already extracted", zip_path.name)
        return
    with zipfile.ZipFile(zip_path) as zf:
        members = zf.infolist()
        for member in progress(members, unit="files", desc=f"unzip {zip_path.name}", leave=False):
            target = dest / member.filename
            if member.is_dir() or (target.is_file() and target.stat().st_size == member.file_size):
                continue
            zf.extract(member, dest)  # zipfile strips absolute paths and ".." components
    with atomic_path(done) as tmp:
        tmp.write_text(stamp + "\n")


def remove_extracted_zip(zip_path: str | os.PathLike, dest: str | os.PathLike) -> bool:
    """Delete a downloaded zip whose extraction into `dest` finished (its done-file holds the
    zip's size); True if it was deleted. COCO's zips are ~38 GB next to their extracted copy."""
    zip_path = Path(zip_path)
    done = done_file(zip_path.name, dest)
    if not (zip_path.is_file() and done.is_file()):
        return False
    if done.read_text().strip() != str(zip_path.stat().st_size):
        return False
    zip_path.unlink()
    log.info("removed %s (extracted into %s)", zip_path, dest)
    return True


def remove_extracted_zips(download_dir: str | os.PathLike) -> list[Path]:
    """`remove_extracted_zip` for every zip in `download_dir`/zips (`make cleanup`)."""
    root = Path(download_dir)
    return [z for z in sorted((root / "zips").glob("*.zip")) if remove_extracted_zip(z, root)]


def fetch(config: CocoConfig) -> Path:
    """Return a data root holding the split's files: `root` as is, or `download_dir` after
    downloading (resumable, verified) and extracting the split's archives; with `keep_zips`
    false each zip is deleted once extracted, and an archive whose zip is gone but whose
    done-file is there counts as extracted."""
    if config.root:
        root = Path(config.root)
        check_root(root, config.split)
        return root
    root = Path(config.download_dir)
    for archive in archives(config):
        zip_path = root / "zips" / archive.name
        if not zip_path.exists() and done_file(archive.name, root).is_file():
            log.info("%s was extracted and its zip removed; not downloading it again", archive.name)
            continue
        zip_path = download(
            archive.url,
            root / "zips" / archive.name,
            size=archive.size,
            md5=archive.md5,
            retries=config.retries,
            backoff=config.backoff,
            timeout=config.timeout,
        )
        extract(zip_path, root)
        if not config.keep_zips:
            remove_extracted_zip(zip_path, root)
    check_root(root, config.split)
    return root


# ---------------------------------------------------------------------------------------------
# what fetch will write (the preflight's disk estimate)


@dataclass(frozen=True)
class ArchivePlan:
    """One archive of the split as `fetch` finds it: its zip's bytes and where that number
    comes from, the bytes still to download and whether it is still to be extracted."""

    name: str
    size: int | None  # None: no record, no file and no answer from the server
    source: str  # "recorded", "server", "on disk", "extracted" (its done-file) or "unknown"
    to_download: int
    to_extract: bool


def plan_archive(archive: Archive, root: Path, timeout: float = 5) -> ArchivePlan:
    """`archive` under download folder `root`: done (as `fetch` and `extract` judge it), on
    disk, part-downloaded or not there (then its size is the recorded one, else a HEAD's)."""
    zip_path, done = root / "zips" / archive.name, done_file(archive.name, root)
    stamp = done.read_text().strip() if done.is_file() else ""
    on_disk = zip_path.stat().st_size if zip_path.is_file() else None
    if stamp.isdigit() and on_disk in (None, int(stamp)):
        return ArchivePlan(archive.name, int(stamp), "extracted", 0, False)
    if on_disk is not None:
        return ArchivePlan(archive.name, on_disk, "on disk", 0, True)
    size, source = archive.size, "recorded"
    if size is None:
        size, source = remote_size(archive.url, timeout), "server"
    if size is None:
        return ArchivePlan(archive.name, None, "unknown", 0, True)
    part = zip_path.with_name(archive.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    return ArchivePlan(archive.name, size, source, max(size - have, 0), True)


def plan_fetch(config: CocoConfig) -> list[ArchivePlan]:
    """What `fetch` will download and extract for `config` (nothing with a `root`)."""
    if config.root:
        return []
    root = Path(config.download_dir)
    return [plan_archive(a, root, min(config.timeout, 5)) for a in archives(config)]


def planned_images(config: CocoConfig, plans: list[ArchivePlan]) -> int:
    """About how many images the data stage will keep: those in `root`'s image folders, else
    COCO's count scaled by the image archives' bytes against COCO's (a mirror or a partial
    copy whose JPEGs are COCO-sized); at least 1."""
    folders = [n for n in REQUIRED[config.split] if "." not in n]  # train2017, val2017, ...
    if config.root:
        return max(1, sum(_files_in(Path(config.root) / f) for f in folders))
    zips = {f"{f}.zip" for f in folders}
    got = sum(p.size or 0 for p in plans if p.name in zips)
    coco = sum(ARCHIVES[name].size for name in zips)
    return max(1, min(COCO_IMAGES, round(COCO_IMAGES * got / coco)))


def _files_in(folder: Path) -> int:
    if not folder.is_dir():
        return 0  # fetch's check_root names what the root lacks
    with os.scandir(folder) as entries:
        return sum(1 for _ in entries)


def find_karpathy_json(root: Path) -> Path | None:
    return next((root / p for p in KARPATHY_JSON if (root / p).is_file()), None)


def check_root(root: Path, split: str) -> None:
    """Raise a DistinctcapError listing what a local COCO copy lacks for `split`."""
    missing = []
    for need in REQUIRED[split]:
        present = find_karpathy_json(root) if need == "dataset_coco.json" else (root / need)
        if not present or not present.exists():
            missing.append(need)
    if missing:
        raise DistinctcapError(
            f"COCO root {root} lacks {', '.join(missing)} needed by split {split!r} "
            f"(expected layout: {', '.join(REQUIRED[split])}, relative to the root); "
            "fix data.coco.root, or leave it unset to download"
        )


# ---------------------------------------------------------------------------------------------
# captions and splits


def read_karpathy(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Images (image_id = cocoid, file = filepath/filename) and captions (caption_id = sentid,
    the COCO annotation id) from dataset_coco.json; restval joins train."""
    return read_karpathy_file(find_karpathy_json(root), root)


def read_mrnn(root: Path, val_images: int = 4000) -> tuple[pd.DataFrame, pd.DataFrame]:
    """COCO 2017 train -> train; val2017 sorted by image id: first `val_images` -> val, the
    rest -> test (UNKT §4.1's 4K / 1K)."""
    frames = [_read_coco_annotations(root, part) for part in ("train2017", "val2017")]
    images = pd.concat([frames[0][0], frames[1][0]], ignore_index=True)
    val_ids = sorted(set(frames[1][0].image_id))
    if val_images >= len(val_ids):
        raise DistinctcapError(
            f"data.coco.mrnn_val_images = {val_images} leaves no test images: val2017 has "
            f"{len(val_ids)}; choose fewer"
        )
    test_ids = set(val_ids[val_images:])
    images["split"] = [
        "train" if f.startswith("train2017/") else ("test" if i in test_ids else "val")
        for i, f in zip(images.image_id, images.file, strict=True)
    ]
    captions = pd.concat([frames[0][1], frames[1][1]], ignore_index=True)
    split_of = images.drop_duplicates("image_id").set_index("image_id").split
    captions.insert(2, "split", captions.image_id.map(split_of).fillna("unknown"))
    return images[["image_id", "file", "split", "width", "height"]], captions


def _read_coco_annotations(root: Path, part: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    data = load_json(root / "annotations" / f"captions_{part}.json")
    images = pd.DataFrame(
        [
            (i["id"], f"{part}/{i['file_name']}", i.get("width", 0), i.get("height", 0))
            for i in data["images"]
        ],
        columns=["image_id", "file", "width", "height"],
    )
    captions = pd.DataFrame(
        [(a["id"], a["image_id"], raw_text(a["caption"])) for a in data["annotations"]],
        columns=["caption_id", "image_id", "text"],
    )
    return images, captions


def read_tables(
    root: str | os.PathLike,
    split: str = "karpathy",
    max_words: int = 20,
    mrnn_val_images: int = 4000,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Unchecked (images, captions) of a prepared root, captions normalised."""
    root = Path(root)
    check_root(root, split)
    if split == "karpathy":
        images, captions = read_karpathy(root)
    else:
        images, captions = read_mrnn(root, mrnn_val_images)
    return images, normalize_texts(captions, max_words)


def build_tables(
    root: str | os.PathLike,
    split: str = "karpathy",
    max_words: int = 20,
    on_bad_input: str = "skip",
    mrnn_val_images: int = 4000,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(images, captions, quarantine) of a prepared root, bad items handled per `on_bad_input`.

    images: image_id, file (relative to `root`), split, width, height; captions: caption_id,
    image_id, split, text (normalised). The tokenizer adds `tokens` later.
    """
    images, captions = read_tables(root, split, max_words, mrnn_val_images)
    return check_tables(images, captions, root, on_bad_input)


def prepare_tables(cfg: dict | CocoConfig) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    """The data stage's COCO source: fetch per `cfg` (the ``data.coco`` block), then return
    unchecked (images, captions, root); the caller runs quality.check_tables."""
    config = cfg if isinstance(cfg, CocoConfig) else CocoConfig.from_dict(cfg)
    root = fetch(config)
    images, captions = read_tables(root, config.split, config.max_words, config.mrnn_val_images)
    return images, captions, root
