"""The trainer: one loop for every training method, deterministic on CPU and resumable.

`train(run, paths, device, data=None) -> TrainResult` is the whole stage, callable from tests.
`run` is a run's effective config (`distinctcap.config.rungraph.effective_run_config`) as a
`distinctcap.core.run.RunConfig`: its `runs:` block (method, data, init/teacher/reference,
method options), `seed`, `captioner` (architecture, CaptionerConfig fields) and `train` (a
core.settings.TrainConfig: the top-level `train` block with the run's `train` overrides on top).
`paths` (RunPaths) names its input files and its output folder; the Snakemake rule's script
fills it from the rule's inputs and output.

The loop, per optimiser step: gather `grad_accum` micro-batches (the data order is a pure
function of (seed, epoch), with an image's captions together by default so each image is
encoded once per batch, features/batches.py), loss = the method's objective (distinctcap.methods)
under autocast (bf16, or fp16 with a GradScaler, on GPU; fp32 on CPU), backward of loss /
grad_accum, gradient clipping, AdamW, learning-rate schedule (linear warm-up then linear or
cosine decay: the papers warm up 3,000 steps to 3e-4, UNKT §4.1). Every `val_every` steps the
selection metric (val_loss, self_retrieval, or one the objective computes itself) is computed on
the validation captions; the best weights are kept (checkpoint selection) and `patience`
validations without improvement stop the run (early stopping).

Resume: every `checkpoint_every` steps, and every `checkpoint_minutes` of wall time (a job
near its time limit keeps at most that much work), `<out_dir>/checkpoints/last.pt`, the only
checkpoint kept, is replaced atomically
with the model, optimiser, scheduler, scaler, RNG states (torch, CUDA, numpy, python), the data
position, the best weights so far, the curve, the objective's own state (its state_dict), and
the run's fingerprint: content hashes of its effective config and of every input in `paths`.
The trainer assembles that dict and restores from it; `distinctcap.train.checkpoints` computes
the fingerprint and owns the file. A rerun whose fingerprint matches continues from it and ends
with the same weights as an uninterrupted run; otherwise the checkpoint is set aside as
`checkpoints/stale-<its hash>.pt` with one log line naming what changed, and training starts
from step 0.

A non-finite loss or gradient stops the run with `NonFiniteLossError` (step and caption ids): on
the CPU at once, on a GPU when `DeferredStats` reads the steps' numbers (one host sync, only at
log, validation and checkpoint steps); parameters are checked finite before any checkpoint is
written, so a broken state is never saved.

Outputs in `<out_dir>`: model.pt (selected weights, `Captioner.load`-able), curve.csv (one row
per log/validation step: step, epoch, lr, loss, grad_norm, tokens_per_s, val_* and the
objective's own numbers) and summary.json (with the fingerprint and its parts, `inputs`).
last.pt is removed on success; set-aside checkpoints stay."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from distinctcap.captioner.hf import HFCaptioner
from distinctcap.captioner.load import load_captioner
from distinctcap.captioner.model import Captioner, CaptionerConfig, DecoderBlock, EncoderBlock
from distinctcap.core import logs, work
from distinctcap.core.distributed import (
    DistEnv,
    GradientReducer,
    broadcast_flag,
    broadcast_parameters,
    my_micro_batches,
    shard,
    shard_weight,
)
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, write_json
from distinctcap.core.logs import progress
from distinctcap.core.run import RunConfig, RunPaths
from distinctcap.core.settings import TrainConfig
from distinctcap.data.tokenizer import PAD
from distinctcap.features.batches import Batch, BatchOrder, encode_batch
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext
from distinctcap.train.checkpoints import (
    Checkpoints,
    fingerprint,
    rng_state,
    run_checkpoint,
    seed_everything,
    set_rng_state,
)
from distinctcap.train.data import DeviceCaptions, RunData, load_run_data, to_device
from distinctcap.train.schedule import autocast_dtype, lr_factor, make_optimizer
from distinctcap.train.selection import (
    VAL_METRICS,
    ValMetric,
    val_loss,
)
from distinctcap.train.stats import DeferredStats, StepStats

log = logging.getLogger(__name__)


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


def sorted_counts(counts: Counter) -> dict[str, int]:
    return {k: int(counts[k]) for k in sorted(counts)}


def _cpu_state(model: torch.nn.Module) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _check_finite_params(model: torch.nn.Module, step: int) -> None:
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise DistinctcapError(
            f"parameters {bad[:5]} are not finite after step {step}; no checkpoint written. "
            "Lower train.lr or enable train.grad_clip."
        )


def compile_blocks(model: Captioner, probe: Callable[[], None], backend: str) -> str | None:
    """torch.compile each encoder and decoder block of `model` in place (the objectives call
    encode / decode / decode_step, which a wrapper of `forward` would bypass; in place, the
    state_dict keys stay). `probe()` runs one forward and backward so that a compiler failing
    only at its first call fails here. Returns None, or why compiling failed; then the blocks
    are left uncompiled."""
    blocks = [m for m in model.modules() if isinstance(m, EncoderBlock | DecoderBlock)]
    if not blocks:
        return "the captioner has no native blocks to compile (captioner.kind transformers)"
    # one block's code serves training, decoding with a cache, internals (UNKT) and the frozen
    # models, in several precisions: more variants than dynamo's default 8, after which it
    # would run the block uncompiled without a word
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    try:
        for block in blocks:
            block.compile(backend=backend)
        probe()
    except Exception as error:  # noqa: BLE001 - any compiler failure means: train uncompiled
        for block in blocks:
            block._compiled_call_impl = None
        lines = str(error).strip().splitlines()
        return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"
    return None


def compile_wanted(setting: bool | str, device: torch.device) -> bool:
    """train.compile: true, false, or auto (on a GPU only)."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


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
    work: dict = field(default_factory=dict)  # Trainer.work_record, summary.json's `work`


def warn_if_capped(run: str, key: str, value: int, limit: int, which: str) -> None:
    """train.`key` larger than the run's `which` captions: capped, with one warning."""
    logs.warn_if_capped(log, f"run {run}: train.{key}", value, limit,
                        f"the run's {limit} {which} captions")  # fmt: skip


class Trainer:
    """One run's training; `run()` is the loop. Built by `train(run, paths, device, data)`."""

    def __init__(self, run: RunConfig, paths: RunPaths, device: torch.device, data: RunData):
        self.run_config, self.paths, self.data = run, paths, data
        self.tc: TrainConfig = run.train.in_steps(len(data.train))
        # rank/world of torchrun processes (distinctcap.core.distributed)
        self.dist = DistEnv.from_env()
        self.device = self.dist.device(device)
        self.dist.init(self.device)
        self.dtype = autocast_dtype(self.tc.precision, self.device)
        self.seed = int(run.seed)
        self.out_dir = Path(paths.out_dir) if paths.out_dir else None
        method = run.method
        if method not in METHODS:
            raise DistinctcapError(f"run method {method!r}: choose one of {sorted(METHODS)}")

        seed_everything(self.seed)
        self.model = self._build_model().to(self.device)
        broadcast_parameters(self.model, self.dist)
        self.reducer = GradientReducer(self.model, self.dist)
        objective_cls = METHODS[method]
        frozen = {edge: self._load_frozen(edge) for edge in objective_cls.needs}
        self.ctx = TrainContext(self.device, data.train, frozen, data.tokenizer, PAD, paths.inputs)
        self.objective = self._make_objective(objective_cls)
        # after the models, so the memory check sees what they take
        self.batches = DeviceCaptions(data.train, self.device)
        self.mean_over = self.objective.mean_over  # for shard weights
        self.selection = self._selection_metric(self.tc.select_metric)
        self.optimizer = make_optimizer(self.model, self.tc, self.device)
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
        warn_if_capped(run.name, "batch_size", self.tc.batch_size, len(data.train), "training")
        groups = data.train.image_rows if self.tc.group_by_image else None
        self.order = BatchOrder(len(data.train), self.tc.batch_size, self.seed, groups)
        self.val_batches = self._val_subset()
        self.state = LoopState()
        self.last_lr = self.optimizer.param_groups[0]["lr"]
        self.fingerprint = fingerprint(run.effective(), paths.inputs)
        self.checkpoints = Checkpoints(
            run_checkpoint(self.out_dir), self.fingerprint, log, paths.inputs, self.dist.is_main
        )
        self.checkpointed_at = time.monotonic()  # for checkpoint_minutes (wall time only)
        # On a GPU the host reads the step's numbers (loss, gradient norm, extras) and checks
        # them only at flushes (log, validation and checkpoint steps), so it never waits for
        # the GPU in between; on the CPU every step, before the optimiser step, as always.
        self.eager = self.device.type != "cuda"
        self.stats = DeferredStats(self.tc.steps, self.tc.grad_accum, not self.scaler.is_enabled())
        self.window_start: float | None = None
        self.train_seconds, self.total_tokens = 0.0, 0
        # the run's work as its sources count it (distinctcap.core.work): steps, examples,
        # tokens, decoded captions, ..., and one entry per validation pass; checkpointed
        self.work_counts: Counter = Counter()
        self.validations: list[dict] = []
        if compile_wanted(self.tc.compile, self.device):
            self._compile()

    # -- setup ---------------------------------------------------------------------------------

    def _build_model(self) -> Captioner:
        model = self._new_model()
        init = self.paths.inputs.get("init")
        if self.run_config.init:
            if not init:
                raise DistinctcapError(
                    f"run {self.run_config.name}: init = {self.run_config.init!r} but no init "
                    "model path given"
                )
            try:
                model.load_state_dict(load_captioner(init).state_dict())
            except RuntimeError as error:
                raise DistinctcapError(
                    f"init model {init} does not fit the captioner config: {str(error)[:300]}"
                ) from error
        return model

    def _new_model(self) -> Captioner:
        cap = dict(self.run_config.captioner)
        if self.run_config.pretrained:
            vision = cap.get("vision", "frozen")
            return HFCaptioner.from_pretrained(cap["pretrained"], cap["max_len"], vision)
        vocab = cap.pop("vocab_size", None) or self.data.vocab_size
        if vocab is None:
            raise DistinctcapError(
                "captioner vocab_size unknown: give a tokenizer or captioner.vocab_size"
            )
        feats = self.data.train.features
        return Captioner(
            CaptionerConfig(
                vocab_size=vocab,
                visual_dim=feats.grid.shape[-1],
                pooled_dim=feats.pooled.shape[-1],
                **cap,
            )
        )

    def _load_frozen(self, edge: str) -> Captioner:
        path = self.paths.inputs.get(edge)
        if not getattr(self.run_config, edge) or not path:
            raise DistinctcapError(
                f"run {self.run_config.name}: method {self.run_config.method!r} needs a "
                f"{edge} run (runs.<name>.{edge}) and its model path"
            )
        model = load_captioner(path, map_location=self.device).eval()
        return model.requires_grad_(False)

    def _make_objective(self, objective_cls: type) -> object:
        """The run's objective (a hook: bench/bench_steps.py hands specificity its CLIP)."""
        return objective_cls(self.run_config, self.ctx)

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
            + (f" or, for method {self.run_config.method!r}, {sorted(own)}" if own else "")
        )

    def _val_subset(self) -> list[Batch]:
        val = self.data.val
        if val is None:
            return []
        idx = torch.arange(len(val))
        warn_if_capped(self.run_config.name, "val_captions", self.tc.val_captions, len(val),
                       "validation")  # fmt: skip
        if 0 < self.tc.val_captions < len(val):
            g = torch.Generator().manual_seed(self.seed)
            idx = torch.randperm(len(val), generator=g)[: self.tc.val_captions].sort().values
        bs = self.tc.val_batch_size
        return [val.batch(idx[s : s + bs]) for s in range(0, len(idx), bs)]

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def _compile(self) -> None:
        backend = os.environ.get("DISTINCTCAP_COMPILE_BACKEND", "inductor")

        def probe() -> None:  # one forward/backward; the RNG and the gradients as before
            rng = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=rng, device_type=self.device.type):
                b = to_device(self.data.train.batch(self.order.indices(0)), self.device)
                self.model.train()
                with self.autocast():
                    logits = self.model.decode(encode_batch(self.model, b), b.inputs)
                logits.float().sum().backward()
            self.model.zero_grad(set_to_none=True)

        why = compile_blocks(self.model, probe, backend)
        if why:
            msg = "train.compile: torch.compile (%s) failed, training uncompiled: %s"
            log.warning(msg, backend, why)
            return
        self._compile_frozen(backend)
        log.info("train.compile: encoder and decoder blocks compiled (%s)", backend)

    def _compile_frozen(self, backend: str) -> None:
        """The frozen teacher / reference compiled as the model (they run in every step)."""

        def probe(model: Captioner) -> None:  # a forward, as the objectives run it
            b = to_device(self.data.train.batch(self.order.indices(0)), self.device)
            with torch.no_grad(), self.autocast():
                model.decode(encode_batch(model, b), b.inputs)

        for edge, frozen in self.ctx.frozen.items():
            why = compile_blocks(frozen, partial(probe, frozen), backend)
            if why:
                log.warning("train.compile: the %s stays uncompiled: %s", edge, why)

    # -- checkpoints ---------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        _check_finite_params(self.model, self.state.step)
        s = self.state
        self.checkpoints.save(
            {
                "step": s.step,
                "micro_batch": s.step * self.tc.grad_accum,  # data position (BatchOrder index)
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rng_state(),
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
                "work": {"counts": dict(self.work_counts), "validations": self.validations},
            }
        )
        self.checkpointed_at = time.monotonic()

    def try_resume(self) -> int | None:
        """Continue from last.pt if its fingerprint is this run's (else Checkpoints sets it
        aside)."""
        ckpt = self.checkpoints.load()
        if ckpt is None:
            return None
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        set_rng_state(ckpt["rng"])
        if ckpt.get("objective") is not None:
            self.objective.load_state_dict(ckpt["objective"])
        done = ckpt.get("work") or {"counts": {}, "validations": []}  # none before issue 46
        self.work_counts, self.validations = Counter(done["counts"]), list(done["validations"])
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
        log.info("resumed from %s at step %d", self.checkpoints.path, ckpt["step"])
        return ckpt["step"]

    # -- the loop ------------------------------------------------------------------------------

    def train_step(self) -> StepStats:
        """One optimiser step; its numbers stay on the device (StepStats, read by `flush`)."""
        tc, s = self.tc, self.state
        self.model.train()
        losses, ids, extras, tokens = [], [], [], 0
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # DDP only
        mine, whole = my_micro_batches(tc.grad_accum, self.dist)
        for m in mine:
            idx = self.order.indices(s.step * tc.grad_accum + m)
            positions = idx if whole else shard(idx, self.dist)
            batch = self.gather(positions)
            with self.autocast():
                loss, extra = self.objective.loss(self.model, batch, s.step, tc.steps)
            if not whole:  # the slice's share, so the slice losses sum to the micro-batch's
                loss = loss * shard_weight(self.data.train.lengths, idx, self.dist, self.mean_over)
            value = loss.detach()
            if self.eager:  # stop before the backward of a bad loss (on a GPU: at the flush)
                self.stats.check("loss", float(value), s.step + 1, batch.caption_ids)
            self.reducer.backward(self.scaler.scale(loss / tc.grad_accum), last=m == mine[-1])
            losses.append(value)
            ids.append(batch.caption_ids)
            extras.append(extra)
            n_tokens = self.batches.tokens(positions)
            tokens += n_tokens
            work.count("examples", len(positions))
            work.count("tokens", n_tokens)
            if self.dist.active:  # as float(value) / grad_accum summed in float64
                loss_sum += value.double() / tc.grad_accum
        self.reducer.finish()
        reduced = None
        if self.dist.active:  # issued now, read at the flush; the ranks' parts sum to the step's
            count = torch.tensor(float(tokens), dtype=torch.float64, device=self.device)
            reduced = torch.stack([loss_sum, count])
            torch.distributed.all_reduce(reduced)
        self.scaler.unscale_(self.optimizer)
        max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm).detach()
        if self.eager and self.stats.check_norm:  # fp16 skips non-finite steps itself
            self.stats.check("gradient norm", float(norm), s.step + 1, batch.caption_ids)
        self.last_lr = self.optimizer.param_groups[0]["lr"]  # the lr this step used
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        s.step += 1
        work.count("steps")
        return StepStats(s.step, losses, ids, norm, tokens, extras, reduced)

    def gather(self, idx: torch.Tensor) -> Batch:
        """The training captions at positions `idx`, on the device (DeviceCaptions)."""
        return self.batches.batch(idx)

    def flush(self) -> None:
        """Read the pending steps' numbers (`DeferredStats.resolve`: one sync, checked in step
        order) and add them to the curve window, with the time since the last flush."""
        steps = self.stats.resolve()
        if not steps:
            return
        seconds = time.perf_counter() - self.window_start
        self.window_start = None
        self.train_seconds += seconds
        w = self.state.window
        for n in steps:
            self.total_tokens += n.tokens
            w["loss"] += n.loss
            w["norm"] += n.norm
            w["n"] += 1
            w["tokens"] += n.tokens
            for k, v in n.extras.items():
                total, count = w["extras"].get(k, (0.0, 0))
                w["extras"][k] = [total + v, count + 1]
        w["seconds"] += seconds

    def validate(self) -> dict[str, float]:
        """Selection metric (and val loss) on the validation captions; updates the best."""
        s, tc = self.state, self.tc
        self.model.eval()
        val = self.data.val
        with work.counting() as counted:
            metrics = {"val_loss": val_loss(self.model, val, self.val_batches, self.autocast)}
            if tc.select_metric not in metrics:
                fn = self.selection.fn
                value = fn(self.model, val, self.val_batches, self.autocast)
                metrics[tc.select_metric] = float(value)
        done = {"step": s.step, "metrics": list(metrics), **sorted_counts(counted)}
        self.validations.append(done)
        value = metrics[tc.select_metric]
        if not self.objective.selectable(s.step, tc.steps):
            return metrics
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
        with work.counting(self.work_counts):
            return self._loop(resumed)

    def _loop(self, resumed: int | None) -> TrainResult:
        tc, s = self.tc, self.state
        self._log_start()
        bar = progress(
            total=tc.steps,
            initial=s.step,
            unit="steps",
            desc=f"train {self.run_config.name}",
            mininterval=1.0,
            dynamic_ncols=True,
            disable=not self.dist.is_main,
        )
        while s.step < tc.steps and not s.stopped_early:
            if self.window_start is None:
                self.window_start = time.perf_counter()
            self.stats.add(self.train_step())
            bar.update(1)
            do_val, do_log, do_checkpoint = self._due()
            if self.eager or do_log or do_checkpoint:
                self.flush()  # before a curve row, a validation or a checkpoint
            if do_log:
                self._log_row(bar, do_val)
            if do_checkpoint and not s.stopped_early:
                self.save_checkpoint()
        self.flush()
        bar.close()
        return self._finish(resumed)

    def _log_start(self) -> None:
        log.info(
            "run %s: %s, %d parameters, %d training captions, %d steps of %d x %d on %s (%s)",
            self.run_config.name,
            self.run_config.method,
            self.model.num_params(),
            len(self.data.train),
            self.tc.steps,
            self.tc.grad_accum,
            self.order.batch_size,
            self.device,
            self.dtype or "fp32",
        )

    def _due(self) -> tuple[bool, bool, bool]:
        """After the step just taken: (validate, write a curve row, write a checkpoint)?"""
        tc, step = self.tc, self.state.step
        last = step == tc.steps
        every_val = bool(tc.val_every and step % tc.val_every == 0)
        do_val = bool(self.val_batches) and (last or every_val)
        do_log = step % tc.log_every == 0 or do_val or last
        every = bool(tc.checkpoint_every and step % tc.checkpoint_every == 0)
        do_checkpoint = bool(
            (every or self._checkpoint_time())
            and not last
            and self.checkpoints.path
            and self.dist.is_main
        )
        return do_val, do_log, do_checkpoint

    def _checkpoint_time(self) -> bool:
        """Has `checkpoint_minutes` of wall time passed since the last checkpoint (or start)?
        Only when a checkpoint is written depends on it, never what is computed."""
        minutes = self.tc.checkpoint_minutes
        return bool(minutes) and time.monotonic() - self.checkpointed_at >= 60 * minutes

    def _log_row(self, bar, do_val: bool) -> None:
        """A curve row of the window since the last one, with the validation when it is due
        (run by the main process; the others wait for its early-stopping decision)."""
        s = self.state
        row = self._curve_row(s.window)
        bar.set_postfix(
            loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}", refresh=False
        )
        s.window = new_window()
        if do_val:
            if self.dist.is_main:
                row.update(self.validate())
            s.stopped_early = broadcast_flag(s.stopped_early, self.dist, self.device)
            shown = {k: round(v, 4) for k, v in row.items() if k.startswith("val") or k == "loss"}
            log.info("step %d: %s", s.step, shown)
        s.curve.append(row)

    def _finish(self, resumed: int | None) -> TrainResult:
        """The selected weights in the model, the result, and the run folder's outputs."""
        tc, s = self.tc, self.state
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
        seconds = self.train_seconds
        result = TrainResult(
            self.model,
            s.step,
            tc.select_metric,
            s.best_metric,
            s.best_step,
            s.stopped_early,
            resumed,
            pd.DataFrame(s.curve),
            seconds,
            self.total_tokens / seconds if seconds else 0.0,
            self.work_record(),
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
                "run": self.run_config.name,
                "method": self.run_config.method,
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
                "config": self.run_config.effective(),
                "work": result.work,
            },
            out / "summary.json",
        )
        self.checkpoints.drop()

    def work_record(self) -> dict:
        """summary.json's `work`: what this run computed, counted where it was computed
        (distinctcap.core.work): optimiser steps, training examples (captions) and tokens
        (non-pad target tokens) of this process, captions decoded during the steps (UNKT's
        teacher, specificity's own captions), CL's negatives scored, and per validation pass
        its step, metric names and the captions it decoded and scored."""
        return {**sorted_counts(self.work_counts), "validations": self.validations}


def train(
    run: RunConfig, paths: RunPaths, device: torch.device, data: RunData | None = None
) -> TrainResult:
    """Train one run on `device` (see the module doc). `data` defaults to
    `load_run_data(run, paths)`."""
    if data is None:
        data = load_run_data(run, paths)
    trainer = Trainer(run, paths, device, data)
    try:
        return trainer.run()
    finally:
        trainer.dist.close()
