"""Loading CLIP from a tag / file / local-dir, the tiny architecture, preprocessing, recall;
training the tiny CLIP and resuming it after a kill."""

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import open_clip
import pandas as pd
import pytest
import torch
from PIL import Image

from distinctcap.clip.assets import fingerprint_mismatch, ship_weights
from distinctcap.clip.load import byte_transform, load_clip, normalize
from distinctcap.clip.text import encode_text
from distinctcap.core.devices import resolve_device
from distinctcap.core.errors import DistinctcapError
from distinctcap.data import shapes
from distinctcap.train import clip as clip_module
from distinctcap.train.checkpoints import Checkpoints, Fingerprint
from distinctcap.train.clip import TrainSettings, retrieval_recall, save_weights, train_clip
from distinctcap.train.schedule import lr_at

ARCH = "shapes-vit-tiny"
ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


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


def clip_lr_before(step: int, total: int, warmup: int, lr: float) -> float:
    """CLIP's own schedule before it became train.schedule.lr_at (the reference)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return 0.5 * lr * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def trainer_factor_before(step, warmup, total, schedule, final_ratio) -> float:
    """The captioner trainer's lr_factor before it became lr_at with peak 1 (the reference)."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(total - 1 - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    return final_ratio + (1.0 - final_ratio) * (1.0 - progress)


@pytest.mark.parametrize(
    "lr, steps, warmup", [(1e-3, 280, 28), (1e-3, 7, 0), (3e-4, 1000, 99), (0.07, 33, 33)]
)
def test_the_shared_schedule_is_both_old_schedules_bit_for_bit(lr, steps, warmup):
    for step in range(steps + 1):
        shared = lr_at(step, lr, warmup, steps + 1, "cosine", 0.0)  # as train_clip calls it
        assert shared == clip_lr_before(step, steps, warmup, lr), step
        for schedule, final in [("linear", 0.0), ("linear", 0.1), ("constant", 0.0)]:
            factor = lr_at(step, 1.0, warmup, steps, schedule, final)  # as the trainer's LambdaLR
            assert factor == trainer_factor_before(step, warmup, steps, schedule, final), step


def test_lr_schedule_and_device():
    assert lr_at(0, 1.0, 10, 101, "cosine", 0.0) == pytest.approx(0.1)
    assert lr_at(10, 1.0, 10, 101, "cosine", 0.0) == pytest.approx(1.0)
    assert lr_at(100, 1.0, 10, 101, "cosine", 0.0) == pytest.approx(0.0)
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(DistinctcapError, match="no GPU"):
            resolve_device("cuda")


# ---------------------------------------------------------------- training resumes after a kill

# 16 train images in batches of 8: 2 steps an epoch
RESUME_SETTINGS = {"epochs": 3, "batch_size": 8, "checkpoint_every": 1}
SRC = str(Path(__file__).resolve().parents[1] / "src")

# Train in a fresh process on one thread, as the rule's script does. With `slow` every step
# sleeps, so the parent can SIGKILL it mid-run once the first epoch checkpoint is on disk.
TRAIN_SCRIPT = """
import json, logging, sys, time
import pandas as pd, torch
from distinctcap.train import clip as clip
world, checkpoint, out, slow, settings = sys.argv[1:]
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
torch.set_num_threads(1)
if slow == "1":
    step = clip.contrastive_step
    def slow_step(*args):
        time.sleep(0.5)
        return step(*args)
    clip.contrastive_step = slow_step
model, _ = clip.train_clip(
    pd.read_parquet(f"{world}/images.parquet"), pd.read_parquet(f"{world}/captions.parquet"),
    "shapes-vit-tiny", clip.TrainSettings(**json.loads(settings)), seed=0, device="cpu",
    checkpoint=checkpoint,
)
clip.save_weights(model, out)
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny shapes world (16 train, 4 val images) with absolute image paths, as parquet."""
    root = tmp_path_factory.mktemp("world")
    images, captions = shapes.generate(shapes.ShapesConfig(n_train=16, n_val=4, n_test=1), root)
    images["file"] = [str(root / f) for f in images.file]
    images.to_parquet(root / "images.parquet")
    captions.to_parquet(root / "captions.parquet")
    return root, images, captions


@pytest.fixture(scope="module")
def uninterrupted(world, one_thread):
    """Final weights of one run start to finish, without checkpoints."""
    _, images, captions = world
    settings = TrainSettings(**RESUME_SETTINGS)
    model, _ = train_clip(images, captions, ARCH, settings, seed=0, device="cpu")
    return model.state_dict()


def run_training(
    world: Path, checkpoint: Path, out: Path, slow: bool, log_file: Path
) -> subprocess.Popen:
    """TRAIN_SCRIPT in a new process; its stderr (the log) goes to `log_file`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    args = [str(world), str(checkpoint), str(out), str(int(slow)), json.dumps(RESUME_SETTINGS)]
    with open(log_file, "w") as stderr:
        return subprocess.Popen([sys.executable, "-c", TRAIN_SCRIPT, *args], env=env, stderr=stderr)


def checkpoint_epoch(path: Path) -> int:
    """Epochs recorded in the checkpoint at `path` (0 while there is none)."""
    if not path.exists():
        return 0
    return torch.load(path, map_location="cpu", weights_only=True)["progress"]["epoch"]


def assert_same_weights(state: dict, expected: dict) -> None:
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(state[name], value), name


def test_killed_clip_training_resumes_to_the_same_weights(world, uninterrupted, tmp_path):
    root, _, _ = world
    checkpoint, out = tmp_path / "checkpoints" / f"{ARCH}.pt", tmp_path / f"{ARCH}.pt"
    killed_log, resumed_log = tmp_path / "killed.log", tmp_path / "resumed.log"
    killed = run_training(root, checkpoint, out, True, killed_log)
    deadline = time.monotonic() + 120
    while checkpoint_epoch(checkpoint) < 1:
        assert killed.poll() is None, killed_log.read_text()
        assert time.monotonic() < deadline, "no epoch checkpoint within 120 s"
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(timeout=30) == -signal.SIGKILL
    done = checkpoint_epoch(checkpoint)
    assert 1 <= done < RESUME_SETTINGS["epochs"] and not out.exists()

    resumed = run_training(root, checkpoint, out, False, resumed_log)
    assert resumed.wait(timeout=120) == 0, resumed_log.read_text()
    stderr = resumed_log.read_text()
    epochs = RESUME_SETTINGS["epochs"]
    assert f"resumed CLIP training at epoch {done + 1} of {epochs} from {checkpoint}" in stderr
    assert not checkpoint.exists() and not checkpoint.parent.exists()  # removed on success
    assert_same_weights(torch.load(out, map_location="cpu", weights_only=True), uninterrupted)


def test_mismatched_clip_checkpoint_is_set_aside_not_resumed(
    world, uninterrupted, tmp_path, monkeypatch, caplog
):
    _, images, captions = world
    checkpoint = tmp_path / "checkpoints" / f"{ARCH}.pt"
    settings = TrainSettings(**RESUME_SETTINGS)
    with monkeypatch.context() as patch:  # keep the seed-1 run's last checkpoint (epoch 2)
        patch.setattr(Checkpoints, "drop", lambda self: None)
        train_clip(images, captions, ARCH, settings, seed=1, device="cpu", checkpoint=checkpoint)
    assert checkpoint_epoch(checkpoint) == 2

    with caplog.at_level(logging.INFO, logger="distinctcap.train.clip"):
        model, _ = train_clip(
            images, captions, ARCH, settings, seed=0, device="cpu", checkpoint=checkpoint
        )
    assert "resumed" not in caplog.text
    (warning,) = [
        r.getMessage()
        for r in caplog.records
        if r.name == "distinctcap.train.clip" and r.levelno == logging.WARNING
    ]
    assert "(seed changed)" in warning and str(checkpoint) in warning
    aside = list(checkpoint.parent.glob("stale-*.pt"))
    assert len(aside) == 1 and checkpoint_epoch(aside[0]) == 2  # renamed, not deleted
    assert not checkpoint.exists()
    assert_same_weights(model.state_dict(), uninterrupted)  # trained from epoch 0


def test_clip_fingerprint_names_what_differs_and_unreadable_checkpoints_go_aside(tmp_path):
    current = {"arch": ARCH, "settings": {"lr": 0.001, "epochs": 3}, "seed": 0, "data": "ab"}
    saved = {**current, "settings": {"lr": 0.01, "epochs": 3}, "data": "cd"}
    assert fingerprint_mismatch(saved, current) == ["data", "settings.lr"]
    assert fingerprint_mismatch(current, current) == []
    broken = tmp_path / "clip.pt"
    broken.write_bytes(b"not a checkpoint")
    checkpoints = Checkpoints(broken, Fingerprint(current), logging.getLogger(__name__))
    assert checkpoints.load() is None
    assert not broken.exists() and (tmp_path / "stale-unreadable.pt").exists()
    assert (
        "checkpoint_every"
        not in clip_module.train_fingerprint(
            ARCH,
            TrainSettings(),
            0,
            torch.device("cpu"),
            clip_module.TrainSplit(
                torch.zeros(1, 3, 2, 2, dtype=torch.uint8),
                torch.zeros(1, 4, dtype=torch.long),
                pd.Series([0]),
                np.zeros(1, dtype=np.int64),
                np.array([0, 1]),
            ),
        )["settings"]
    )


@pytest.mark.parametrize("arch", ["shapes-vit-tiny", "shapes-rn-tiny"])
def test_encode_text_is_open_clips_bit_for_bit(arch):
    """clip.encode_text (the TextTower the specificity objective shares) gives open_clip's
    numbers exactly, and leaves the model's mode and requires_grad alone."""
    torch.manual_seed(0)
    model = open_clip.create_model(arch).train()
    tokens = open_clip.get_tokenizer(arch)(["a red circle", "two blue squares left of a star"])
    with torch.no_grad():
        for normalize in (False, True):
            ours = encode_text(model, tokens, normalize=normalize)
            assert torch.equal(ours, model.encode_text(tokens, normalize=normalize))
    assert model.training and all(p.requires_grad for p in model.parameters())


# ---------------------------------------------------------------- shipped weights (assets/clip)


def ship_tiny(tmp_path: Path, images, captions, settings: TrainSettings) -> Path:
    """Train the tiny CLIP, write it as rule train_clip does, ship it; the assets folder."""
    results = tmp_path / "results-clip"
    model, metrics = train_clip(images, captions, ARCH, settings, seed=0, device="cpu")
    save_weights(model, results / f"{ARCH}.pt")
    (results / "retrieval.json").write_text(json.dumps(metrics))
    ship_weights(results, tmp_path / "assets")
    return tmp_path / "assets"


def test_shipped_weights_are_taken_only_for_the_same_fingerprint(world, uninterrupted, tmp_path):
    _, images, captions = world
    settings = TrainSettings(**RESUME_SETTINGS)
    assets = ship_tiny(tmp_path, images, captions, settings)
    model, metrics = train_clip(images, captions, ARCH, settings, device="cpu", shipped=assets)
    assert metrics["weights"].startswith(f"shipped {ARCH}.pt (sha256 ")
    assert metrics["train_seconds"] < 5  # loaded, not trained
    assert_same_weights(model.state_dict(), uninterrupted)
    metrics_loaded = metrics

    other = TrainSettings(**{**RESUME_SETTINGS, "lr": 0.002})  # a changed setting retrains
    _, metrics = train_clip(images, captions, ARCH, other, device="cpu", shipped=assets)
    assert metrics["weights"] == "trained"
    off = TrainSettings(**RESUME_SETTINGS, use_shipped=False)
    _, metrics = train_clip(images, captions, ARCH, off, device="cpu", shipped=assets)
    assert metrics["weights"] == "trained"

    with open(assets / f"{ARCH}.pt", "ab") as f:  # a damaged file is an error, not a retrain
        f.write(b"x")
    with pytest.raises(DistinctcapError, match=f"{ARCH}.pt fails its checksum"):
        train_clip(images, captions, ARCH, settings, device="cpu", shipped=assets)
    loaded = tmp_path / "loaded"  # only weights a run trained can be shipped
    save_weights(model, loaded / f"{ARCH}.pt")
    (loaded / "retrieval.json").write_text(json.dumps(metrics_loaded))
    with pytest.raises(DistinctcapError, match="not trained by this run"):
        ship_weights(loaded, tmp_path / "again")


@pytest.mark.parametrize("which", ["clip", "judge"])
def test_the_shipped_shapes_clips_are_the_default_configs(which, tmp_path, one_thread):
    """assets/clip holds what train_clip trains for config.yaml's CLIP and its judge CLIP
    (evaluate.judge, trained by the same code with its own arch and seed): the fingerprint
    (settings, seed, device and the generated training data) matches, the checksum holds, and
    the weights score the validation recall recorded when they were trained."""
    import yaml

    from distinctcap.config.check import load_schema, validate
    from distinctcap.data.prepare import prepare

    config = validate(yaml.safe_load((ROOT / "config.yaml").read_text()), load_schema(SCHEMA))
    outputs = {k: str(tmp_path / f"{k}.parquet") for k in ("images", "captions", "quarantine")}
    prepare(config["data"], "fail", {**outputs, "vocab": str(tmp_path / "vocab.json")})
    block = config["clip"] if which == "clip" else config["evaluate"]["judge"]
    seed = config["seed"] if which == "clip" else block["seed"]
    _, metrics = train_clip(
        pd.read_parquet(outputs["images"]), pd.read_parquet(outputs["captions"]),
        block["arch"], TrainSettings(**block["train"]), seed=seed, device="cpu",
        shipped=ROOT / "assets" / "clip",
    )  # fmt: skip
    arch = block["arch"]
    manifest = json.loads((ROOT / "assets" / "clip" / f"{arch}.json").read_text())
    assert metrics["weights"] == f"shipped {arch}.pt (sha256 {manifest['sha256']})"
    for key, recorded in manifest["val_retrieval"].items():
        assert metrics[key] == pytest.approx(recorded, abs=1e-6), key
