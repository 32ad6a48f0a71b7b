"""clip.features.decode tensor (distinctcap.features.decode): the pixels open_clip's own
transform gives, within 3/255, on JPEGs of varied sizes; odd files (grayscale, CMYK, PNG, a
truncated JPEG) take PIL's path; the choice is part of the features fingerprint and the CPU's
default stays PIL's (the shapes default's numbers)."""

import dataclasses

import numpy as np
import open_clip
import pandas as pd
import pytest
import torch
from open_clip.transform import image_transform
from PIL import Image

from distinctcap.clip.load import byte_transform, load_clip
from distinctcap.core.errors import DistinctcapError
from distinctcap.features.decode import ImageBytes, device_batches, resolve_decode, tensor_steps
from distinctcap.features.extract import FeatureSettings, ImageFiles, extract_features
from distinctcap.features.read import load_image_features
from distinctcap.train.clip import save_weights

CPU = torch.device("cpu")
SIZES = [(640, 480), (480, 640), (500, 333), (1000, 200), (100, 80), (224, 224)]  # (W, H)


def photo(width: int, height: int, seed: int) -> Image.Image:
    """Smooth colour fields plus grain: JPEG-typical content."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 16 + 2, width // 16 + 2, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))
    grain = rng.integers(-20, 21, (height, width, 3))
    return Image.fromarray((smooth + grain).clip(0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """RGB JPEGs of varied sizes (one progressive), then the odd files."""
    root = tmp_path_factory.mktemp("jpegs")
    out = []
    for i, (w, h) in enumerate(SIZES):
        photo(w, h, i).save(root / f"rgb{i}.jpg", quality=90, progressive=i == 1)
        out.append(str(root / f"rgb{i}.jpg"))
    photo(640, 480, 10).convert("L").save(root / "gray.jpg")
    photo(480, 640, 11).convert("CMYK").save(root / "cmyk.jpg")
    photo(300, 200, 12).save(root / "image.png")
    return out + [str(root / n) for n in ("gray.jpg", "cmyk.jpg", "image.png")]


def both_paths(files, transform):
    to_bytes = byte_transform(transform)[0]
    pil = ImageFiles(files, to_bytes, 224)
    items = [ImageBytes(files, pil)[i] for i in range(len(files))]
    batch = next(device_batches([items], tensor_steps(to_bytes), pil, CPU))
    return torch.stack([pil[i] for i in range(len(files))]), batch, [jpeg for _, jpeg, _ in items]


@pytest.mark.parametrize(
    "mode, interpolation", [("shortest", "bicubic"), ("squash", "bilinear")]
)
def test_tensor_pixels_are_open_clips_within_3_levels(files, mode, interpolation):
    """open_clip's eval transform (ViT-B-32's: shortest side, bicubic; a tag's squash/bilinear)
    on PIL vs the same steps on decoded uint8 tensors: the resampling rounds differently (PIL
    keeps uint8 between its two passes), so pixels differ by at most 3 levels, 0.25 on average;
    an image already at the size, and every odd file, is PIL's exactly."""
    transform = image_transform(224, False, resize_mode=mode, interpolation=interpolation)
    want, got, jpeg = both_paths(files, transform)
    assert jpeg == [True] * len(SIZES) + [False] * 3
    diff = (want.int() - got.int()).abs()
    assert diff.amax().item() <= 3 and diff.float().mean().item() < 0.25
    assert torch.equal(want[len(SIZES) - 1 :], got[len(SIZES) - 1 :])  # 224 px, then odd files


def test_a_truncated_jpeg_is_named_by_the_pil_path(files, tmp_path):
    """Without its end marker a JPEG goes PIL's way (nvjpeg may decode it silently), which
    names it as a file broken after the data stage (data.quality.decoding)."""
    whole = open(files[0], "rb").read()
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(whole[: len(whole) * 3 // 4])
    pil = ImageFiles([str(cut)], byte_transform(image_transform(224, False))[0], 224)
    with pytest.raises(DistinctcapError, match=f"^image {cut} is unreadable .*prepare_data"):
        ImageBytes([str(cut)], pil)[0]


def test_a_transform_without_a_tensor_form_stays_on_pil():
    longest = byte_transform(image_transform(224, False, resize_mode="longest"))[0]
    shortest = byte_transform(image_transform(224, False))[0]
    assert resolve_decode("auto", torch.device("cuda"), longest) == "pil"
    assert resolve_decode("auto", torch.device("cuda"), shortest) == "tensor"
    assert resolve_decode("auto", CPU, shortest) == "pil"  # the CPU's features stay PIL's
    with pytest.raises(DistinctcapError, match="^clip.features.decode = tensor: .* use pil$"):
        resolve_decode("tensor", CPU, longest)
    with pytest.raises(DistinctcapError, match="^clip.features.decode = 'gpu'"):
        resolve_decode("gpu", CPU, shortest)


def test_the_decoder_is_part_of_the_fingerprint(files, tmp_path):
    """Default settings on the CPU record no decoder (the shapes default's fingerprint and
    shards are those from before the key existed); tensor has its own fingerprint (its shards'
    keys differ, so it recomputes them), and its features are PIL's within cosine 0.9999 (the
    tiny ResNet CLIP at 64 px, random weights)."""
    images = pd.DataFrame({"image_id": range(len(files)), "file": files})
    captions = pd.DataFrame({"caption_id": [0], "image_id": [0], "text": ["a photo"]})
    torch.manual_seed(0)
    save_weights(open_clip.create_model("shapes-rn-tiny"), tmp_path / "clip.pt")
    clip = load_clip("shapes-rn-tiny", str(tmp_path / "clip.pt"))
    settings = FeatureSettings(batch_size=5, workers=0, image_shard_size=10)
    out = {}
    for decode in ("auto", "tensor"):
        chosen = dataclasses.replace(settings, decode=decode)
        index = tmp_path / decode / "index.json"
        out[decode] = extract_features(images, captions, clip, index, index.parent, chosen)
    assert "decode" not in out["auto"]["manifest"]
    assert out["tensor"]["manifest"]["decode"] == "tensor"
    assert out["tensor"]["fingerprint"] != out["auto"]["fingerprint"]
    pil = load_image_features(tmp_path / "auto/index.json", grid=False)[1]
    tensor = load_image_features(tmp_path / "tensor/index.json", grid=False)[1]
    assert (pil * tensor).sum(axis=1).min() > 0.9999
