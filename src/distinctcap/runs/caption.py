"""Caption your own images with a trained run: `distinctcap caption` and `load_run`.

    from distinctcap import load_run
    run = load_run("results/runs/smile")
    run.caption(["img.jpg", "my_folder/"])   # [{"file", "caption", "mean_logprob", "outside", ...}]
    run.caption(pil_image)                   # PIL images too, alone or in a list

A captioned file that is an image of the run's experiment (`results/data/images.parquet`
beside `results/runs/`, its `file` relative to the experiment folder) also gets its `image_id`
and `split`, so `distinctcap caption --out` writes what `distinctcap evaluate` scores.

Each caption comes with how sure it is: `mean_logprob`, the captioner's mean token
log-probability, and `outside`, whether the image is far from the run's training images (its
CLIP features' `distance` above the card's calibrated `threshold`, distinctcap.runs.calibrate;
None when the card predates calibration: "not calibrated").

A run folder holds model.pt, its vocabulary and its card (distinctcap.core.runcard), which names the
CLIP the run was trained on. The images go through that CLIP as in feature extraction
(distinctcap.features.extract: the CLIP's resize/crop, its normalisation, `pooled_and_grid`, the
pooled embedding L2-normalised, the grid stored as float16), then through the run's search
(distinctcap.captioner.search) under a decoding setting of the run's config (`greedy`, `beam3`,
...). A
file that is missing, empty or not an image is reported with its reason; the others are
still captioned.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

from distinctcap.captioner.load import load_captioner
from distinctcap.captioner.model import Captioner
from distinctcap.captioner.search import generate
from distinctcap.clip.load import byte_transform, load_clip, normalize
from distinctcap.clip.weights import LOCAL_DIR, resolve_weights
from distinctcap.core.devices import resolve_device
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, file_sha256, read_table
from distinctcap.core.logs import progress
from distinctcap.core.runcard import read_run_card, resolve_clip, verified_model
from distinctcap.data.quality import image_problem
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.evaluate.decode import decode_options
from distinctcap.features.extract import compute_dtype, pooled_and_grid
from distinctcap.runs.calibrate import feature_distance

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
BUILTIN_DECODING = {"greedy": {"kind": "greedy"}, "beam3": {"kind": "beam", "k": 3}}


ImageInput = str | os.PathLike | Image.Image
NOT_CALIBRATED = "not calibrated"


def image_files(inputs: Iterable[ImageInput]) -> list[Path | Image.Image]:
    """Files named, the image files (by suffix) under folders named, in sorted order, and PIL
    images as they are; anything else is one DistinctcapError naming its type."""
    files = []
    for item in inputs:
        if isinstance(item, Image.Image):
            files.append(item)
        elif not isinstance(item, str | os.PathLike):
            raise DistinctcapError(
                f"cannot caption a {type(item).__name__}: give image files, folders or PIL "
                "images (one, or a list of them)"
            )
        elif Path(item).is_dir():
            files += sorted(
                p for p in Path(item).rglob("*")
                if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
            )
        else:
            files.append(Path(item))  # a missing or broken file is reported by `Run.caption`
    return files


def file_problem(item: Path | Image.Image) -> str | None:
    """Why `item` cannot be captioned, or None (data.quality.image_problem, plus empty files)."""
    if isinstance(item, Image.Image):
        return None
    if item.is_file() and item.stat().st_size == 0:
        return "empty file (0 bytes)"
    return image_problem(item)


def label(item: Path | Image.Image, position: int) -> str:
    """The `file` of a result: the path as given, or "<PIL image k>", k its result's index."""
    return str(item) if isinstance(item, Path) else f"<PIL image {position}>"


class Run:
    """A trained run, ready to caption images (module docstring). `clip` points at a copy of
    the run's CLIP when it has moved (its checksum must match)."""

    def __init__(
        self, run_dir: str | os.PathLike, clip: str | None = None, device: str = "auto"
    ):
        self.dir = Path(run_dir)
        self.card = read_run_card(self.dir)
        self.name = self.card["name"]
        self.device = resolve_device(device)
        vocab = self.dir / self.card["vocab"]
        if not vocab.is_file():
            raise DistinctcapError(
                f"{vocab} is missing: copy the whole run folder again, or write it with "
                "`snakemake --forcerun run_card`"
            )
        self.model = load_captioner(verified_model(self.card, self.dir), self.device).eval()
        if not isinstance(self.model, Captioner):  # it reads its own vision states, not CLIP's
            raise DistinctcapError(
                f"run {self.name} is a transformers captioner: caption with its folder "
                f"{self.dir / 'hf'} and transformers' pipeline('image-text-to-text') "
                "(docs/coco-and-pretrained.md)"
            )
        self.clip = load_run_clip(self.card, self.dir, clip, self.device)
        self.tokenizer = CaptionTokenizer.load(vocab)
        self.to_bytes, self.mean, self.std = byte_transform(self.clip.preprocess)
        self._data_images: dict[Path, dict] | None = None

    @property
    def data_images(self) -> dict[Path, dict]:
        """Resolved file -> {image_id, split} of the experiment's images (read once)."""
        if self._data_images is None:
            self._data_images = experiment_images(self.dir)
        return self._data_images

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r}, method={self.card['method']!r})"

    def decoding(self, setting: str | dict) -> dict:
        """A decoding setting: a dict as in the config's `decoding:`, or the name of one in the
        run's config (or `greedy`, `beam3`)."""
        if isinstance(setting, dict):
            return setting
        known = {**BUILTIN_DECODING, **self.card.get("decoding", {})}
        if setting not in known:
            raise DistinctcapError(
                f"decoding {setting!r} is not a setting of run {self.name}; choose one of "
                f"{', '.join(sorted(known))}"
            )
        return known[setting]

    @torch.inference_mode()
    def features(self, files: Sequence[Path | Image.Image], batch_size: int = 64):
        """(pooled (N, D) float32 L2-normalised, grid (N, G, Dv) float16) of readable images,
        as feature extraction computes them."""
        dtype = compute_dtype("auto", self.device)
        amp = torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32)
        pooled, grid = [], []
        bar = progress(
            total=len(files), desc="CLIP features", unit="images", disable=len(files) < 2
        )
        with bar, amp:
            for start in range(0, len(files), batch_size):
                chunk = files[start : start + batch_size]
                batch = torch.stack([self._image_bytes(f) for f in chunk]).to(self.device)
                x = normalize(batch, self.mean, self.std)
                p, g = pooled_and_grid(self.clip.model.visual, x)
                pooled.append(F.normalize(p.float(), dim=-1))
                grid.append(g.to(torch.float16))
                bar.update(len(chunk))
        return torch.cat(pooled), torch.cat(grid)

    def _image_bytes(self, item: Path | Image.Image) -> torch.Tensor:
        if isinstance(item, Image.Image):
            return self.to_bytes(item)
        with Image.open(item) as image:
            return self.to_bytes(image)

    @property
    def threshold(self) -> float | None:
        """The distance beyond which an image is outside the training images (None: the card
        predates calibration)."""
        return self.card.get("familiarity", {}).get("threshold")

    def caption(
        self,
        images: ImageInput | Iterable[ImageInput],
        decoding: str | dict = "greedy",
        seed: int = 0,
    ) -> list[dict]:
        """One dict per input, in order: {file, caption, logprob, mean_logprob, distance,
        outside} (plus `samples` when the setting samples several), or {file, error} for a file
        that cannot be read (module docstring)."""
        if isinstance(images, str | os.PathLike | Image.Image | bytes) or not isinstance(
            images, Iterable
        ):
            images = [images]  # one image; image_files names a wrong type
        images = list(images)
        files = image_files(images)
        if not files:
            raise DistinctcapError(f"no image files in {[str(i) for i in images]}")
        setting = self.decoding(decoding)
        problems = [file_problem(f) for f in files]
        good = [k for k, problem in enumerate(problems) if problem is None]
        captions, distances = {}, {}
        if good:
            pooled, grid = self.features([files[k] for k in good])
            found = generate(
                self.model, grid, pooled, setting["kind"],
                batch_size=setting.get("batch_size", 64),
                **decode_options(setting, self.device, seed),
            )
            captions = dict(zip(good, found, strict=True))
            distances = dict(zip(good, self.distances(grid), strict=True))
        return [
            self._result(label(f, k), captions.get(k), distances.get(k), problems[k])
            | self.image_of(f)
            for k, f in enumerate(files)
        ]

    def image_of(self, item: Path | Image.Image) -> dict:
        """{image_id, split} of a file that is one of the experiment's images, else {}."""
        if isinstance(item, Image.Image):
            return {}
        return self.data_images.get(item.resolve(), {}) if self.data_images else {}

    def distances(self, grid: torch.Tensor) -> list[float | None]:
        """Each image's distance from the training images (distinctcap.runs.calibrate)."""
        familiarity = self.card.get("familiarity")
        if familiarity is None:
            return [None] * len(grid)
        return feature_distance(grid.cpu(), familiarity).tolist()

    def mean_logprob(self, caption) -> float:
        """The caption's log-probability per scored token (its tokens and the eos, which a
        caption cut at max_len has not)."""
        scored = len(caption.tokens) + (len(caption.tokens) < self.model.cfg.max_len)
        return caption.logprob / max(scored, 1)

    def _result(self, file: str, found, distance: float | None, problem: str | None) -> dict:
        if problem is not None:
            return {"file": file, "error": problem}
        texts = [self.tokenizer.decode(c.tokens) for c in found]
        threshold = self.threshold
        out = {
            "file": file,
            "caption": texts[0],
            "logprob": round(found[0].logprob, 4),
            "mean_logprob": round(self.mean_logprob(found[0]), 4),
            "distance": None if distance is None else round(distance, 4),
            "outside": None if threshold is None or distance is None else distance > threshold,
        }
        return out | ({"samples": texts} if len(texts) > 1 else {})


def experiment_images(run_dir: Path) -> dict[Path, dict]:
    """Resolved file -> {image_id, split} of every image of the experiment that trained the
    run (results/runs/<run> -> results/data/images.parquet, whose files are relative to the
    experiment folder above results/); {} for a run folder copied without its data."""
    results = run_dir.resolve().parent.parent
    table = results / "data" / "images.parquet"
    if not table.is_file():
        return {}
    images = read_table(table, "images")
    experiment = results.parent
    return {
        (experiment / file).resolve(): {"image_id": int(image_id), "split": split}
        for file, image_id, split in zip(images.file, images.image_id, images.split, strict=True)
    }


def load_run_clip(card: dict, run_dir: Path, clip: str | None, device: torch.device):
    """The CLIP the run was trained on, its files checked against the card's checksum before
    they are deserialised (after the download, for a tag not yet in the cache); a
    DistinctcapError names it when it is missing or different."""
    info = card["clip"]
    pretrained, where = resolve_clip(info, run_dir)
    if clip:
        pretrained, where = clip, Path(clip.removeprefix(LOCAL_DIR))
    if where is not None and not where.exists():
        raise DistinctcapError(
            f"run {card['name']} was trained on the CLIP {info['arch']} at {where}, which is "
            f"missing; {_POINT_AT_A_COPY} (sha256 {info['weights_sha256'][:16]}...)"
        )
    files = resolve_weights(info["arch"], pretrained, info.get("tag")).files
    if files:
        _check_clip(card, file_sha256(files), where or pretrained)
    loaded = load_clip(info["arch"], pretrained, device, info.get("tag"))
    if not files:
        _check_clip(card, file_sha256(loaded.weight_files), where or pretrained)
    return loaded


_POINT_AT_A_COPY = "point at a copy with --clip PATH (load_run(..., clip=PATH))"


def _check_clip(card: dict, found: str, where: object) -> None:
    expected = card["clip"]["weights_sha256"]
    if found != expected:
        raise DistinctcapError(
            f"run {card['name']} was trained on the CLIP {card['clip']['arch']} with weights "
            f"sha256 {expected[:16]}..., but {where} has {found[:16]}...: another CLIP's "
            f"features would give meaningless captions; {_POINT_AT_A_COPY}"
        )


def write_jsonl(results: list[dict], path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in results))


def confidence(result: dict) -> str:
    """How sure a caption is, in words: its mean token log-probability and whether the image
    is far from the training images ("not calibrated" for a card without a threshold)."""
    if result["outside"] is None:
        where = NOT_CALIBRATED
    elif result["outside"]:
        where = f"FAR FROM THE TRAINING IMAGES (distance {result['distance']:.2f})"
    else:
        where = f"like the training images (distance {result['distance']:.2f})"
    return f"mean token logprob {result['mean_logprob']:.2f}, {where}"


def shown_name(file: str) -> str:
    """A file as the page shows it: relative to the current folder when under it."""
    path = Path(file)
    if not path.is_absolute():
        return file
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(Path(path.parent.name) / path.name)


HTML_STYLE = (
    "body{font-family:sans-serif;display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}"
    "h1{width:100%}figure{width:260px;margin:0;overflow-wrap:anywhere}"
    "img,.broken{width:256px;height:256px;object-fit:contain;image-rendering:pixelated}"
    ".broken{display:flex;align-items:center;justify-content:center;background:#eee;"
    "color:#a00;text-align:center}.name{font-size:small;color:#555}"
    ".outside{color:#a00;font-weight:bold}.sure{font-size:small;color:#555}"
)


THUMBNAIL = 256  # pixels, the longer side of a picture on the page


def thumbnail_uri(path: Path, size: int = THUMBNAIL) -> str:
    """The image as a small JPEG in a data URI, so the page needs no other file."""
    with Image.open(path) as image:
        image = image.convert("RGB")
        image.thumbnail((size, size))
        out = io.BytesIO()
        image.save(out, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def html_card(result: dict) -> str:
    """One figure: the picture (or the reason it could not be read), the file's name, the
    caption and how sure it is."""
    name = html.escape(shown_name(result["file"]))
    if "error" in result:
        reason = html.escape(result["error"].replace(result["file"], shown_name(result["file"])))
        return (
            f"<figure><div class='broken'>not captioned:<br>{reason}</div>"
            f"<figcaption><div class='name'>{name}</div></figcaption></figure>"
        )
    picture = ""
    if not result["file"].startswith("<"):
        picture = f'<img src="{thumbnail_uri(Path(result["file"]))}" alt="{name}">'
    sure = "outside" if result["outside"] else "sure"
    return (
        f"<figure>{picture}<figcaption><div class='name'>{name}</div>"
        f"{html.escape(result['caption'])}<div class='{sure}'>"
        f"{html.escape(confidence(result))}</div></figcaption></figure>"
    )


def write_html(results: list[dict], path: str | os.PathLike, title: str) -> None:
    """A self-contained page of cards, one per image (its picture as an embedded thumbnail,
    its name, caption and confidence, or the reason it was not captioned): it can be moved
    or sent on its own."""
    page = (
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{HTML_STYLE}</style><h1>{html.escape(title)}</h1>"
        + "\n".join(html_card(r) for r in results)
    )
    with atomic_path(path) as tmp:
        tmp.write_text(page)
