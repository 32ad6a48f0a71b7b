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

Around the loop: the models (`train.models`), compiling them (`train.compiling`), the loop's
state and what a checkpoint holds (`train.state`), the run folder's outputs (`train.outputs`).

Resume: every `checkpoint_every` steps, and every `checkpoint_minutes` of wall time (a job
near its time limit keeps at most that much work), `<out_dir>/checkpoints/last.pt`, the only
checkpoint kept, is replaced atomically (`distinctcap.train.checkpoints`). It is resumed only
when its fingerprint, content hashes of the run's effective config and of every input in
`paths`, is this run's, and then the run ends with the weights of an uninterrupted one;
otherwise it is set aside as `checkpoints/stale-<its hash>.pt` with one log line naming what
changed, and training starts from step 0. last.pt is removed on success.

A non-finite loss or gradient stops the run with `NonFiniteLossError` (step and caption ids): on
the CPU at once, on a GPU when `DeferredStats` reads the steps' numbers (one host sync, only at
log, validation and checkpoint steps); parameters are checked finite before any checkpoint is
written, so a broken state is never saved."""

from __future__ import annotations

import contextlib
import logging
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from distinctcap.captioner.model import Captioner
from distinctcap.core import work
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
from distinctcap.core.logs import progress
from distinctcap.core.run import RunConfig, RunPaths
from distinctcap.core.settings import TrainConfig
from distinctcap.data.tokenizer import PAD
from distinctcap.features.batches import Batch, BatchOrder
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext
from distinctcap.train.board import CurveBoard, open_board
from distinctcap.train.checkpoints import Checkpoints, fingerprint, run_checkpoint, seed_everything
from distinctcap.train.compiling import compile_run, compile_wanted
from distinctcap.train.data import (
    DeviceCaptions,
    RunData,
    load_run_data,
    to_device,
    validation_batches,
    warn_if_capped,
)
from distinctcap.train.models import build_model, load_frozen
from distinctcap.train.outputs import TrainResult, write_outputs
from distinctcap.train.schedule import autocast_dtype, make_optimizer, make_scheduler
from distinctcap.train.selection import VAL_METRICS, ValMetric, val_loss
from distinctcap.train.state import (
    LoopState,
    Resumable,
    WorkDone,
    add_steps,
    check_finite_params,
    checkpoint_contents,
    curve_row,
    new_window,
    restore,
    sorted_counts,
)
from distinctcap.train.stats import DeferredStats, StepStats

log = logging.getLogger(__name__)


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
        self.model = build_model(run, paths, data).to(self.device)
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
        self.scheduler = make_scheduler(self.optimizer, self.tc)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        warn_if_capped(run.name, "batch_size", self.tc.batch_size, len(data.train), "training")
        groups = data.train.image_rows if self.tc.group_by_image else None
        self.order = BatchOrder(len(data.train), self.tc.batch_size, self.seed, groups)
        self.val_batches = validation_batches(
            data.val, run.name, self.tc.val_captions, self.tc.val_batch_size, self.seed
        )
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
        self.work_done = WorkDone()  # what the run computed (core.work); checkpointed
        self.board: CurveBoard | None = None  # opened by run()
        if compile_wanted(self.tc.compile, self.device):
            compile_run(self.model, self.ctx.frozen, self._first_batch, self.autocast, self.device)

    # -- setup ---------------------------------------------------------------------------------

    def _load_frozen(self, edge: str) -> Captioner:
        """The frozen model at `edge` (a hook: bench/bench_steps.py hands in its own)."""
        return load_frozen(self.run_config, self.paths, edge, self.device)

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

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def _first_batch(self) -> Batch:
        """The first micro-batch, on the device (compile_run's probe)."""
        return to_device(self.data.train.batch(self.order.indices(0)), self.device)

    # -- checkpoints ---------------------------------------------------------------------------

    def _resumable(self) -> Resumable:
        return Resumable(self.model, self.optimizer, self.scheduler, self.scaler, self.objective)

    def save_checkpoint(self) -> None:
        contents = checkpoint_contents(
            self.state, self.tc.grad_accum, self._resumable(), self.work_done
        )
        self.checkpoints.save(contents)
        self.checkpointed_at = time.monotonic()

    def try_resume(self) -> int | None:
        """Continue from last.pt if its fingerprint is this run's (else Checkpoints sets it
        aside)."""
        ckpt = self.checkpoints.load()
        if ckpt is None:
            return None
        self.state, self.work_done = restore(ckpt, self._resumable())
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
        self.total_tokens += sum(n.tokens for n in steps)
        add_steps(self.state.window, steps, seconds)

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
        self.work_done.validations.append(done)
        if self.objective.selectable(s.step, tc.steps):
            s.add_validation(metrics[tc.select_metric], self.selection.mode, self.model,
                             tc.patience)  # fmt: skip
        return metrics

    def run(self) -> TrainResult:
        resumed = self.try_resume()  # replaces self.state
        if self.out_dir and self.dist.is_main:  # live curves beside curve.csv (train.board)
            self.board = open_board(self.out_dir, resumed)
        try:
            with work.counting(self.work_done.counts):
                return self._loop(resumed)
        finally:
            if self.board:
                self.board.close()

    def _loop(self, resumed: int | None) -> TrainResult:
        tc, s = self.tc, self.state
        self._log_start()
        bar = progress(total=tc.steps, initial=s.step, unit="steps",
                       desc=f"train {self.run_config.name}", mininterval=1.0,
                       dynamic_ncols=True, disable=not self.dist.is_main)  # fmt: skip
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
        run, tc = self.run_config, self.tc
        log.info("run %s: %s, %d parameters, %d training captions, %d steps of %d x %d on %s (%s)",
                 run.name, run.method, self.model.num_params(), len(self.data.train),
                 tc.steps, tc.grad_accum, self.order.batch_size, self.device,
                 self.dtype or "fp32")  # fmt: skip

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
        epoch = self.order.epoch_of(s.step * self.tc.grad_accum - 1)
        row = curve_row(s.window, s.step, epoch, self.last_lr)
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
        if self.board:
            self.board.add(row)

    def _finish(self, resumed: int | None) -> TrainResult:
        """The selected weights in the model, the result, and the run folder's outputs."""
        tc, s = self.tc, self.state
        check_finite_params(self.model, s.step)
        if s.stopped_early:
            log.info("early stop at step %d: no improvement of %s in %d validations",
                     s.step, tc.select_metric, tc.patience)  # fmt: skip
        if s.best_state is not None:
            self.model.load_state_dict(s.best_state)
        seconds = self.train_seconds
        result = TrainResult(
            self.model, s.step, tc.select_metric, s.best_metric, s.best_step, s.stopped_early,
            resumed, pd.DataFrame(s.curve), seconds,
            self.total_tokens / seconds if seconds else 0.0, self.work_done.record(),
        )  # fmt: skip
        if self.out_dir and self.dist.is_main:
            write_outputs(self.out_dir, result, self.run_config, self.fingerprint,
                          self.dist.world_size)  # fmt: skip
            self.checkpoints.drop()
        return result


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
