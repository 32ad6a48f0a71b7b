"""Contrastive training of a CLIP from scratch (the shapes world's tiny one): epoch sampling,
ClipLoss steps, validation retrieval recall, and the shipped weights of the same fingerprint
instead of training (distinctcap.clip.assets). The learning-rate schedule, the resume checkpoint
and the RNG capture are the captioner trainer's (distinctcap.train.schedule and .checkpoints):
both training loops live in train/, above the CLIP they load (ARCHITECTURE.md, Layers).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np
import open_clip
import pandas as pd
import torch
from open_clip.loss import ClipLoss

from distinctcap.clip.assets import flat_fingerprint, load_shipped
from distinctcap.clip.load import byte_transform, load_images, normalize
from distinctcap.clip.text import encode_text
from distinctcap.core import logs
from distinctcap.core.devices import CPU
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path
from distinctcap.train.checkpoints import (
    Checkpoints,
    Fingerprint,
    rng_state,
    seed_everything,
    set_rng_state,
)
from distinctcap.train.schedule import lr_at

log = logging.getLogger(__name__)


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
    device: torch.device = CPU,
    checkpoint: str | os.PathLike | None = None,
    shipped: str | os.PathLike | None = None,
) -> tuple[torch.nn.Module, dict]:
    """Train `arch` from scratch with CLIP's contrastive loss on the train split.

    Each epoch pairs every train image with one of its captions drawn at random; ClipLoss is
    the symmetric cross-entropy over the batch's image-text similarity matrix scaled by the
    learned temperature exp(t), clamped at 100 as in CLIP. Returns the model (eval mode) and
    its validation retrieval recall (`retrieval_recall`).

    With a `checkpoint` path, every `settings.checkpoint_every` epochs the whole training state
    is written there (`Checkpoints`); a later call with the same fingerprint
    (`train_fingerprint`) resumes from it to the same final weights, one of another is set
    aside, and success removes it.

    With `shipped` (the assets/clip folder) and `settings.use_shipped`, weights shipped there
    with the same fingerprint are loaded instead of training (`clip_assets.load_shipped`);
    `metrics["weights"]` says which ("trained" or the shipped file and its sha256).
    """
    seed_everything(seed)
    rng = np.random.default_rng(seed)  # epoch sampling
    dev = torch.device(device)  # resolved at the job's start; 'cpu' spelled as text works too
    with logs.quiet_open_clip(weights_follow=True):  # random or shipped: said below
        model, _, preprocess = open_clip.create_model_and_transforms(
            arch, device=dev, output_dict=True
        )
        tokenizer = open_clip.get_tokenizer(arch)
    to_bytes, mean, std = byte_transform(preprocess)
    split = TrainSplit.load(images, captions, to_bytes, tokenizer)
    n = len(split.pixels)  # run_epoch caps the batch to it
    logs.warn_if_capped(
        log, "clip.train.batch_size", settings.batch_size, n, f"the {n} train images"
    )
    opt = torch.optim.AdamW(
        param_groups(model, settings.weight_decay), lr=settings.lr, betas=(0.9, 0.98), eps=1e-6
    )
    fingerprint = train_fingerprint(arch, settings, seed, dev, split)
    found = load_shipped(shipped, arch, fingerprint) if settings.use_shipped else None
    if found:
        model.load_state_dict(found[0])
    else:
        log.info("training the CLIP %s from random weights (clip.pretrained = train)", arch)
    checkpoints = Checkpoints(checkpoint, Fingerprint(flat_fingerprint(fingerprint)), log)
    progress = (
        TrainProgress(epoch=settings.epochs)
        if found
        else resume(checkpoints, model, opt, rng, settings.epochs)
    )
    model.train()
    start = time.perf_counter() - progress.seconds
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda")
    step = partial(batch_step, model, opt, ClipLoss(), amp, split, (mean, std))
    while progress.epoch < settings.epochs:
        loss = run_epoch(step, split, rng, progress, settings)
        seconds = time.perf_counter() - start
        progress.end_epoch(loss, model.logit_scale.exp().item(), seconds, settings.epochs)
        if checkpoint_due(checkpoints.path, settings, progress.epoch):
            checkpoints.save(training_state(model, opt, rng, progress))
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
    checkpoints.drop()
    return model, metrics


@dataclass
class TrainSplit:
    """The train split as contrastive training reads it: every image's pixels (uint8, on the
    host), every caption's tokens, the image of each caption, and each image's captions
    (`caption_index`)."""

    pixels: torch.Tensor
    tokens: torch.Tensor
    caption_images: pd.Series
    order: np.ndarray
    offsets: np.ndarray

    @classmethod
    def load(cls, images: pd.DataFrame, captions: pd.DataFrame, to_bytes, tokenizer) -> TrainSplit:
        train_images = images[images.split == "train"].sort_values("image_id")
        train_caps = captions[captions.split == "train"]
        pixels = load_images(train_images.file.tolist(), to_bytes)
        tokens = tokenizer(train_caps.text.tolist())
        order, offsets = caption_index(train_caps, train_images.image_id.to_numpy())
        return cls(pixels, tokens, train_caps.image_id, order, offsets)

    def epoch_pairs(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """An epoch's pairs: every image once in a random order, each with one of its captions
        drawn at random (rows of `pixels`, rows of `tokens`)."""
        perm = rng.permutation(len(self.pixels))
        pick = self.order[self.offsets[perm] + rng.integers(0, np.diff(self.offsets)[perm])]
        return perm, pick


def run_epoch(
    step: Callable[[np.ndarray, np.ndarray, float], float],
    split: TrainSplit,
    rng: np.random.Generator,
    progress: TrainProgress,
    settings: TrainSettings,
) -> float:
    """One epoch in batches of `settings.batch_size` pairs (the last incomplete batch dropped),
    each a `step(image rows, caption rows, lr)` at the learning rate of the step count so far;
    the mean loss. The lr decays (cosine) to zero at the last step of the last epoch."""
    n = len(split.pixels)
    bs = min(settings.batch_size, n)
    steps_per_epoch = n // bs
    total = steps_per_epoch * settings.epochs
    # cosine decay to zero at step `total`: one step past where the trainer's schedule ends
    lr = partial(
        lr_at,
        peak=settings.lr,
        warmup=int(settings.warmup_fraction * total),
        total=total + 1,
        schedule="cosine",
        final_ratio=0.0,
    )
    perm, pick = split.epoch_pairs(rng)
    loss = 0.0
    for b in range(steps_per_epoch):
        rows = slice(b * bs, (b + 1) * bs)
        loss += step(perm[rows], pick[rows], lr(progress.step))
        progress.step += 1
    return loss / max(1, steps_per_epoch)


def batch_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loss_fn: ClipLoss,
    amp: torch.autocast,
    split: TrainSplit,
    normalisation: tuple[torch.Tensor, torch.Tensor],
    image_rows: np.ndarray,
    caption_rows: np.ndarray,
    lr: float,
) -> float:
    """One optimiser step on these rows of the split, moved to the model's device; its loss."""
    dev = model.logit_scale.device
    x = normalize(split.pixels[image_rows].to(dev, non_blocking=True), *normalisation)
    t = split.tokens[caption_rows].to(dev, non_blocking=True)
    return contrastive_step(model, opt, loss_fn, amp, x, t, lr)

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
    split: TrainSplit,
) -> dict:
    """Everything that determines the trained weights, field by field (so a mismatch can be
    named): the settings except `checkpoint_every` and `use_shipped`, and a hash of the loaded
    training data (pixels, caption tokens and which image each caption belongs to)."""
    data = hashlib.sha256()
    caption_images = split.caption_images.to_numpy(dtype=np.int64)
    for array in (split.pixels.numpy(), split.tokens.numpy(), caption_images):
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


def training_state(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rng: np.random.Generator,
    progress: TrainProgress,
) -> dict:
    """What a resume checkpoint holds: model, optimiser, every RNG and the progress."""
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": rng_state(rng),
        "progress": asdict(progress),
    }


def resume(
    checkpoints: Checkpoints,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rng: np.random.Generator,
    epochs: int,
) -> TrainProgress:
    """Restore model, optimiser and RNGs from a matching checkpoint and return its progress;
    a fresh TrainProgress when there is none (or `checkpoints` set it aside)."""
    state = checkpoints.load()
    if state is None:
        return TrainProgress()
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"], rng)
    progress = TrainProgress(**state["progress"])
    for record in progress.history:  # the log file of this process starts empty
        log_epoch(record, epochs, " (before resuming)")
    log.info(
        "resumed CLIP training at epoch %d of %d from %s",
        progress.epoch + 1,
        epochs,
        checkpoints.path,
    )
    return progress


def checkpoint_due(
    checkpoint: str | os.PathLike | None, settings: TrainSettings, epoch: int
) -> bool:
    """After `epoch` epochs: is a checkpoint to be written? (Never after the last one.)"""
    every = settings.checkpoint_every
    return bool(checkpoint and every and epoch % every == 0 and epoch < settings.epochs)


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
