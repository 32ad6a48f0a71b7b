"""Loading CLIP from a tag / file / local-dir, the tiny architecture, preprocessing, recall."""

import json
import time

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from distinctcap.clip import (
    byte_transform,
    load_clip,
    lr_at,
    normalize,
    resolve_device,
    retrieval_recall,
    save_weights,
)
from distinctcap.errors import DistinctcapError

ARCH = "shapes-vit-tiny"


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    torch.manual_seed(0)
    model = open_clip.create_model(ARCH)
    path = tmp_path_factory.mktemp("clip") / "tiny.pt"
    save_weights(model, path)
    return model, path


def test_tiny_arch_is_registered_with_an_8x8_grid(weights):
    model, _ = weights
    assert ARCH in open_clip.list_models()
    model.visual.output_tokens = True
    pooled, tokens = model.visual(torch.zeros(2, 3, 64, 64))
    assert tokens.shape[:2] == (2, 64) and pooled.shape == (2, model.text_projection.shape[1])
    assert model.vocab_size == 49408  # CLIP BPE ids: captioner tokens map onto them


def test_saved_weights_load_through_open_clip_and_load_clip(weights, tmp_path):
    model, path = weights
    loaded, _, _ = open_clip.create_model_and_transforms(ARCH, pretrained=str(path))
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0)
    clip = load_clip(ARCH, str(path))
    assert clip.weight_files == (str(path),) and not clip.model.training
    assert clip.logit_scale == pytest.approx(float(model.logit_scale.detach().exp()))

    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(
        json.dumps(
            {"model_cfg": open_clip.get_model_config(ARCH), "preprocess_cfg": clip.preprocess_cfg()}
        )
    )
    (folder / "open_clip_pytorch_model.bin").write_bytes(path.read_bytes())
    from_dir = load_clip(ARCH, f"local-dir:{folder}")
    torch.testing.assert_close(from_dir.model.logit_scale, model.logit_scale)
    assert len(from_dir.weight_files) == 2


def test_known_tag_without_network_fails_at_once_naming_the_fix():
    start = time.perf_counter()
    with pytest.raises(DistinctcapError, match="local file") as error:
        load_clip("ViT-B-32", "openai")  # HF_HUB_OFFLINE=1 (conftest)
    assert time.perf_counter() - start < 5
    assert "HF_HUB_OFFLINE" in str(error.value) and "clip.pretrained" in str(error.value)


def test_unknown_tag_or_arch_lists_what_exists(tmp_path):
    with pytest.raises(DistinctcapError, match="tags: .*openai"):
        load_clip("ViT-B-32", "no-such-tag")
    with pytest.raises(DistinctcapError, match="shapes-vit-tiny"):
        load_clip("no-such-arch", "openai")
    with pytest.raises(DistinctcapError, match="open_clip_config.json"):
        load_clip(ARCH, f"local-dir:{tmp_path}")


def test_byte_transform_then_normalize_equals_open_clip_preprocess(weights):
    _, path = weights
    clip = load_clip(ARCH, str(path))
    pixels = np.random.default_rng(0).integers(0, 256, (80, 70, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    to_bytes, mean, std = byte_transform(clip.preprocess)
    raw = to_bytes(image)
    assert raw.dtype == torch.uint8 and raw.shape == (3, 64, 64)
    torch.testing.assert_close(normalize(raw[None], mean, std)[0], clip.preprocess(image))


def test_retrieval_recall_by_hand():
    images = torch.eye(3)
    # captions of images 0, 0, 1, 2; caption 3 points at image 1 instead of its own image 2
    texts = torch.tensor([[1.0, 0, 0], [0.9, 0.1, 0], [0, 1.0, 0], [0, 0.8, 0.2]])
    r = retrieval_recall(images, np.array([0, 1, 2]), texts, np.array([0, 0, 1, 2]), ks=(1, 2))
    assert r["text_to_image_R@1"] == pytest.approx(3 / 4)
    assert r["text_to_image_R@2"] == pytest.approx(1.0)
    # nearest caption of image 2 is caption 3 (its own): all three images hit
    assert r["image_to_text_R@1"] == pytest.approx(1.0)
    assert r["chance_R@1"] == pytest.approx(1 / 3)


def test_lr_schedule_and_device():
    assert lr_at(0, 100, 10, 1.0) == pytest.approx(0.1)
    assert lr_at(10, 100, 10, 1.0) == pytest.approx(1.0)
    assert lr_at(100, 100, 10, 1.0) == pytest.approx(0.0)
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(DistinctcapError, match="no GPU"):
            resolve_device("cuda")
