"""Images for CLIP features decoded where the model runs (`clip.features.decode`).

`pil` (the CPU's default): DataLoader workers decode each file with PIL and apply open_clip's
resize/crop (distinctcap.features.extract.ImageFiles). `tensor` (auto on a GPU): workers only
read the bytes and send each batch as one tensor (Packed: one file descriptor per batch, not
per image, so a default `ulimit -n` suffices); the main process decodes the batch's JPEGs
with `torchvision.io.decode_jpeg` on the model's device (nvjpeg on CUDA, in one batched call)
and applies the same open_clip Resize/CenterCrop objects to uint8 tensors (bicubic with
antialias, as PIL's resampling).
Files PIL would see as anything but an RGB JPEG (PNG, grayscale, CMYK, ...) take the PIL path
in the worker, as does a batch nvjpeg refuses (image by image); a file neither reads stops the
stage naming it (distinctcap.data.quality.decoding). The pixels differ from PIL's by the
decoder's rounding and the resampling's (tests/test_decode.py states the bound), so the choice
is part of the features fingerprint (extract.manifest)."""

from __future__ import annotations

import io
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import torch
from open_clip.transform import CenterCropOrPad, MaybeConvertMode
from PIL import Image
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import CenterCrop, Compose, PILToTensor, Resize

from distinctcap.core.errors import DistinctcapError
from distinctcap.data.quality import decoding

log = logging.getLogger(__name__)

DECODERS = ("auto", "pil", "tensor")
TENSOR_STEPS = (Resize, CenterCrop, CenterCropOrPad)  # take uint8 (..., 3, H, W) tensors too


def tensor_steps(to_bytes: Compose) -> Compose | None:
    """The resize/crop steps of the PIL -> uint8 transform (clip.load.byte_transform) as a
    transform of uint8 tensors, or None where a step has no tensor form (e.g. open_clip's
    ResizeKeepRatio of a non-square input)."""
    steps = [s for s in to_bytes.transforms if not isinstance(s, MaybeConvertMode | PILToTensor)]
    if not all(isinstance(s, TENSOR_STEPS) for s in steps):
        return None
    return Compose(steps)


def resolve_decode(choice: str, device: torch.device, to_bytes: Compose) -> str:
    """`pil` or `tensor` for clip.features.decode (auto: tensor on CUDA where the CLIP's
    transform has a tensor form, else pil: the CPU's features stay PIL's)."""
    if choice not in DECODERS:
        raise DistinctcapError(f"clip.features.decode = {choice!r}: use one of {DECODERS}")
    if choice == "auto":
        return "tensor" if device.type == "cuda" and tensor_steps(to_bytes) else "pil"
    if choice == "tensor" and tensor_steps(to_bytes) is None:
        names = [type(s).__name__ for s in to_bytes.transforms]
        raise DistinctcapError(
            f"clip.features.decode = tensor: the CLIP's transform ({', '.join(names)}) has a "
            "step with no tensor form; use pil"
        )
    return choice


EOI = b"\xff\xd9"  # a JPEG's end-of-image marker


def why_pil(data: bytes) -> str:
    """Why the PIL path decodes a file rather than the device ("" for an RGB JPEG ending with
    its end-of-image marker): the reasons are counted and logged, since COCO has CMYK and
    grayscale JPEGs, PNGs named .jpg and cut files. Only the header is parsed here."""
    with Image.open(io.BytesIO(data)) as image:
        if image.format != "JPEG":
            return f"{image.format} file"
        if image.mode != "RGB":
            return f"{image.mode} JPEG"
    # a truncated file without its end marker goes where PIL names it (nvjpeg may not)
    return "" if data.endswith(EOI) else "JPEG without its end marker"


class Packed(NamedTuple):
    """One loader batch of ImageBytes items in a single uint8 tensor. A worker sends every
    tensor through a shared-memory file descriptor of its own (torch's default
    file_descriptor strategy), so one tensor per image ran a default `ulimit -n` out of
    descriptors (the loader hung, or stopped with "received 0 items of ancdata"); one per
    batch keeps them to the batches in flight."""

    rows: list[int]
    why_pil: list[str]  # per item: "" for JPEG bytes, else why PIL decoded it (why_pil)
    shapes: list[tuple[int, ...]]  # (bytes,) of a JPEG, (3, H, W) of PIL's pixels
    data: torch.Tensor  # every item's uint8 values, end to end


class ImageBytes(Dataset):
    """Image files -> (row, True, the file's bytes (uint8 1-D)) for an RGB JPEG that ends with
    its end-of-image marker, else (row, False, the PIL path's uint8 pixels (3, H, W)); a
    loader's batch of them comes as one Packed (`__getitems__`, the DataLoader's batch fetch)."""

    def __init__(self, files: Sequence[str], pil_path: Dataset):
        self.files, self.pil_path = list(files), pil_path

    def __len__(self) -> int:
        return len(self.files)

    def item(self, i: int) -> tuple[int, str, torch.Tensor]:
        """(row, why_pil, the JPEG's bytes or PIL's pixels)."""
        with decoding(self.files[i]), open(self.files[i], "rb") as f:
            data = f.read()
            why = why_pil(data)
        if why:
            return i, why, self.pil_path[i]
        return i, why, torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def __getitem__(self, i: int) -> tuple[int, bool, torch.Tensor]:
        row, why, values = self.item(i)
        return row, not why, values

    def __getitems__(self, rows: list[int]) -> Packed:
        items = [self.item(i) for i in rows]
        return Packed(
            [row for row, _, _ in items],
            [why for _, why, _ in items],
            [tuple(values.shape) for _, _, values in items],
            torch.cat([values.reshape(-1) for _, _, values in items]),
        )


def as_is(batch: Packed) -> Packed:
    """The DataLoader's collate for ImageBytes: its `__getitems__` already made the batch."""
    return batch


def unpacked(
    batches: Iterable[Packed], fallbacks: Counter | None = None
) -> Iterator[list[tuple[int, bool, torch.Tensor]]]:
    """ImageBytes items of each Packed batch (views of its one tensor); each reason an item
    took the PIL path is counted in `fallbacks`."""
    for batch in batches:
        if fallbacks is not None:
            fallbacks.update(why for why in batch.why_pil if why)
        parts = batch.data.split([math.prod(shape) for shape in batch.shapes])
        yield [
            (row, not why, part.view(shape))
            for row, why, shape, part in zip(
                batch.rows, batch.why_pil, batch.shapes, parts, strict=True
            )
        ]


def decode_jpegs(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """uint8 (3, H, W) of each JPEG on `device`, in one call; image by image if the batch
    fails, None for an image the decoder refuses."""
    if not data:
        return []
    try:
        return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
    except RuntimeError as error:
        log.info("batched JPEG decode failed (%s); decoding image by image", error)
    out = []
    for one in data:
        try:
            out.append(decode_jpeg(one, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            out.append(None)
    return out


def resized(images: list[torch.Tensor], steps: Compose) -> list[torch.Tensor]:
    """`steps` applied to each image, images of one size as one batch."""
    out: list[torch.Tensor | None] = [None] * len(images)
    by_shape: dict[tuple, list[int]] = {}
    for i, image in enumerate(images):
        by_shape.setdefault(tuple(image.shape), []).append(i)
    for rows in by_shape.values():
        for i, image in zip(rows, steps(torch.stack([images[i] for i in rows])), strict=True):
            out[i] = image
    return out


def device_batches(
    batches: Iterable[list[tuple[int, bool, torch.Tensor]]],
    steps: Compose,
    pil_path: Dataset,
    device: torch.device,
    fallbacks: Counter | None = None,
) -> Iterator[torch.Tensor]:
    """uint8 (B, 3, H, W) batches on `device` from ImageBytes items: JPEGs decoded and resized
    there, the rest (decoded by PIL in the worker, or here if the decoder refused: counted in
    `fallbacks`) copied."""
    for items in batches:
        jpegs = [k for k, (_, jpeg, _) in enumerate(items) if jpeg]
        decoded = decode_jpegs([items[k][2] for k in jpegs], device)
        pixels = [item[2] for item in items]
        ok = [k for k, image in zip(jpegs, decoded, strict=True) if image is not None]
        good = resized([image for image in decoded if image is not None], steps)
        for k, image in zip(ok, good, strict=True):
            pixels[k] = image
        for k, image in zip(jpegs, decoded, strict=True):
            if image is None:
                pixels[k] = pil_path[items[k][0]]
                if fallbacks is not None:
                    fallbacks["JPEG the device's decoder refused"] += 1
        yield torch.stack([p.to(device, non_blocking=True) for p in pixels])
