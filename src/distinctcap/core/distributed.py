"""Multi-GPU training: the collective pieces the trainer uses, with DDP's arithmetic.

A run whose job holds W > 1 GPUs is started in W torchrun processes by distinctcap.train.launch;
each calls `distinctcap.train.trainer.train(run, paths, device)`, which reads its rank from
the environment torchrun sets (`DistEnv.from_env`) and uses GPU `LOCAL_RANK` (gloo on CPU,
NCCL on GPUs). This module imports nothing of the project but its errors, so the trainer
imports it without a cycle.

The global batch does not depend on W. A step's `train.grad_accum` = A micro-batches of
`train.batch_size` captions (the same captions as in a one-process run, features/batches.py) are
shared out (`my_micro_batches`): when A is a multiple of W, rank r takes whole micro-batches
r, r + W, ..., so each GPU works on full batches, as in one process; otherwise every
micro-batch is cut into W slices (`shard`) and each rank weights its slice's loss by its share
of the micro-batch (`shard_weight`: its non-pad tokens / the micro-batch's, for objectives that
average over tokens; captions / captions for `mean_over = "captions"`). Either way the
gradients summed over the ranks are the gradient of the one-process step, so every rank takes
the optimiser step of the one-process run and the loss curve is the same up to float rounding
(tests/test_distributed.py). The number of GPUs is thus a platform choice (profile) that does
not change a result; a checkpoint's data position (the global micro-batch counter) does not
depend on W either.

The sum is DDP's reducer (`GradientReducer`): gradients are grouped in ~25 MB buckets in
reverse parameter order, and during the backward of a rank's last micro-batch of the step each
bucket is all-reduced asynchronously as soon as all its gradients are accumulated, so the
communication overlaps the rest of the backward (earlier micro-batches accumulate locally, as
under DDP's `no_sync`). Buckets are launched in a fixed order so every rank issues the same
collectives. Why not the DistributedDataParallel wrapper itself: the objectives call the
captioner's encode / decode / decode_step directly (CL, specificity), which bypasses the
wrapper's forward, and without that forward its gradient hooks do nothing.

Rank 0 alone validates, writes checkpoints, outputs and log lines and shows the progress bar
(any rank appends its warnings and the error that stops it to the log); the early-stopping
decision is broadcast from rank 0 so the processes always stop together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from distinctcap.core.errors import DistinctcapError

MEAN_OVER = ("tokens", "captions")


@dataclass(frozen=True)
class DistEnv:
    """This process's place among the training processes (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> DistEnv:
        """From torchrun's RANK / WORLD_SIZE / LOCAL_RANK; a plain process is rank 0 of 1."""
        env = os.environ if environ is None else environ
        world = int(env.get("WORLD_SIZE", 1))
        rank, local = int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0))
        if world < 1 or not 0 <= rank < world:
            raise DistinctcapError(f"RANK={rank} WORLD_SIZE={world}: need 0 <= RANK < WORLD_SIZE")
        return cls(rank, world, local)

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """The process's device: cuda becomes cuda:LOCAL_RANK (one GPU per process)."""
        if not self.active or device.type != "cuda":
            return device
        if self.local_rank >= torch.cuda.device_count():
            raise DistinctcapError(
                f"process {self.rank} wants GPU {self.local_rank} but only "
                f"{torch.cuda.device_count()} are visible; start one process per GPU"
            )
        torch.cuda.set_device(self.local_rank)
        return torch.device("cuda", self.local_rank)

    def init(self, device: torch.device) -> None:
        """Join the process group (NCCL for GPUs, gloo for CPU); no-op for one process."""
        if self.active and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Data parallel pieces used by the trainer (each a no-op for one process)


def my_micro_batches(grad_accum: int, env: DistEnv) -> tuple[list[int], bool]:
    """This rank's micro-batches of a step (indices into 0..grad_accum-1) and whether it takes
    them whole: rank r takes r, r + W, ... when W divides grad_accum, else a slice of each."""
    if env.active and grad_accum % env.world_size == 0:
        return list(range(env.rank, grad_accum, env.world_size)), True
    return list(range(grad_accum)), not env.active


def shard(indices: Tensor, env: DistEnv) -> Tensor:
    """This rank's captions of a micro-batch `indices` (B,): the rank-th of W contiguous
    slices of sizes differing by at most one. Contiguous, so the captions of one image, which
    BatchOrder keeps next to each other, mostly stay on one process and its image is encoded
    once (features/batches.py encode_batch)."""
    if not env.active:
        return indices
    if len(indices) < env.world_size:
        raise DistinctcapError(
            f"a micro-batch of {len(indices)} captions cannot be split over {env.world_size} "
            "processes; raise train.batch_size or use fewer GPUs"
        )
    return torch.tensor_split(indices, env.world_size)[env.rank]


def shard_weight(lengths: Tensor, indices: Tensor, env: DistEnv, mean_over: str = "tokens"):
    """Weight of this rank's shard loss so that the weighted shard losses sum to the loss of
    the whole micro-batch `indices`: the shard's share of the non-pad tokens (`lengths` (C,)
    per caption) for token means, of the captions for caption means. 1.0 for one process."""
    if mean_over not in MEAN_OVER:
        raise DistinctcapError(f"objective mean_over = {mean_over!r}: choose one of {MEAN_OVER}")
    if not env.active:
        return 1.0
    mine = shard(indices, env)
    if mean_over == "captions":
        return len(mine) / len(indices)
    return float(lengths[mine].sum()) / max(float(lengths[indices].sum()), 1.0)


BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


@dataclass
class GradientReducer:
    """Sum gradients over the ranks in buckets, overlapped with the backward (see the module
    doc). `backward(loss, last)` for each micro-batch, `last` for the rank's final one of the
    step, then `finish()` before the optimiser step. A no-op for one process."""

    model: torch.nn.Module
    env: DistEnv
    bucket_bytes: int = BUCKET_BYTES
    buckets: list[list[torch.nn.Parameter]] = field(init=False, default_factory=list)
    _bucket_of: dict[int, int] = field(init=False, default_factory=dict)
    _missing: list[int] = field(init=False, default_factory=list)
    _launched: list[tuple] = field(init=False, default_factory=list)
    _armed: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if not self.env.active:
            return
        size = self.bucket_bytes  # the first bucket is started at once
        for p in reversed([p for p in self.model.parameters() if p.requires_grad]):
            if size + p.numel() * p.element_size() > self.bucket_bytes and size:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
            self._bucket_of[id(p)] = len(self.buckets) - 1
            p.register_post_accumulate_grad_hook(self._ready)

    def backward(self, loss: Tensor, last: bool) -> None:
        self._armed = last and self.env.active
        if self._armed:
            self._missing = [len(b) for b in self.buckets]
            self._launched = []
        loss.backward()
        self._armed = False

    def _ready(self, p: torch.nn.Parameter) -> None:
        if self._armed:
            self._missing[self._bucket_of[id(p)]] -= 1
            n = len(self._launched)
            while n < len(self.buckets) and not self._missing[n]:  # in order, on every rank
                self._launch(n)
                n += 1

    def _launch(self, i: int) -> None:
        grads = [p.grad for p in self.buckets[i] if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads]) if grads else None
        work = dist.all_reduce(flat, async_op=True) if flat is not None else None
        self._launched.append((work, flat, grads))

    def finish(self) -> None:
        """Launch the buckets whose parameters got no gradient in the last backward (in
        order), wait for every all-reduce and copy the sums back into the gradients."""
        if not self.env.active:
            return
        while len(self._launched) < len(self.buckets):
            self._launch(len(self._launched))
        for work, flat, grads in self._launched:
            if work is None:
                continue
            work.wait()
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        self._launched = []


def broadcast_flag(flag: bool, env: DistEnv, device: torch.device) -> bool:
    """Rank 0's `flag` on every rank (decisions that must not diverge, e.g. early stopping)."""
    if not env.active:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def broadcast_parameters(model: torch.nn.Module, env: DistEnv) -> None:
    """Copy rank 0's parameters and buffers to every rank (as DDP does when it wraps a model)."""
    if not env.active:
        return
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=0)
