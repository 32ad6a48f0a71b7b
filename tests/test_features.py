"""CLIP feature extraction: contents, resumable shards, manifest invalidation, bad embeddings."""

import dataclasses
import re
import signal
import subprocess
import sys

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from distinctcap.clip.load import byte_transform, load_clip, load_images
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_json, read_table
from distinctcap.data.prepare import prepare
from distinctcap.features.extract import FeatureSettings, extract_features, grid_token_count
from distinctcap.features.read import (
    ImageFeatures,
    load_image_features,
    load_image_norms,
    load_text_features,
)
from distinctcap.features.store import check_finite
from distinctcap.train.clip import save_weights

ARCH = "shapes-vit-tiny"
SETTINGS = FeatureSettings(batch_size=8, workers=0, image_shard_size=10, text_shard_size=64)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 30-image shapes world and two random tiny CLIPs, paths relative to the world's root."""
    root = tmp_path_factory.mktemp("world")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        data = {
            "source": "shapes",
            "shapes": {"n_train": 20, "n_val": 5, "n_test": 5, "image_size": 64, "seed": 0},
        }
        outputs = {k: f"results/data/{k}.parquet" for k in ("images", "captions", "quarantine")}
        prepare(data, "skip", {**outputs, "vocab": "results/data/vocab.json"})
    for seed in (0, 1):
        torch.manual_seed(seed)
        save_weights(open_clip.create_model(ARCH), root / f"clip{seed}.pt")
    return root


@pytest.fixture
def run(world, monkeypatch):
    monkeypatch.chdir(world)
    images = read_table("results/data/images.parquet", "images")
    captions = read_table("results/data/captions.parquet", "captions")

    def extract(weights="clip0.pt", out="out", **kwargs):
        clip = load_clip(ARCH, str(world / weights))
        return extract_features(
            images,
            captions,
            clip,
            world / out / "index.json",
            world / out / "cache",
            SETTINGS,
            device=torch.device("cpu"),
            **kwargs,
        )

    return extract, images, captions


def shard_stats(folder):
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("*.parquet")}


def test_features_match_the_model_and_the_contract(run, world):
    extract, images, captions = run
    index = extract(out="contents")
    assert index["images"]["count"] == 30 and len(index["images"]["shards"]) == 3
    assert index["texts"]["count"] == 150 and len(index["texts"]["shards"]) == 3
    ids, pooled, grid = load_image_features(world / "contents/index.json")
    clip = load_clip(ARCH, str(world / "clip0.pt"))
    assert ids.dtype == np.int64 and ids.tolist() == sorted(images.image_id.tolist())
    assert pooled.dtype == np.float32 and grid.dtype == np.float16
    assert grid.shape == (30, 64, clip.model.visual.transformer.width)
    np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1, atol=1e-5)

    # the same numbers as open_clip's own transform and encode_image, image by image
    first = images.sort_values("image_id").iloc[:3]
    with torch.no_grad():
        x = torch.stack([clip.preprocess(Image.open(f)) for f in first.file])
        want = clip.model.encode_image(x, normalize=True).numpy()
        raw = clip.model.encode_image(x).numpy()
    np.testing.assert_allclose(pooled[:3], want, atol=1e-5)
    # the stored norms give back the unnormalised projection (specificity dp/cdp)
    norms = load_image_norms(world / "contents/index.json")
    np.testing.assert_allclose(pooled[:3] * norms[:3, None], raw, rtol=1e-4, atol=1e-5)
    assert load_image_features(world / "contents/index.json", grid=False)[2] is None

    # ImageFeatures.load, what training and decoding read: the same arrays, or a selection
    features = ImageFeatures.load(world / "contents/index.json")
    assert features.image_ids.dtype == np.int64 and features.image_ids.tolist() == ids.tolist()
    assert torch.equal(features.pooled, torch.as_tensor(pooled))
    assert torch.equal(features.grid, torch.as_tensor(grid))
    some = ids[[5, 1, 3]]
    chosen = ImageFeatures.load(world / "contents/index.json", some)
    assert chosen.image_ids.tolist() == some.tolist()
    assert torch.equal(chosen.pooled, features.pooled[[5, 1, 3]])
    assert torch.equal(chosen.grid, features.grid[[5, 1, 3]])
    with pytest.raises(DistinctcapError, match="no image features for image ids \\[999999\\]"):
        ImageFeatures.load(world / "contents/index.json", [int(ids[0]), 999999])

    cap_ids, text = load_text_features(world / "contents/index.json")
    assert cap_ids.tolist() == sorted(captions.caption_id.tolist())
    row = captions.set_index("caption_id").loc[cap_ids[:4], "text"].tolist()
    with torch.no_grad():
        want = clip.model.encode_text(clip.tokenizer(row), normalize=True).numpy()
    np.testing.assert_allclose(text[:4], want, atol=1e-5)
    manifest = read_json(world / "contents/cache/manifest.json")
    assert manifest["arch"] == ARCH and len(manifest["weights_sha256"]) == 64
    assert manifest["preprocess"]["size"] == [64, 64]


def test_extraction_leaves_the_vit_returning_its_embedding(world):
    """The caller's model keeps its own output mode: encode_image still gives one tensor."""
    clip = load_clip(ARCH, str(world / "clip0.pt"))
    grid_token_count(clip)
    assert clip.model.visual.output_tokens is False
    assert isinstance(clip.model.encode_image(torch.zeros(1, 3, 64, 64)), torch.Tensor)


def test_a_conv_tower_gives_its_last_feature_map_as_grid_tokens(world, monkeypatch):
    """shapes-rn-tiny (open_clip's ModifiedResNet at 64 px, stride 32): a 2 x 2 map of
    width * 32 channels as grid tokens, and the attention-pooled embedding of encode_image."""
    monkeypatch.chdir(world)
    torch.manual_seed(0)
    save_weights(open_clip.create_model("shapes-rn-tiny"), world / "rn.pt")
    clip = load_clip("shapes-rn-tiny", str(world / "rn.pt"))
    images = read_table("results/data/images.parquet", "images")
    captions = read_table("results/data/captions.parquet", "captions")
    index = extract_features(
        images, captions, clip, world / "rn/index.json", world / "rn/cache", SETTINGS,
        torch.device("cpu"),
    )
    assert index["images"]["grid_tokens"] == 4
    ids, pooled, grid = load_image_features(world / "rn/index.json")
    width = open_clip.get_model_config("shapes-rn-tiny")["vision_cfg"]["width"]
    assert grid.shape == (30, 4, width * 32)
    first = images.sort_values("image_id").iloc[:2]
    with torch.no_grad():
        x = torch.stack([clip.preprocess(Image.open(f)) for f in first.file])
        np.testing.assert_allclose(
            pooled[:2], clip.model.encode_image(x, normalize=True).numpy(), atol=1e-5
        )
        layer4 = clip.model.visual.forward_intermediates(x, indices=1)["image_intermediates"][0]
    np.testing.assert_allclose(grid[:2, 2], layer4[:, :, 1, 0].numpy(), atol=2e-2, rtol=1e-2)


KILLED_RUN = """
import sys, time
import torch
from distinctcap.clip.load import load_clip
from distinctcap.features.extract import FeatureSettings, extract_features
from distinctcap.core.io import read_table

def stall(shard):  # the first shard is renamed; hold the run there so the test can kill it
    if shard.index == 0:
        print("first shard written", flush=True)
        time.sleep(600)

extract_features(read_table("results/data/images.parquet"),
                 read_table("results/data/captions.parquet"),
                 load_clip("shapes-vit-tiny", "clip0.pt"), "resume/index.json", "resume/cache",
                 FeatureSettings(batch_size=8, workers=0, image_shard_size=10, text_shard_size=64),
                 device=torch.device("cpu"), on_shard=stall)
"""


def test_killed_run_keeps_finished_shards(run, world):
    """SIGKILL an extraction in its own process after its first shard; the rerun keeps that
    shard (same inode and mtime) and computes only the missing ones."""
    extract, _, _ = run
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN],
        cwd=world,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "first shard written"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    folder = world / "resume/cache/images"
    first = shard_stats(folder)
    assert list(first) == ["part-00000.parquet"]
    assert not (world / "resume/index.json").exists()
    (folder / ".part-00001.parquet.x.tmp").write_bytes(b"torn")  # as a kill mid-write leaves

    written = []
    extract(out="resume", on_shard=lambda shard: written.append((shard.kind, shard.index)))
    assert written == [("images", 1), ("images", 2), ("texts", 0), ("texts", 1), ("texts", 2)]
    after = shard_stats(folder)
    assert after["part-00000.parquet"] == first["part-00000.parquet"]  # same inode and mtime
    assert len(after) == 3 and not list(folder.glob(".*.tmp"))

    written.clear()
    extract(out="resume", on_shard=lambda shard: written.append(shard.index))
    assert written == []  # everything reused


def test_another_clip_recomputes_every_shard_and_never_mixes(run, world):
    extract, _, _ = run
    extract(out="swap")
    old_index = read_json(world / "swap/index.json")
    before = shard_stats(world / "swap/cache/images")
    (world / "swap/index_old.json").write_text((world / "swap/index.json").read_text())
    written = []
    extract("clip1.pt", out="swap", on_shard=lambda shard: written.append(shard.index))
    assert len(written) == 6
    after = shard_stats(world / "swap/cache/images")
    assert all(after[name][1] != before[name][1] for name in before)
    assert read_json(world / "swap/index.json")["fingerprint"] != old_index["fingerprint"]
    with pytest.raises(DistinctcapError, match="rerun the extract_features rule"):
        load_image_features(world / "swap/index_old.json")


def test_nan_embeddings_stop_the_stage_naming_the_ids(run, world, monkeypatch):
    extract, images, _ = run
    clip = load_clip(ARCH, str(world / "clip0.pt"))
    with torch.no_grad():
        clip.model.visual.proj[0, 0] = float("nan")
    with pytest.raises(DistinctcapError, match=r"NaN/inf embeddings for image ids \[0, 1, 2, "):
        extract_features(
            images,
            read_table("results/data/captions.parquet"),
            clip,
            world / "nan/index.json",
            world / "nan/cache",
            SETTINGS,
            device=torch.device("cpu"),
        )

    emb = torch.zeros(4, 3)
    emb[2, 1] = float("inf")
    with pytest.raises(DistinctcapError, match=r"caption ids \[12\]"):
        check_finite(np.array([10, 11, 12, 13]), "caption", emb)
    check_finite(np.array([1]), "image", torch.ones(1, 3))


def test_a_tower_without_grid_tokens_stops_naming_clip_arch(run, world):
    _, images, captions = run
    clip = load_clip(ARCH, str(world / "clip0.pt"))
    clip.model.visual = torch.nn.Conv2d(3, 8, 8, 8)  # neither ViT tokens nor intermediates
    clip.model.visual.image_size = 64  # what open_clip's preprocess config reads of a tower
    with pytest.raises(DistinctcapError, match="clip.arch = 'shapes-vit-tiny' gives no grid"):
        extract_features(images, captions, clip, world / "nogrid/index.json",
                         world / "nogrid/cache", SETTINGS, device=torch.device("cpu"))
    assert not (world / "nogrid/index.json").exists()
    assert not list((world / "nogrid/cache").glob("images/*.parquet"))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_image_broken_after_the_data_stage_stops_extraction_naming_it(
    run, world, tmp_path, workers
):
    """A truncated file: the stage names it (in a DataLoader worker too) and how to quarantine
    it; the features of the other images cannot go on without it (data/quality.decoding)."""
    _, images, captions = run
    data = (world / images.file[3]).read_bytes()
    broken = tmp_path / "broken.png"
    broken.write_bytes(data[: len(data) // 2])
    images = images.assign(file=[str(broken) if i == 3 else f for i, f in enumerate(images.file)])
    clip = load_clip(ARCH, str(world / "clip0.pt"))
    settings = dataclasses.replace(SETTINGS, workers=workers)
    named = rf"^image {re.escape(str(broken))} is unreadable \(\w+Error: .*forcerun prepare_data"
    with pytest.raises(DistinctcapError, match=named):
        extract_features(images, captions, clip, tmp_path / "index.json", tmp_path / "cache",
                         settings, device=torch.device("cpu"))
    assert not (tmp_path / "index.json").exists()
    with pytest.raises(DistinctcapError, match=named):
        load_images([str(world / images.file[0]), str(broken)], byte_transform(clip.preprocess)[0])


def test_text_features_tokenised_by_workers_in_other_batches_are_the_same(run, world, tmp_path):
    """Captions tokenised in two DataLoader workers, 48 a forward: the numbers of the default
    (the main process, batch_size a forward) within float32 rounding."""
    _, images, captions = run
    clip = load_clip(ARCH, str(world / "clip0.pt"))
    out = {}
    for name, settings in {
        "default": SETTINGS,
        "workers": dataclasses.replace(SETTINGS, workers=2, text_batch_size=48),
    }.items():
        index = tmp_path / name / "index.json"
        extract_features(images.iloc[:2], captions, clip, index, index.parent, settings)
        out[name] = load_text_features(index)
    assert np.array_equal(out["default"][0], out["workers"][0])
    np.testing.assert_allclose(out["default"][1], out["workers"][1], atol=1e-6)
