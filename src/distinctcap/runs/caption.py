"""Caption your own images with a trained run: `distinctcap caption` and `load_run`.

    from distinctcap import load_run
    run = load_run("results/runs/smile")
    run.caption(["img.jpg", "my_folder/"])   # [{"file", "caption", "logprob"} or {"file", "error"}]

A run folder holds model.pt, its vocabulary and its card (distinctcap.runs.runcard), which names the
CLIP the run was trained on. The images go through that CLIP as in feature extraction
(distinctcap.features.extract: the CLIP's resize/crop, its normalisation, `pooled_and_grid`, the
pooled embedding L2-normalised, the grid stored as float16), then through the run's search
(distinctcap.captioner.search) under a decoding setting of the run's config (`greedy`, `beam3`,
...). A
file that is missing, empty or not an image is reported with its reason; the others are
still captioned.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
from tqdm import tqdm

from distinctcap.captioner.load import load_captioner
from distinctcap.captioner.model import Captioner
from distinctcap.captioner.search import generate
from distinctcap.clip.load import byte_transform, load_clip, normalize
from distinctcap.clip.weights import LOCAL_DIR, resolve_weights
from distinctcap.core.devices import resolve_device
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, file_sha256
from distinctcap.data.quality import image_problem
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.evaluate.decode import decode_options
from distinctcap.features.extract import compute_dtype, pooled_and_grid
from distinctcap.runs.runcard import read_run_card, resolve_clip, verified_model

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
BUILTIN_DECODING = {"greedy": {"kind": "greedy"}, "beam3": {"kind": "beam", "k": 3}}


def image_files(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Files named, and the image files (by suffix) under folders named, in sorted order."""
    files = []
    for item in map(Path, inputs):
        if item.is_dir():
            files += sorted(
                p for p in item.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
            )
        else:
            files.append(item)  # a missing or broken file is reported by `Run.caption`
    return files


def file_problem(path: Path) -> str | None:
    """Why `path` cannot be captioned, or None (data.quality.image_problem, plus empty files)."""
    if path.is_file() and path.stat().st_size == 0:
        return "empty file (0 bytes)"
    return image_problem(path)


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
    def features(self, files: Sequence[Path], batch_size: int = 64):
        """(pooled (N, D) float32 L2-normalised, grid (N, G, Dv) float16) of readable images,
        as feature extraction computes them."""
        dtype = compute_dtype("auto", self.device)
        amp = torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32)
        pooled, grid = [], []
        bar = tqdm(total=len(files), desc="CLIP features", unit="images", disable=len(files) < 2)
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

    def _image_bytes(self, path: Path) -> torch.Tensor:
        with Image.open(path) as image:
            return self.to_bytes(image)

    def caption(
        self,
        images: str | os.PathLike | Iterable[str | os.PathLike],
        decoding: str | dict = "greedy",
        seed: int = 0,
    ) -> list[dict]:
        """One dict per file, in order: {file, caption, logprob} (plus `samples` when the
        setting samples several), or {file, error} for a file that cannot be read."""
        if isinstance(images, str | os.PathLike):
            images = [images]
        files = image_files(images)
        if not files:
            raise DistinctcapError(f"no image files in {[str(i) for i in images]}")
        setting = self.decoding(decoding)
        problems = {f: file_problem(f) for f in files}
        good = [f for f in files if problems[f] is None]
        captions = {}
        if good:
            pooled, grid = self.features(good)
            found = generate(
                self.model, grid, pooled, setting["kind"],
                batch_size=setting.get("batch_size", 64),
                **decode_options(setting, self.device, seed),
            )
            captions = dict(zip(good, found, strict=True))
        return [self._result(f, captions.get(f), problems[f]) for f in files]

    def _result(self, file: Path, found, problem: str | None) -> dict:
        if problem is not None:
            return {"file": str(file), "error": problem}
        texts = [self.tokenizer.decode(c.tokens) for c in found]
        out = {"file": str(file), "caption": texts[0], "logprob": round(found[0].logprob, 4)}
        return out | ({"samples": texts} if len(texts) > 1 else {})


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


def write_html(results: list[dict], path: str | os.PathLike, title: str) -> None:
    """A page of cards, one per image (its picture, linked relative to the page, and caption)."""
    root = Path(path).resolve().parent
    cards = []
    for r in results:
        src = html.escape(os.path.relpath(Path(r["file"]).resolve(), root))
        text = html.escape(r.get("caption") or f"not captioned: {r['error']}")
        cards.append(
            f'<figure><img src="{src}" alt=""><figcaption><b>{html.escape(r["file"])}</b>'
            f"<br>{text}</figcaption></figure>"
        )
    page = (
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;display:flex;flex-wrap:wrap;gap:1em}"
        "figure{width:260px;margin:0}img{width:256px;image-rendering:pixelated}</style>"
        f"<h1 style='width:100%'>{html.escape(title)}</h1>" + "\n".join(cards)
    )
    with atomic_path(path) as tmp:
        tmp.write_text(page)
