"""The trainer: one loop for every training method, deterministic on CPU and resumable.

`train(cfg, data=None) -> TrainResult` is the whole stage, callable from tests (the Snakemake
rule's script only fills `cfg["paths"]`). `cfg` is a run's effective config
(`distinctcap.config.effective_run_config`): its `runs:` block (method, data,
init/teacher/reference, method options), `seed`, `captioner` (architecture, CaptionerConfig
fields) and `train` (the config.TrainConfig fields: the top-level `train` block with the run's
`train` overrides on top).

The loop, per optimiser step: gather `grad_accum` micro-batches (the data order is a pure
function of (seed, epoch), with an image's captions together by default so each image is
encoded once per batch, data/batches.py), loss = the method's objective (distinctcap.methods)
under autocast (bf16, or fp16 with a GradScaler, on GPU; fp32 on CPU), backward of loss /
grad_accum, gradient clipping, AdamW, learning-rate schedule (linear warm-up then linear or
cosine decay: the papers warm up 3,000 steps to 3e-4, UNKT §4.1). Every `val_every` steps the
selection metric (val_loss, self_retrieval, or one the objective computes itself) is computed on
the validation captions; the best weights are kept (checkpoint selection) and `patience`
validations without improvement stop the run (early stopping).

Resume: every `checkpoint_every` steps `<out_dir>/checkpoints/last.pt` is replaced atomically
with the model, optimiser, scheduler, scaler, RNG states (torch, CUDA, numpy, python), the data
position, the best weights so far, the curve, the objective's own state (its state_dict), and
the run's fingerprint: content hashes of its effective config and of every input `cfg["paths"]`
names (captions, vocab, the features index and its shards, the D-/D+ subset folder, the
init/teacher/reference models, a method's own files such as the CLIP or the neighbours table).
A rerun whose fingerprint matches continues from it and ends with the same weights as an
uninterrupted run; otherwise the checkpoint is set aside as `checkpoints/stale-<its hash>.pt`
with one log line naming what changed, and training starts from step 0. A non-finite loss or
gradient stops the run with `NonFiniteLossError` (step and caption ids); parameters are checked
finite before any checkpoint is written, so a broken state is never saved.

Outputs in `<out_dir>`: model.pt (selected weights, `Captioner.load`-able), curve.csv (one row
per log/validation step: step, epoch, lr, loss, grad_norm, tokens_per_s, val_* and the
objective's own numbers) and summary.json (with the fingerprint and its parts, `inputs`).
last.pt is removed on success; set-aside checkpoints stay.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from distinctcap.config import TrainConfig
from distinctcap.data.batches import (
    Batch,
    BatchOrder,
    CaptionData,
    ImageFeatures,
    encode_batch,
    select_captions,
)
from distinctcap.devices import resolve_device
from distinctcap.distributed import (
    DistEnv,
    GradientReducer,
    all_reduce_sum,
    broadcast_flag,
    broadcast_parameters,
    my_micro_batches,
    shard,
    shard_weight,
)
from distinctcap.errors import DistinctcapError
from distinctcap.io import atomic_path, file_sha256, read_json, read_table, write_json
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext
from distinctcap.model import PAD, Captioner, CaptionerConfig

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Fingerprint: what a run's result depends on

NOT_INPUTS = ("out_dir",)  # cfg["paths"] entries that name where outputs go, not content


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Fingerprint:
    """Named content hashes: `config` and one per input in cfg["paths"]; `hash` combines them."""

    parts: dict[str, str]

    @property
    def hash(self) -> str:
        return _sha(json.dumps(self.parts, sort_keys=True))

    def changes(self, old: dict[str, str]) -> list[str]:
        """Names of the parts that differ from `old` (parts added or dropped included)."""
        return sorted(k for k in self.parts.keys() | old.keys() if self.parts.get(k) != old.get(k))


def fingerprint(cfg: dict) -> Fingerprint:
    """The run's effective config (not paths, not device) and the content of each input that
    cfg["paths"] names (files, folders, the features index with its shards)."""
    kept = {k: v for k, v in cfg.items() if k not in ("paths", "device")}
    parts = {"config": _sha(json.dumps(kept, sort_keys=True, default=str))}
    for key, value in sorted((cfg.get("paths") or {}).items()):
        digest = None if key in NOT_INPUTS else input_digest(key, value)
        if digest is not None:
            parts[key] = digest
    return Fingerprint(parts)


def input_digest(key: str, value: object) -> str | None:
    """Content hash of one cfg["paths"] entry: a file, a folder or a list of files; None for a
    value that names no file (a CLIP tag or architecture)."""
    if key == "features" and Path(str(value)).is_file():
        return features_digest(value)
    values = list(value) if isinstance(value, list | tuple) else [value]
    if not values or not all(isinstance(v, str | Path) and Path(v).exists() for v in values):
        return None
    return _sha("".join(path_digest(v) for v in values))


def path_digest(path: str | Path) -> str:
    """Content hash of a file, or of a folder's files: their sorted relative names and contents."""
    path = Path(path)
    if path.is_file():
        return file_sha256([path])
    files = sorted((p.relative_to(path).as_posix(), p) for p in path.rglob("*") if p.is_file())
    return _sha("".join(f"{name}\0{file_sha256([p])}\n" for name, p in files))


def features_digest(index_path: str | Path) -> str:
    """Content hash of a features index and of every shard file it lists (the index's shard
    keys hash what a shard was computed from, not the shard itself)."""
    index = read_json(index_path)
    root = Path(index_path).parent
    entries = [e for kind in ("images", "texts") for e in index.get(kind, {}).get("shards", [])]
    shards = [root / e["path"] for e in entries]
    return _sha(
        path_digest(index_path)
        + "".join(f"{s.name}\0{path_digest(s) if s.is_file() else '-'}\n" for s in shards)
    )


# ---------------------------------------------------------------------------------------------
# Data


@dataclass
class RunData:
    train: CaptionData
    val: CaptionData | None = None
    tokenizer: object | None = None  # CaptionTokenizer; its vocab_size sizes the model

    @property
    def vocab_size(self) -> int | None:
        return getattr(self.tokenizer, "vocab_size", None)


def load_run_data(cfg: dict) -> RunData:
    """Training captions of the run's data selection and all validation captions, with their
    image features, from the files in `cfg["paths"]` (captions, vocab, features, subset)."""
    from distinctcap.data.tokenizer import CaptionTokenizer

    paths = cfg["paths"]
    captions = read_table(paths["captions"], "captions")
    features = ImageFeatures.load(paths["features"])
    max_len = cfg["captioner"]["max_len"]
    chosen = select_captions(captions, "train", cfg.get("data", "all"), paths.get("subset"))
    val = select_captions(captions, "val")
    log.info(
        "run %s: %d training captions (data %s), %d validation captions",
        cfg.get("name"),
        len(chosen),
        cfg.get("data", "all"),
        len(val),
    )
    return RunData(
        CaptionData.from_table(chosen, features, max_len),
        CaptionData.from_table(val, features, max_len) if len(val) else None,
        CaptionTokenizer.load(paths["vocab"]),
    )


# ---------------------------------------------------------------------------------------------
# Optimisation pieces


def lr_factor(step: int, warmup: int, total: int, schedule: str, final_ratio: float) -> float:
    """Multiplier of the peak lr before optimiser step `step` (0-based): linear warm-up from
    1/warmup to 1 over `warmup` steps, then linear or cosine decay to `final_ratio` at the last
    step (total - 1), or constant."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(total - 1 - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    if schedule == "linear":
        decay = 1.0 - progress
    else:
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return final_ratio + (1.0 - final_ratio) * decay


def make_optimizer(model: torch.nn.Module, tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices and embeddings, not on biases and norms (as nanoGPT)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": tc.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=tc.lr, betas=tc.betas)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """None = plain fp32."""
    if precision == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision == "fp16" and device.type != "cuda":
        raise DistinctcapError("train.precision = 'fp16' needs a GPU; use fp32 or bf16 on CPU")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class NonFiniteLossError(DistinctcapError):
    """A NaN/inf loss or gradient: names the step and the captions of the batch."""

    def __init__(self, what: str, value: float, step: int, total: int, caption_ids: list[int]):
        self.step, self.caption_ids = step, caption_ids
        super().__init__(
            f"{what} is {value} at step {step} of {total}; batch caption ids: {caption_ids}. "
            "Training stopped without writing a checkpoint from this state; lower train.lr or "
            "check these captions and their images' features."
        )


# ---------------------------------------------------------------------------------------------
# Validation metrics (checkpoint selection)


@dataclass
class ValMetric:
    """fn(model, val data, val batches, autocast) -> value; `mode` min or max is better.
    `val batches` is the fixed subset of `train.val_captions` validation captions."""

    fn: Callable[[Captioner, CaptionData, list[Batch], Callable], float]
    mode: str


def val_loss(model: Captioner, val: CaptionData, batches: list[Batch], autocast: Callable):
    """Token cross-entropy of the validation captions (UNKT eq. 1), mean over all their
    non-pad tokens (token-weighted, so it does not depend on batch boundaries)."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            b = batch.to(device)
            with autocast():
                logits = model.decode(encode_batch(model, b), b.inputs)
            nll = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), b.labels.flatten(), ignore_index=PAD, reduction="sum"
            )
            total += float(nll)
            count += b.n_tokens
    return total / max(count, 1)


def self_retrieval(
    model: Captioner,
    val: CaptionData,
    batches: list[Batch],
    autocast: Callable,
    images: int = 100,
) -> float:
    """Model-based self-retrieval R@1 (CL §4.1, with the captioner as the retrieval model):
    greedy-decode a caption for each of the first `images` validation images and count how
    often log p(c_i | I_j) is largest for its own image j = i among those images."""
    from distinctcap.search import greedy, sequence_logprob

    rows = torch.unique(val.image_rows, sorted=True)[:images]
    grid, pooled = val.features.grid[rows].float(), val.features.pooled[rows]
    caps = greedy(model, grid, pooled)
    m = len(rows)
    pairs_img = torch.arange(m).repeat(m)  # caption i paired with every image j
    tokens = [c.tokens for c in caps for _ in range(m)]
    scores = sequence_logprob(model, grid, pooled, tokens, image_index=pairs_img).view(m, m)
    return float((scores.argmax(dim=1) == torch.arange(m)).float().mean())


# Selection metrics by name; `train.select_metric` names one. The evaluation stage may add
# more (e.g. "cider") with the same signature, and to the schema's enum.
VAL_METRICS: dict[str, ValMetric] = {
    "val_loss": ValMetric(val_loss, "min"),
    "self_retrieval": ValMetric(self_retrieval, "max"),
}


# ---------------------------------------------------------------------------------------------
# Loop state and checkpoints


@dataclass
class LoopState:
    step: int = 0  # optimiser steps done
    best_metric: float | None = None
    best_step: int | None = None
    best_state: dict | None = None  # CPU copy of the selected weights
    bad_evals: int = 0
    stopped_early: bool = False
    curve: list[dict] = field(default_factory=list)
    window: dict = field(default_factory=lambda: new_window())  # sums since the last row


def new_window() -> dict:
    """Sums since the last curve row; extras as [sum, count] since not every step reports
    every extra (e.g. a validation-only number)."""
    return {"loss": 0.0, "norm": 0.0, "n": 0, "tokens": 0, "seconds": 0.0, "extras": {}}


def _rng_state() -> dict:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": random.getstate(),
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _read_checkpoint(path: Path) -> dict | None:
    """The checkpoint at `path`, or None if there is none (another process may rename it)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None


def _show_path(value: object) -> str:
    if isinstance(value, list | tuple):
        return f"{value[0]} and {len(value) - 1} more" if len(value) > 1 else str(value[0])
    return str(value)


def _drop_resume_state(folder: Path) -> None:
    """Remove last.pt and temporaries of killed writes; set-aside stale-*.pt stay (the folder
    goes when nothing is left)."""
    for path in folder.glob("*"):
        if path.is_file() and not path.name.startswith("stale-"):
            path.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _cpu_state(model: torch.nn.Module) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _check_finite_params(model: torch.nn.Module, step: int) -> None:
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise DistinctcapError(
            f"parameters {bad[:5]} are not finite after step {step}; no checkpoint written. "
            "Lower train.lr or enable train.grad_clip."
        )


# ---------------------------------------------------------------------------------------------
# The stage


@dataclass
class TrainResult:
    model: Captioner  # with the selected weights, on the training device
    steps: int  # optimiser steps done
    metric: str
    best_metric: float | None
    best_step: int | None
    stopped_early: bool
    resumed_from: int | None  # step of the checkpoint this process started from
    curve: pd.DataFrame
    train_seconds: float  # time in training steps in this process (no setup, val, checkpoints)
    tokens_per_s: float


class Trainer:
    """One run's training; `run()` is the loop. Built by `train(cfg, data)`."""

    def __init__(self, cfg: dict, data: RunData):
        self.cfg, self.data = cfg, data
        self.tc = TrainConfig.from_dict(cfg.get("train", {}))
        self.dist = DistEnv.from_env()  # rank/world of torchrun processes (distinctcap.distributed)
        self.device = self.dist.device(resolve_device(cfg.get("device", "auto")))
        self.dist.init(self.device)
        self.dtype = autocast_dtype(self.tc.precision, self.device)
        self.seed = int(cfg.get("seed", 0))
        paths = cfg.get("paths", {})
        self.out_dir = Path(paths["out_dir"]) if paths.get("out_dir") else None
        method = cfg.get("method", "mle")
        if method not in METHODS:
            raise DistinctcapError(f"run method {method!r}: choose one of {sorted(METHODS)}")

        seed_everything(self.seed)
        self.model = self._build_model().to(self.device)
        broadcast_parameters(self.model, self.dist)
        self.reducer = GradientReducer(self.model, self.dist)
        objective_cls = METHODS[method]
        frozen = {edge: self._load_frozen(edge) for edge in objective_cls.needs}
        self.ctx = TrainContext(self.device, data.train, frozen, data.tokenizer, PAD)
        self.objective = objective_cls(cfg, self.ctx)
        self.mean_over = self.objective.mean_over  # for shard weights
        self.selection = self._selection_metric(self.tc.select_metric)
        self.optimizer = make_optimizer(self.model, self.tc)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            partial(
                lr_factor,
                warmup=self.tc.warmup_steps,
                total=self.tc.steps,
                schedule=self.tc.schedule,
                final_ratio=self.tc.final_lr_ratio,
            ),
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        groups = data.train.image_rows if self.tc.group_by_image else None
        self.order = BatchOrder(len(data.train), self.tc.batch_size, self.seed, groups)
        self.val_batches = self._val_subset()
        self.state = LoopState()
        self.last_lr = self.optimizer.param_groups[0]["lr"]
        self.fingerprint = fingerprint(cfg)

    # -- setup ---------------------------------------------------------------------------------

    def _build_model(self) -> Captioner:
        cap = dict(self.cfg.get("captioner", {}))
        vocab = cap.pop("vocab_size", None) or self.data.vocab_size
        if vocab is None:
            raise DistinctcapError(
                "captioner vocab_size unknown: give a tokenizer or captioner.vocab_size"
            )
        feats = self.data.train.features
        model = Captioner(
            CaptionerConfig(
                vocab_size=vocab,
                visual_dim=feats.grid.shape[-1],
                pooled_dim=feats.pooled.shape[-1],
                **cap,
            )
        )
        init = self.cfg.get("paths", {}).get("init")
        if self.cfg.get("init"):
            if not init:
                raise DistinctcapError(
                    f"run {self.cfg.get('name')}: init = "
                    f"{self.cfg['init']!r} but no init model path given"
                )
            try:
                model.load_state_dict(Captioner.load(init).state_dict())
            except RuntimeError as error:
                raise DistinctcapError(
                    f"init model {init} does not fit the captioner config: {str(error)[:300]}"
                ) from error
        return model

    def _load_frozen(self, edge: str) -> Captioner:
        path = self.cfg.get("paths", {}).get(edge)
        if not self.cfg.get(edge) or not path:
            raise DistinctcapError(
                f"run {self.cfg.get('name')}: method {self.cfg.get('method')!r} needs a "
                f"{edge} run (runs.<name>.{edge}) and its model path"
            )
        model = Captioner.load(path, map_location=self.device).eval()
        return model.requires_grad_(False)

    def _selection_metric(self, name: str) -> ValMetric:
        """The selection metric: a VAL_METRICS entry or one the objective computes itself (its
        `val_metrics`: name -> mode, and `val_metric(name, ...)`)."""
        own = self.objective.val_metrics
        if name in VAL_METRICS:
            return VAL_METRICS[name]
        if name in own:
            return ValMetric(partial(self.objective.val_metric, name), own[name])
        raise DistinctcapError(
            f"train.select_metric = {name!r}: choose one of {sorted(VAL_METRICS)}"
            + (f" or, for method {self.cfg.get('method')!r}, {sorted(own)}" if own else "")
        )

    def _val_subset(self) -> list[Batch]:
        val = self.data.val
        if val is None:
            return []
        idx = torch.arange(len(val))
        if 0 < self.tc.val_captions < len(val):
            g = torch.Generator().manual_seed(self.seed)
            idx = torch.randperm(len(val), generator=g)[: self.tc.val_captions].sort().values
        bs = self.tc.val_batch_size
        return [val.batch(idx[s : s + bs]) for s in range(0, len(idx), bs)]

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    # -- checkpoints ---------------------------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path | None:
        return self.out_dir / "checkpoints" / "last.pt" if self.out_dir else None

    def save_checkpoint(self) -> None:
        _check_finite_params(self.model, self.state.step)
        s = self.state
        ckpt = {
            "fingerprint": self.fingerprint.parts,
            "step": s.step,
            "micro_batch": s.step * self.tc.grad_accum,  # data position (BatchOrder index)
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": _rng_state(),
            "best": {
                "metric": s.best_metric,
                "step": s.best_step,
                "state": s.best_state,
                "bad_evals": s.bad_evals,
            },
            "curve": s.curve,
            "window": s.window,
            # an objective's state beyond the model (e.g. CL's replaced reference), {} if none
            "objective": self.objective.state_dict(),
        }
        with atomic_path(self.checkpoint_path) as tmp:
            torch.save(ckpt, tmp)

    def try_resume(self) -> int | None:
        """Continue from last.pt if its fingerprint is this run's; else set it aside."""
        path = self.checkpoint_path
        ckpt = _read_checkpoint(path) if path else None
        if ckpt is None:
            return None
        reason = self._stale_reason(ckpt.get("fingerprint"))
        if reason:
            self._set_aside(path, ckpt.get("fingerprint"), reason)
            return None
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        _set_rng_state(ckpt["rng"])
        if ckpt.get("objective") is not None:
            self.objective.load_state_dict(ckpt["objective"])
        best = ckpt["best"]
        self.state = LoopState(
            ckpt["step"],
            best["metric"],
            best["step"],
            best["state"],
            best["bad_evals"],
            False,
            ckpt["curve"],
            ckpt["window"],
        )
        log.info("resumed from %s at step %d", path, ckpt["step"])
        return ckpt["step"]

    def _stale_reason(self, old: object) -> str | None:
        """What differs between a checkpoint's fingerprint and this run's; None if nothing."""
        if not isinstance(old, dict):
            return "it has an old-format fingerprint without the inputs"
        paths = self.cfg.get("paths", {})
        said = []
        for key in self.fingerprint.changes(old):
            value = paths.get(key) if key in self.fingerprint.parts else "no longer an input"
            said.append(f"{key} changed" + (f": {_show_path(value)}" if value else ""))
        return ", ".join(said) or None

    def _set_aside(self, path: Path, old: object, reason: str) -> None:
        """Rename a checkpoint of other inputs to stale-<its hash>.pt and say why, in one line."""
        if not self.dist.is_main:
            return
        old_hash = Fingerprint(old).hash if isinstance(old, dict) else str(old or "unknown")
        stale = path.with_name(f"stale-{old_hash}.pt")
        with contextlib.suppress(FileNotFoundError):
            path.replace(stale)
        log.warning(
            "checkpoint %s set aside as %s (%s); training from step 0", path, stale.name, reason
        )

    # -- the loop ------------------------------------------------------------------------------

    def train_step(self) -> tuple[float, float, int, dict[str, float]]:
        """One optimiser step -> (loss, grad norm, tokens, objective extras)."""
        tc, s = self.tc, self.state
        self.model.train()
        loss_sum, tokens, extras = 0.0, 0, {}
        mine, whole = my_micro_batches(tc.grad_accum, self.dist)
        for m in mine:
            idx = self.order.indices(s.step * tc.grad_accum + m)
            batch = self.data.train.batch(idx if whole else shard(idx, self.dist))
            b = batch.to(self.device)
            with self.autocast():
                loss, extra = self.objective.loss(self.model, b, s.step, tc.steps)
            if not whole:  # the slice's share, so the slice losses sum to the micro-batch's
                loss = loss * shard_weight(self.data.train.lengths, idx, self.dist, self.mean_over)
            value = float(loss.detach())
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    "loss", value, s.step + 1, tc.steps, batch.caption_ids.tolist()
                )
            self.reducer.backward(self.scaler.scale(loss / tc.grad_accum), last=m == mine[-1])
            loss_sum += value / tc.grad_accum
            tokens += batch.n_tokens
            for k, v in extra.items():
                extras[k] = extras.get(k, 0.0) + float(v) / tc.grad_accum
        self.reducer.finish()
        loss_sum, tokens = all_reduce_sum([loss_sum, tokens], self.dist, self.device)
        tokens = int(tokens)
        # whole micro-batches: the ranks' parts sum to the step's mean; slices: average them
        sums = all_reduce_sum(list(extras.values()), self.dist, self.device)
        share = 1 if whole else self.dist.world_size
        extras = {k: v / share for k, v in zip(extras, sums, strict=True)}
        self.scaler.unscale_(self.optimizer)
        max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if not math.isfinite(norm) and not self.scaler.is_enabled():  # fp16 skips such steps
            raise NonFiniteLossError(
                "gradient norm", norm, s.step + 1, tc.steps, batch.caption_ids.tolist()
            )
        self.last_lr = self.optimizer.param_groups[0]["lr"]  # the lr this step used
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        s.step += 1
        return loss_sum, norm, tokens, extras

    def validate(self) -> dict[str, float]:
        """Selection metric (and val loss) on the validation captions; updates the best."""
        s, tc = self.state, self.tc
        self.model.eval()
        val = self.data.val
        metrics = {"val_loss": val_loss(self.model, val, self.val_batches, self.autocast)}
        if tc.select_metric not in metrics:
            fn = self.selection.fn
            metrics[tc.select_metric] = float(fn(self.model, val, self.val_batches, self.autocast))
        value = metrics[tc.select_metric]
        better = self.selection.mode == "min"
        improved = s.best_metric is None or (
            value < s.best_metric if better else value > s.best_metric
        )
        if improved:
            s.best_metric, s.best_step, s.bad_evals = value, s.step, 0
            s.best_state = _cpu_state(self.model)
        else:
            s.bad_evals += 1
            if tc.patience and s.bad_evals >= tc.patience:
                s.stopped_early = True
        return metrics

    def run(self) -> TrainResult:
        resumed = self.try_resume()  # replaces self.state
        tc, s = self.tc, self.state
        name = self.cfg.get("name", "run")
        log.info(
            "run %s: %s, %d parameters, %d training captions, %d steps of %d x %d on %s (%s)",
            name,
            self.cfg.get("method", "mle"),
            self.model.num_params(),
            len(self.data.train),
            tc.steps,
            tc.grad_accum,
            self.order.batch_size,
            self.device,
            self.dtype or "fp32",
        )
        train_seconds, total_tokens = 0.0, 0
        bar = tqdm(
            total=tc.steps,
            initial=s.step,
            unit="steps",
            desc=f"train {name}",
            mininterval=1.0,
            dynamic_ncols=True,
            disable=not self.dist.is_main,
        )
        while s.step < tc.steps and not s.stopped_early:
            t0 = time.perf_counter()
            loss, norm, tokens, extras = self.train_step()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            train_seconds += dt
            total_tokens += tokens
            s.window["loss"] += loss
            s.window["norm"] += norm
            s.window["n"] += 1
            s.window["tokens"] += tokens
            s.window["seconds"] += dt
            for k, v in extras.items():
                total, count = s.window["extras"].get(k, (0.0, 0))
                s.window["extras"][k] = [total + v, count + 1]
            bar.update(1)
            last = s.step == tc.steps
            do_val = bool(self.val_batches) and (
                last or (tc.val_every and s.step % tc.val_every == 0)
            )
            if s.step % tc.log_every == 0 or do_val or last:
                row = self._curve_row(s.window)
                bar.set_postfix(
                    loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}", refresh=False
                )
                s.window = new_window()
                if do_val:
                    if self.dist.is_main:  # the others wait for its early-stopping decision
                        row.update(self.validate())
                    s.stopped_early = broadcast_flag(s.stopped_early, self.dist, self.device)
                    log.info(
                        "step %d: %s",
                        s.step,
                        {
                            k: round(v, 4)
                            for k, v in row.items()
                            if k.startswith("val") or k == "loss"
                        },
                    )
                s.curve.append(row)
            if (
                tc.checkpoint_every
                and s.step % tc.checkpoint_every == 0
                and not last
                and self.checkpoint_path
                and not s.stopped_early
                and self.dist.is_main
            ):
                self.save_checkpoint()
        bar.close()
        _check_finite_params(self.model, s.step)
        if s.stopped_early:
            log.info(
                "early stop at step %d: no improvement of %s in %d validations",
                s.step,
                tc.select_metric,
                tc.patience,
            )
        if s.best_state is not None:
            self.model.load_state_dict(s.best_state)
        result = TrainResult(
            self.model,
            s.step,
            tc.select_metric,
            s.best_metric,
            s.best_step,
            s.stopped_early,
            resumed,
            pd.DataFrame(s.curve),
            train_seconds,
            total_tokens / train_seconds if train_seconds else 0.0,
        )
        if self.out_dir and self.dist.is_main:
            self.write_outputs(result)
        return result

    def _curve_row(self, window: dict) -> dict:
        n = max(window["n"], 1)
        row = {
            "step": self.state.step,
            "epoch": self.order.epoch_of(self.state.step * self.tc.grad_accum - 1),
            "lr": self.last_lr,
            "loss": window["loss"] / n,
            "grad_norm": window["norm"] / n,
            "tokens_per_s": window["tokens"] / max(window["seconds"], 1e-9),
        }
        row.update({k: total / count for k, (total, count) in window["extras"].items()})
        return row

    def write_outputs(self, result: TrainResult) -> None:
        out = self.out_dir
        self.model.save(out / "model.pt")
        with atomic_path(out / "curve.csv") as tmp:
            result.curve.to_csv(tmp, index=False)
        write_json(
            {
                "run": self.cfg.get("name"),
                "method": self.cfg.get("method", "mle"),
                "steps": result.steps,
                "metric": result.metric,
                "best_metric": result.best_metric,
                "best_step": result.best_step,
                "stopped_early": result.stopped_early,
                "resumed_from": result.resumed_from,
                "tokens_per_s": result.tokens_per_s,
                "train_seconds": result.train_seconds,
                "parameters": self.model.num_params(),
                "processes": self.dist.world_size,
                "fingerprint": self.fingerprint.hash,
                "inputs": self.fingerprint.parts,
                "config": {k: v for k, v in self.cfg.items() if k != "paths"},
            },
            out / "summary.json",
        )
        _drop_resume_state(out / "checkpoints")


def train(cfg: dict, data: RunData | None = None) -> TrainResult:
    """Train one run (see the module doc). `data` defaults to `load_run_data(cfg)`."""
    cfg = copy.deepcopy(cfg)
    if data is None:
        data = load_run_data(cfg)
    trainer = Trainer(cfg, data)
    try:
        return trainer.run()
    finally:
        trainer.dist.close()
