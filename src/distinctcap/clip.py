"""CLIP (Radford et al., 2021) through open_clip: loading, a tiny model for the shapes world,
contrastive training and retrieval recall.

- `load_clip(arch, pretrained, device)` takes what open_clip takes: a known tag (`openai`,
  `laion2b_s34b_b79k`, ...), a local weights file, or `local-dir:DIR` (open_clip's folder
  schema: open_clip_config.json + weights). A tag whose weights are not in the local cache fails
  at once when downloads are off (HF_HUB_OFFLINE=1 or the hub unreachable within 3 s) with a
  message telling the user to set a local file, instead of open_clip's slow retries.
- Two tiny architectures for the shapes world (model_configs/ beside this file) are registered
  with open_clip on import, both with a text tower on CLIP's BPE vocabulary (49408) so captioner
  tokens map straight to its ids: `shapes-rn-tiny` (the default), open_clip's ModifiedResNet
  (CLIP's RN50 design) at 64 px and width 16, whose last feature map is a 2 x 2 grid; and
  `shapes-vit-tiny`, a 2-layer ViT in 8 px patches (an 8 x 8 grid). Trained contrastively on
  2,000 images, the ViT learns colour but barely shape (a linear probe of its embedding
  predicts the shape of a lone object at chance); the ResNet's convolutions learn it.
- `train_clip` trains it contrastively (open_clip's ClipLoss, the symmetric InfoNCE of CLIP)
  and `save_weights` writes a state dict that `create_model_and_transforms(arch,
  pretrained=path)` loads, so the trained model goes through the same loading code as a
  pretrained one.
- Given a checkpoint path, `train_clip` writes its whole state there every
  `checkpoint_every` epochs and a rerun with the same fingerprint (arch, settings, seed, device,
  training data) resumes from it to bit-identical weights; a mismatched one is set aside.
- The one CLIP text encoding (`TextTower`): `encode_text` for token ids (features, evaluation,
  retrieval; bit for bit open_clip's `encode_text`) and `ClipTextEncoder` for the specificity
  objective's generated captions, whose one-hot tokens carry a straight-through gradient.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import pickle
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import open_clip
import pandas as pd
import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss
from PIL import Image
from torchvision.transforms import Compose, Normalize, PILToTensor, ToTensor
from tqdm import tqdm

from distinctcap.clip_assets import load_shipped
from distinctcap.data.quality import decoding
from distinctcap.devices import resolve_device
from distinctcap.errors import DistinctcapError
from distinctcap.io import atomic_path
from distinctcap.logs import expect_random_init
from distinctcap.model import BOS, EOS, PAD

log = logging.getLogger(__name__)

MODEL_CONFIGS = Path(__file__).parent / "model_configs"
open_clip.add_model_config(MODEL_CONFIGS)
LOCAL_DIR = "local-dir:"
CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


# ---------------------------------------------------------------- where the weights come from


@dataclass(frozen=True)
class WeightsSource:
    """What to hand open_clip: a model name, a local checkpoint (or None to let open_clip fetch a
    tag) and the tag's preprocessing overrides; `files` are hashed into the features manifest."""

    model_name: str
    checkpoint: str | None
    files: tuple[str, ...]
    kwargs: dict = field(default_factory=dict)


def resolve_weights(arch: str, pretrained: str) -> WeightsSource:
    """Turn `clip.pretrained` into a WeightsSource, failing fast with a clear message."""
    if pretrained.startswith(LOCAL_DIR):
        folder = Path(pretrained[len(LOCAL_DIR) :])
        if not (folder / "open_clip_config.json").is_file():
            raise DistinctcapError(
                f"clip.pretrained = {pretrained!r}: {folder} has no open_clip_config.json; a "
                "local-dir must hold open_clip_config.json and the weights file"
            )
        files = sorted(str(p) for p in folder.iterdir() if p.suffix in CHECKPOINT_SUFFIXES)
        return WeightsSource(pretrained, None, (str(folder / "open_clip_config.json"), *files))
    if arch not in open_clip.list_models():
        raise DistinctcapError(
            f"clip.arch = {arch!r} is not an open_clip architecture; choose one of "
            f"{', '.join(open_clip.list_models())}"
        )
    if os.path.isfile(pretrained):
        return WeightsSource(arch, pretrained, (pretrained,))
    cfg = open_clip.get_pretrained_cfg(arch, pretrained)
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise DistinctcapError(
            f"clip.pretrained = {pretrained!r} is neither a file, nor local-dir:DIR, nor a known "
            f"tag of {arch} (tags: {', '.join(tags) or 'none'})"
        )
    kwargs = {
        "image_mean": cfg.get("mean"),
        "image_std": cfg.get("std"),
        "image_interpolation": cfg.get("interpolation"),
        "image_resize_mode": cfg.get("resize_mode"),
        "force_quick_gelu": bool(cfg.get("quick_gelu", False)),
    }
    cached = cached_tag_file(cfg)
    if cached:
        return WeightsSource(arch, cached, (cached,), kwargs)
    check_can_download(arch, pretrained, cfg)
    return WeightsSource(arch, None, (), {**kwargs, "tag": pretrained})


def cached_tag_file(cfg: dict) -> str | None:
    """The tag's weights file if it is already in the hub or URL cache (no network)."""
    if cfg.get("hf_hub"):
        from huggingface_hub import try_to_load_from_cache

        repo, name = os.path.split(cfg["hf_hub"])
        name = name or "open_clip_pytorch_model.bin"
        candidates = (
            [name[:-4] + ".safetensors", name] if name.endswith((".bin", ".pth")) else [name]
        )
        for candidate in candidates:
            path = try_to_load_from_cache(repo, candidate)
            if isinstance(path, str) and os.path.isfile(path):
                return path
    if cfg.get("url"):
        path = Path("~/.cache/clip").expanduser() / os.path.basename(cfg["url"])
        if path.is_file():
            return str(path)
    return None


def check_can_download(arch: str, tag: str, cfg: dict) -> None:
    """Raise at once if the tag's weights cannot be fetched (offline, or host unreachable)."""
    source = f"https://huggingface.co/{cfg['hf_hub']}" if cfg.get("hf_hub") else cfg.get("url", "")
    host = "huggingface.co" if cfg.get("hf_hub") else urlparse(source).hostname or ""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    why = "downloads are off (HF_HUB_OFFLINE is set)" if offline else None
    if why is None and not reachable(host):
        why = f"{host} cannot be reached"
    if why:
        raise DistinctcapError(
            f"clip.pretrained = {tag!r}: the weights of {arch}/{tag} are not in the local cache "
            f"and {why}. Download them ({source}) on a machine with network access and set "
            "clip.pretrained to the local file (or to local-dir:DIR holding "
            "open_clip_config.json and the weights)"
        )


def reachable(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    """Can a TCP connection to host:port open within `timeout` s (DNS included)?"""
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(ok)


# ---------------------------------------------------------------- loading


@dataclass
class LoadedClip:
    model: torch.nn.Module
    preprocess: Compose  # open_clip's eval transform, PIL -> normalised float tensor
    tokenizer: object  # open_clip tokenizer: list[str] -> LongTensor (B, context_length)
    arch: str
    pretrained: str
    weight_files: tuple[str, ...]

    @property
    def logit_scale(self) -> float:
        """CLIP's own softmax temperature exp(t) (UNKT eq. 3's default)."""
        return float(self.model.logit_scale.detach().exp())

    def preprocess_cfg(self) -> dict:
        cfg = open_clip.get_model_preprocess_cfg(self.model)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}


def load_clip(arch: str, pretrained: str, device: str | torch.device = "cpu") -> LoadedClip:
    """A CLIP in eval mode on `device`, from a tag, a weights file or local-dir:DIR."""
    source = resolve_weights(arch, pretrained)
    kwargs = {k: v for k, v in source.kwargs.items() if v is not None and k != "tag"}
    weights = source.checkpoint or source.kwargs.get("tag")
    model, _, preprocess = open_clip.create_model_and_transforms(
        source.model_name,
        pretrained=None if pretrained.startswith(LOCAL_DIR) else weights,
        device=device,
        **kwargs,
    )
    files = source.files
    if not files and weights:  # a tag open_clip has just downloaded: now it is in the cache
        cached = cached_tag_file(open_clip.get_pretrained_cfg(arch, weights))
        files = (cached,) if cached else ()
    tokenizer = open_clip.get_tokenizer(source.model_name)
    return LoadedClip(model.eval(), preprocess, tokenizer, arch, pretrained, files)


def byte_transform(preprocess: Compose) -> tuple[Compose, torch.Tensor, torch.Tensor]:
    """Split open_clip's eval transform into PIL -> uint8 tensor (resize, crop, RGB) and the
    mean/std of its final normalisation, applied on the device by `normalize`: workers then ship
    bytes, and the result equals ToTensor + Normalize."""
    steps = list(preprocess.transforms)
    if (
        len(steps) < 2
        or not isinstance(steps[-2], ToTensor)
        or not isinstance(steps[-1], Normalize)
    ):
        raise DistinctcapError(f"unexpected open_clip transform (no ToTensor+Normalize): {steps}")
    mean = torch.tensor(steps[-1].mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(steps[-1].std, dtype=torch.float32).view(1, -1, 1, 1)
    return Compose([*steps[:-2], PILToTensor()]), mean, std


def normalize(batch: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> float32, scaled to [0, 1] and normalised as CLIP expects."""
    mean, std = mean.to(batch.device), std.to(batch.device)
    return (batch.float().div_(255) - mean).div_(std)


def load_images(files: Sequence[str], transform: Compose) -> torch.Tensor:
    """Every image through `transform` (PIL -> uint8), stacked: (N, 3, H, W)."""
    out = []
    for file in tqdm(files, desc="load images", unit="images"):
        with decoding(file), Image.open(file) as image:
            out.append(transform(image))
    return torch.stack(out)


# ---------------------------------------------------------------- training


@dataclass
class TrainSettings:
    epochs: int = 240
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_fraction: float = 0.1
    checkpoint_every: int = 10  # epochs between resume checkpoints; 0 = none
    use_shipped: bool = True  # take assets/clip/ weights of the same fingerprint (clip_assets)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """open_clip's convention: no weight decay on gains, biases, embeddings and logit_scale."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        skip = p.ndim < 2 or "embedding" in name or "logit_scale" in name
        (no_decay if skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lr_at(step: int, total: int, warmup: int, lr: float) -> float:
    """Linear warm-up then cosine decay to zero."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return 0.5 * lr * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def caption_index(captions: pd.DataFrame, image_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR layout of captions per image: rows of `captions` sorted by image, and the offsets."""
    position = {int(i): k for k, i in enumerate(image_ids)}
    owner = captions.image_id.map(position).to_numpy()
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=len(image_ids))
    if (counts == 0).any():
        raise DistinctcapError(f"image {image_ids[counts == 0][0]} has no caption to train on")
    return order, np.concatenate([[0], np.cumsum(counts)])


def train_clip(
    images: pd.DataFrame,
    captions: pd.DataFrame,
    arch: str,
    settings: TrainSettings,
    seed: int = 0,
    device: str = "auto",
    checkpoint: str | os.PathLike | None = None,
    shipped: str | os.PathLike | None = None,
) -> tuple[torch.nn.Module, dict]:
    """Train `arch` from scratch with CLIP's contrastive loss on the train split.

    Each epoch pairs every train image with one of its captions drawn at random; ClipLoss is
    the symmetric cross-entropy over the batch's image-text similarity matrix scaled by the
    learned temperature exp(t), clamped at 100 as in CLIP. Returns the model (eval mode) and
    its validation retrieval recall (`retrieval_recall`).

    With a `checkpoint` path, every `settings.checkpoint_every` epochs the whole training state
    is written there; a later call with the same fingerprint (`train_fingerprint`) resumes from
    it to the same final weights, and success removes it.

    With `shipped` (the assets/clip folder) and `settings.use_shipped`, weights shipped there
    with the same fingerprint are loaded instead of training (`clip_assets.load_shipped`);
    `metrics["weights"]` says which ("trained" or the shipped file and its sha256).
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    dev = resolve_device(device)
    expect_random_init()  # open_clip warns that it starts from random weights: the plan here
    model, _, preprocess = open_clip.create_model_and_transforms(arch, device=dev, output_dict=True)
    to_bytes, mean, std = byte_transform(preprocess)
    tokenizer = open_clip.get_tokenizer(arch)
    train_images = images[images.split == "train"].sort_values("image_id")
    train_caps = captions[captions.split == "train"]
    pixels = load_images(train_images.file.tolist(), to_bytes)
    tokens = tokenizer(train_caps.text.tolist())
    order, offsets = caption_index(train_caps, train_images.image_id.to_numpy())

    n, bs = len(pixels), min(settings.batch_size, len(pixels))
    steps_per_epoch = n // bs
    total = steps_per_epoch * settings.epochs
    opt = torch.optim.AdamW(
        param_groups(model, settings.weight_decay), lr=settings.lr, betas=(0.9, 0.98), eps=1e-6
    )
    loss_fn = ClipLoss()
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda")
    fingerprint = train_fingerprint(arch, settings, seed, dev, pixels, tokens, train_caps.image_id)
    found = load_shipped(shipped, arch, fingerprint) if settings.use_shipped else None
    if found:
        model.load_state_dict(found[0])
    progress = TrainProgress(epoch=settings.epochs) if found else resume_training(
        checkpoint, fingerprint, model, opt, rng, settings.epochs
    )
    model.train()
    start = time.perf_counter() - progress.seconds
    warmup = int(settings.warmup_fraction * total)
    while progress.epoch < settings.epochs:
        perm = rng.permutation(n)
        pick = order[offsets[perm] + rng.integers(0, np.diff(offsets)[perm])]
        epoch_loss = 0.0
        for b in range(steps_per_epoch):
            rows = slice(b * bs, (b + 1) * bs)
            x = normalize(pixels[perm[rows]].to(dev, non_blocking=True), mean, std)
            t = tokens[pick[rows]].to(dev, non_blocking=True)
            lr = lr_at(progress.step, total, warmup, settings.lr)
            epoch_loss += contrastive_step(model, opt, loss_fn, amp, x, t, lr)
            progress.step += 1
        progress.end_epoch(
            epoch_loss / max(1, steps_per_epoch),
            model.logit_scale.exp().item(),
            time.perf_counter() - start,
            settings.epochs,
        )
        if checkpoint_due(checkpoint, settings, progress.epoch):
            save_training(checkpoint, fingerprint, model, opt, rng, progress)
    model.eval()
    metrics = evaluate_retrieval(model, images, captions, "val", to_bytes, mean, std, tokenizer)
    metrics.update(
        train_seconds=round(time.perf_counter() - start, 1),
        epochs=settings.epochs,
        logit_scale=model.logit_scale.exp().item(),
        arch=arch,
        fingerprint=fingerprint,
        weights=found[1] if found else "trained",
    )
    remove_checkpoint(checkpoint)
    return model, metrics


def contrastive_step(
    model, opt, loss_fn, amp, x: torch.Tensor, t: torch.Tensor, lr: float
) -> float:
    """One optimiser step of ClipLoss on a batch of images `x` and tokens `t`; its loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    with amp:
        out = model(x, t)
        loss = loss_fn(out["image_features"], out["text_features"], out["logit_scale"])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    with torch.no_grad():
        model.logit_scale.clamp_(0, math.log(100))
    return loss.item()


# ---------------------------------------------------------------- resuming CLIP training


@dataclass
class TrainProgress:
    """Where training stands: epochs done, optimiser steps done, the per-epoch log so far and
    the seconds spent training (across resumed processes)."""

    epoch: int = 0
    step: int = 0
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def end_epoch(self, loss: float, logit_scale: float, seconds: float, epochs: int) -> None:
        """Record and log one finished epoch."""
        self.epoch += 1
        self.seconds = seconds
        record = {"epoch": self.epoch, "loss": loss, "logit_scale": logit_scale, "seconds": seconds}
        self.history.append(record)
        log_epoch(record, epochs)


def log_epoch(record: dict, epochs: int, note: str = "") -> None:
    """One progress line per epoch, with the time left at the mean epoch time so far."""
    left = record["seconds"] / record["epoch"] * (epochs - record["epoch"])
    log.info(
        "epoch %d/%d (%d %%): contrastive loss %.4f, logit scale %.2f, %.0f s, about %.0f min "
        "left%s",
        record["epoch"],
        epochs,
        100 * record["epoch"] // epochs,
        record["loss"],
        record["logit_scale"],
        record["seconds"],
        left / 60,
        note,
    )


def train_fingerprint(
    arch: str,
    settings: TrainSettings,
    seed: int,
    device: torch.device,
    pixels: torch.Tensor,
    tokens: torch.Tensor,
    caption_images: pd.Series,
) -> dict:
    """Everything that determines the trained weights, field by field (so a mismatch can be
    named): the settings except `checkpoint_every` and `use_shipped`, and a hash of the loaded
    training data (pixels, caption tokens and which image each caption belongs to)."""
    data = hashlib.sha256()
    for array in (pixels.numpy(), tokens.numpy(), caption_images.to_numpy(dtype=np.int64)):
        data.update(np.ascontiguousarray(array).tobytes())
    kept = {
        k: v for k, v in asdict(settings).items() if k not in ("checkpoint_every", "use_shipped")
    }
    return {
        "arch": arch,
        "settings": kept,
        "seed": seed,
        "device": device.type,
        "data": data.hexdigest()[:16],
    }


def fingerprint_mismatch(saved: dict, current: dict) -> list[str]:
    """The fields (settings.<key> for a setting) in which two fingerprints differ."""
    fields = [k for k in current if k != "settings" and saved.get(k) != current[k]]
    saved_settings = saved.get("settings") or {}
    fields += [
        f"settings.{k}" for k, v in current["settings"].items() if saved_settings.get(k) != v
    ]
    return fields


def checkpoint_due(
    checkpoint: str | os.PathLike | None, settings: TrainSettings, epoch: int
) -> bool:
    """After `epoch` epochs: is a checkpoint to be written? (Never after the last one.)"""
    every = settings.checkpoint_every
    return bool(checkpoint and every and epoch % every == 0 and epoch < settings.epochs)


def save_training(
    path: str | os.PathLike,
    fingerprint: dict,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rng: np.random.Generator,
    progress: TrainProgress,
) -> None:
    """Write the whole training state to `path` atomically (a kill leaves the previous one)."""
    state = {
        "fingerprint": fingerprint,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "numpy_rng": rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "progress": asdict(progress),
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_training(path: Path, fingerprint: dict) -> dict | None:
    """The checkpoint at `path` if it matches `fingerprint`; a mismatched or unreadable one is
    renamed aside (kept for inspection) with one log line saying why."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        set_aside(path, f"it cannot be read ({error})")
        return None
    mismatch = fingerprint_mismatch(state.get("fingerprint") or {}, fingerprint)
    if mismatch:
        set_aside(path, f"it is from a different {', '.join(mismatch)}")
        return None
    return state


def set_aside(path: Path, why: str) -> None:
    aside = path.with_name(f"{path.stem}.set-aside-{time.strftime('%Y%m%d-%H%M%S')}{path.suffix}")
    os.replace(path, aside)
    log.warning("not resuming CLIP training from %s: %s; moved it to %s", path, why, aside)


def resume_training(
    checkpoint: str | os.PathLike | None,
    fingerprint: dict,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rng: np.random.Generator,
    epochs: int,
) -> TrainProgress:
    """Restore model, optimiser and RNGs from a matching checkpoint and return its progress;
    a fresh TrainProgress when there is none."""
    path = Path(checkpoint) if checkpoint else None
    state = load_training(path, fingerprint) if path and path.exists() else None
    if state is None:
        return TrainProgress()
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    rng.bit_generator.state = state["numpy_rng"]
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    progress = TrainProgress(**state["progress"])
    for record in progress.history:  # the log file of this process starts empty
        log_epoch(record, epochs, " (before resuming)")
    log.info("resumed CLIP training at epoch %d of %d from %s", progress.epoch + 1, epochs, path)
    return progress


def remove_checkpoint(checkpoint: str | os.PathLike | None) -> None:
    """Training is done: drop its checkpoint (and the folder when nothing else is in it)."""
    if not checkpoint:
        return
    path = Path(checkpoint)
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:  # not empty (a set-aside checkpoint) or already gone
        pass


@torch.inference_mode()
def evaluate_retrieval(model, images, captions, split, to_bytes, mean, std, tokenizer) -> dict:
    """Image<->text recall of `model` on one split (all of its images and captions)."""
    dev = next(model.parameters()).device
    imgs = images[images.split == split].sort_values("image_id")
    caps = captions[captions.split == split]
    pixels = load_images(imgs.file.tolist(), to_bytes)
    tokens = tokenizer(caps.text.tolist())
    img_emb = (
        torch.cat(
            [
                model.encode_image(normalize(p.to(dev), mean, std), normalize=True)
                for p in pixels.split(256)
            ]
        )
        .float()
        .cpu()
    )
    txt_emb = (
        torch.cat([encode_text(model, t.to(dev), normalize=True) for t in tokens.split(1024)])
        .float()
        .cpu()
    )
    return retrieval_recall(img_emb, imgs.image_id.to_numpy(), txt_emb, caps.image_id.to_numpy())


def retrieval_recall(
    image_emb: torch.Tensor,
    image_ids: np.ndarray,
    text_emb: torch.Tensor,
    text_image_ids: np.ndarray,
    ks: Sequence[int] = (1, 5),
) -> dict:
    """Recall@k both ways. image->text: an image is a hit when one of its own captions is among
    its k nearest captions; text->image: a caption is a hit when its image is among its k
    nearest images. `chance_R@1` is 1 / number of images."""
    sim = text_emb @ image_emb.T  # (Nt, Ni)
    own = torch.as_tensor(text_image_ids[:, None] == image_ids[None, :])  # (Nt, Ni)
    out = {
        "n_images": len(image_ids),
        "n_captions": len(text_image_ids),
        "chance_R@1": 1.0 / len(image_ids),
    }
    for k in ks:
        top_images = sim.topk(min(k, sim.shape[1]), dim=1).indices
        out[f"text_to_image_R@{k}"] = own.gather(1, top_images).any(1).float().mean().item()
        top_texts = sim.topk(min(k, sim.shape[0]), dim=0).indices  # (k, Ni)
        out[f"image_to_text_R@{k}"] = own.gather(0, top_texts).any(0).float().mean().item()
    return out


def save_weights(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """A plain state dict (written atomically) that open_clip loads with pretrained=path."""
    with atomic_path(path) as tmp:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, tmp)


# ---------------------------------------------------------------- the text encoder

TEXT_POOLS = ("argmax", "eos", "first", "last")


def _is_causal(mask: torch.Tensor | None, n: int) -> bool:
    """Is `mask` open_clip's additive causal mask (-inf above the diagonal, 0 elsewhere)?"""
    if mask is None or tuple(mask.shape) != (n, n):
        return False
    above = torch.ones(n, n, dtype=torch.bool, device=mask.device).triu(1)
    return bool(torch.isneginf(mask[above]).all() and (mask[~above] == 0).all())


class TextTower:
    """open_clip's text tower run from token embeddings: the one implementation of CLIP text
    encoding behind `encode_text` (hard token ids: features, evaluation, CLIP retrieval) and
    `ClipTextEncoder` (one-hot tokens with a straight-through gradient: the specificity
    objective). It holds the tower and changes nothing in it (mode, requires_grad).

    `features` reproduces `CLIP.encode_text` (and `TextTransformer.forward` of a CustomTextCLIP
    without a CLS token or pad mask): token embeddings + positional embedding, the transformer
    with its mask, ln_final, pooling (open_clip's default `argmax`: eot has the largest id),
    text_projection. A tower of another kind (CLS token, pad mask, a Hugging Face text model)
    is a DistinctcapError here; `encode_text` leaves it to open_clip."""

    def __init__(self, clip: torch.nn.Module):
        clip = getattr(clip, "model", clip)  # LoadedClip or the model
        tower = clip.text if hasattr(clip, "text") else clip  # CustomTextCLIP or CLIP
        needed = ("token_embedding", "positional_embedding", "transformer", "ln_final")
        missing = [a for a in needed if not hasattr(tower, a)]
        if (
            missing
            or getattr(tower, "cls_emb", None) is not None
            or getattr(tower, "use_pad_mask", False)
        ):
            raise DistinctcapError(
                f"CLIP text tower {type(tower).__name__} is not a plain open_clip text "
                "transformer (token embedding, causal transformer, eot pooling); "
                f"missing {missing or 'nothing, but it has a CLS token or pad mask'}"
            )
        self.pool = getattr(tower, "text_pool_type", None) or getattr(tower, "pool_type", "argmax")
        if self.pool not in TEXT_POOLS:
            raise DistinctcapError(f"CLIP text pooling {self.pool!r}: supported {TEXT_POOLS}")
        self.eos_id = getattr(tower, "text_eos_id", None) or getattr(tower, "eos_id", None)
        self.module = tower
        self.context_length = tower.positional_embedding.shape[0]

    @functools.cached_property
    def causal(self) -> bool:
        return _is_causal(self.module.attn_mask, self.context_length)

    def pool_index(self, tok: torch.Tensor) -> torch.Tensor:
        """Row position whose features are the text embedding, from the hard ids (B, L)."""
        if self.pool == "argmax":
            return tok.argmax(dim=-1)
        if self.pool == "eos":
            return (tok == self.eos_id).int().argmax(dim=-1)
        return torch.full_like(tok[:, 0], 0 if self.pool == "first" else tok.shape[1] - 1)

    def features(self, x: torch.Tensor, tok: torch.Tensor, cut: bool) -> torch.Tensor:
        """Token embeddings x (B, L, W) of CLIP ids tok (B, L) -> text features (B, E), not
        normalised, in the tower's dtype.

        With `cut`, under a causal mask the positions after the last pooled one are dropped
        (no position sees later ones): the same numbers as the full context up to float
        rounding, at a fraction of the cost (captions of ~20 tokens in CLIP's 77). Without it
        every operation is open_clip's own, so the result is `encode_text`'s bit for bit."""
        tw = self.module
        n, mask = x.shape[1], tw.attn_mask
        if cut and self.causal and self.pool != "last":
            n = int(self.pool_index(tok).max()) + 1
            x, tok, mask = x[:, :n], tok[:, :n], mask[:n, :n]
        x = x.to(tw.transformer.get_cast_dtype()) + tw.positional_embedding[:n].to(x.dtype)
        x = tw.transformer(x, attn_mask=mask)
        x = tw.ln_final(x)
        x = x[torch.arange(x.shape[0], device=x.device), self.pool_index(tok)]  # (B, W)
        proj = tw.text_projection
        if proj is not None:
            x = proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj
        return x


def encode_text(
    model: torch.nn.Module, tokens: torch.Tensor, normalize: bool = False
) -> torch.Tensor:
    """CLIP ids (B, context_length) -> text embeddings (B, E), as open_clip's
    `model.encode_text(tokens, normalize)` and with the same numbers: through `TextTower`
    (the implementation the specificity objective's one-hot path shares) for a plain text
    transformer, else open_clip's own."""
    try:
        tower = TextTower(model)
    except DistinctcapError:
        return model.encode_text(tokens, normalize=normalize)
    x = tower.features(tower.module.token_embedding(tokens), tokens, cut=False)
    return F.normalize(x, dim=-1) if normalize else x


class ClipTextEncoder(torch.nn.Module):
    """The frozen CLIP text encoder of generated captions, fed with token embeddings so
    one-hot tokens can carry gradient (`TextTower` with `cut`, then L2 normalisation in
    float32).

    Captioner ids map to CLIP ids through `clip_ids` (data/tokenizer.py). A one-hot over CLIP's
    vocabulary (V_clip = 49408) times the token-embedding matrix E equals a one-hot over the
    captioner's vocabulary times E[clip_ids] (V_cap rows), and so do their gradients; the
    second is what runs, so memory is (B, T, V_cap), not (B, T, 49408). Building it freezes
    the tower (requires_grad off, eval mode).
    """

    def __init__(self, clip: torch.nn.Module, clip_ids: Sequence[int]):
        super().__init__()
        self.text = TextTower(clip)
        self.tower = self.text.module
        self.pool, self.eos_id = self.text.pool, self.text.eos_id
        self.context_length = self.text.context_length
        self.causal = self.text.causal
        self.register_buffer(
            "clip_ids", torch.as_tensor(list(clip_ids), dtype=torch.long), persistent=False
        )
        self.sot, self.eot = int(self.clip_ids[BOS]), int(self.clip_ids[EOS])
        self.requires_grad_(False).eval()

    def train(self, mode: bool = True) -> ClipTextEncoder:
        return super().train(False)  # frozen: always eval (no dropout)

    def clip_tokens(self, seqs: torch.Tensor) -> torch.Tensor:
        """Captioner ids (B, T) of generated captions (pad after eos; eos may be missing when
        the caption hit max_len) -> CLIP ids (B, context_length): [sot] + caption + [eot],
        pad 0. Too long a caption keeps its first context_length - 2 tokens and ends with eot,
        as open_clip's tokenizer truncates."""
        b, t = seqs.shape
        ctx = self.context_length
        n_fit = min(t, ctx - 1)
        is_tok = (seqs != PAD) & (seqs != EOS)
        first_end = torch.where(is_tok, t, torch.arange(t, device=seqs.device)).min(dim=1).values
        eot_pos = (first_end + 1).clamp(max=ctx - 1)  # (B,)
        tok = seqs.new_zeros(b, ctx)
        tok[:, 0] = self.sot
        tok[:, 1 : 1 + n_fit] = self.clip_ids[seqs[:, :n_fit]]
        pos = torch.arange(ctx, device=seqs.device)
        tok = tok.masked_fill(pos > eot_pos[:, None], 0)
        return tok.scatter(1, eot_pos[:, None], self.eot)

    def pool_index(self, tok: torch.Tensor) -> torch.Tensor:
        """Row position whose features are the text embedding, from the hard ids (B, L)."""
        return self.text.pool_index(tok)

    def forward_embeddings(
        self, x: torch.Tensor, tok: torch.Tensor, normalize: bool = True
    ) -> torch.Tensor:
        """Token embeddings x (B, L, W) of CLIP ids tok (B, L) -> float32 (B, E), L2-normalised
        unless `normalize` is false, on the positions up to the pooled one (`TextTower.features`
        with `cut`)."""
        x = self.text.features(x, tok, cut=True).float()
        return F.normalize(x, dim=-1) if normalize else x

    def forward(
        self, seqs: torch.Tensor, probs: torch.Tensor | None = None, normalize: bool = True
    ) -> torch.Tensor:
        """Generated captioner ids (B, T) -> CLIP text embeddings (B, E), L2-normalised unless
        `normalize` is false (the unnormalised projection of the specificity paper's dp/cdp).

        With `probs` (B, T, V_cap), the captioner's (differentiable) output probabilities at
        those positions, the forward pass is unchanged (hard tokens) and the gradient w.r.t.
        each one-hot input token flows to probs (straight-through)."""
        tok = self.clip_tokens(seqs)
        x = self.tower.token_embedding(tok)  # (B, L, W): the hard one-hot times E
        if probs is not None:
            n_fit = min(seqs.shape[1], self.context_length - 1)
            kept = tok[:, 1 : 1 + n_fit] == self.clip_ids[seqs[:, :n_fit]]
            kept &= seqs[:, :n_fit] != PAD  # positions whose CLIP token is the generated one
            residual = (probs - probs.detach())[:, :n_fit] * kept[..., None]  # value 0
            emb = self.tower.token_embedding.weight[self.clip_ids]  # (V_cap, W)
            delta = residual.to(emb.dtype) @ emb  # (B, n_fit, W)
            x = x + F.pad(delta, (0, 0, 1, self.context_length - 1 - n_fit))
        return self.forward_embeddings(x, tok, normalize)
