"""Multi-GPU training: the collective pieces the trainer uses, with DDP's arithmetic.

A run whose job holds W > 1 GPUs is started in W torchrun processes by distinctcap.launch;
each calls `distinctcap.train.train(cfg)`, which reads its rank from the environment torchrun
sets (`DistEnv.from_env`) and uses GPU `LOCAL_RANK` (gloo on CPU, NCCL on GPUs). This module
imports nothing of the project but its errors, so the trainer imports it without a cycle.

The global batch does not depend on W: micro-batch j of `train.batch_size` captions (the same
captions as in a one-process run, data/batches.py) is cut into W slices (`shard`), each rank
weights its loss by its shard's share of the micro-batch (`shard_weight`: its non-pad tokens /
the micro-batch's, for objectives that average over tokens; captions / captions for objectives
with `mean_over = "captions"`), and after the accumulation loop the gradients are summed over
the ranks (`all_reduce_gradients`). The sum of the weighted shard gradients is the gradient of
the micro-batch's mean, so every rank takes the optimiser step of the one-process run and the
loss curve is the same up to float rounding (tests/test_distributed.py). The number of GPUs is
thus a platform choice (profile) that does not change a result; a checkpoint's data position
(the global micro-batch counter) does not depend on W either.

Why not the DistributedDataParallel wrapper: the objectives call the captioner's encode /
decode / decode_step directly (CL, specificity), which bypasses the wrapper's forward and with
it its gradient hooks. One all-reduce of the flattened gradients per optimiser step is DDP's
arithmetic with `no_sync` during accumulation, without the overlap of communication and
backward (negligible for this model size next to its step time).

Rank 0 alone writes checkpoints, outputs and log lines and shows the progress bar (any rank
appends its warnings and the error that stops it to the log); the
early-stopping decision is broadcast from rank 0 so the processes always stop together.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from distinctcap.errors import DistinctcapError

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


def shard(indices: Tensor, env: DistEnv) -> Tensor:
    """This rank's captions of a micro-batch `indices` (B,): the rank-th of W contiguous
    slices of sizes differing by at most one. Contiguous, so the captions of one image, which
    BatchOrder keeps next to each other, mostly stay on one process and its image is encoded
    once (data/batches.py encode_batch)."""
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


def all_reduce_gradients(model: torch.nn.Module, env: DistEnv) -> None:
    """Sum every parameter's gradient over the ranks, in one flat all-reduce.

    Parameters without a gradient are left alone; they are the same on every rank because
    every rank runs the same code on the same model."""
    if not env.active:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def all_reduce_sum(values: Sequence[float], env: DistEnv, device: torch.device) -> list[float]:
    """Sums of `values` over the ranks (float64), e.g. the step's loss shares and tokens."""
    if not env.active:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


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
