"""Data-parallel training (distinctcap.distributed): sharding arithmetic by hand, and real
2-process runs under torchrun on CPU with the gloo backend."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from distinctcap.distributed import (
    DistEnv,
    all_reduce_gradients,
    shard,
    shard_weight,
    torchrun_command,
)
from distinctcap.errors import DistinctcapError

ROOT = Path(__file__).resolve().parents[1]


def test_env_defaults_to_one_process_and_reads_torchrun_variables() -> None:
    assert DistEnv.from_env({}) == DistEnv(0, 1, 0)
    assert not DistEnv.from_env({}).active
    env = DistEnv.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (env.rank, env.world_size, env.local_rank, env.active, env.is_main) == (
        3,
        4,
        1,
        True,
        False,
    )
    with pytest.raises(DistinctcapError, match="RANK=4 WORLD_SIZE=4"):
        DistEnv.from_env({"RANK": "4", "WORLD_SIZE": "4"})


def test_one_process_keeps_the_whole_batch_with_weight_one() -> None:
    idx = torch.tensor([5, 2, 7])
    env = DistEnv()
    assert torch.equal(shard(idx, env), idx)
    assert shard_weight(torch.tensor([1.0] * 8), idx, env) == 1.0
    assert env.device(torch.device("cpu")) == torch.device("cpu")


def test_shards_are_strided_and_cover_the_micro_batch_once() -> None:
    idx = torch.tensor([9, 4, 6, 1, 8])
    parts = [shard(idx, DistEnv(r, 2, r)).tolist() for r in range(2)]
    assert parts == [[9, 6, 8], [4, 1]]
    with pytest.raises(DistinctcapError, match="cannot be split over 3 processes"):
        shard(torch.tensor([1, 2]), DistEnv(0, 3, 0))


def test_shard_weights_are_token_or_caption_shares() -> None:
    lengths = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])  # non-pad tokens of captions 0..7
    idx = torch.tensor([0, 2, 5, 7])  # tokens 3, 4, 9, 6 -> total 22
    w = [shard_weight(lengths, idx, DistEnv(r, 2, r)) for r in range(2)]
    assert w == pytest.approx([(3 + 9) / 22, (4 + 6) / 22])
    c = [shard_weight(lengths, idx, DistEnv(r, 3, r), "captions") for r in range(3)]
    assert c == pytest.approx([2 / 4, 1 / 4, 1 / 4])
    with pytest.raises(DistinctcapError, match="mean_over = 'sentences'"):
        shard_weight(lengths, idx, DistEnv(0, 2, 0), "sentences")


def test_torchrun_command_runs_this_module_in_n_local_processes() -> None:
    cmd = torchrun_command(2, "cfg.json")
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in cmd and "--standalone" in cmd
    assert cmd[-3:] == ["-m", "distinctcap.distributed", "cfg.json"]


# A worker for torchrun: token-weighted shard losses, gradients summed over 2 gloo processes.
GRAD_WORKER = textwrap.dedent(
    """
    import sys
    import torch
    from distinctcap.distributed import DistEnv, all_reduce_gradients, shard, shard_weight

    env = DistEnv.from_env()
    env.init(torch.device("cpu"))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 5)
    x = torch.randn(6, 4, 3)  # 6 sequences of 4 positions
    y = torch.randint(0, 5, (6, 4))
    mask = torch.tensor([[1] * n + [0] * (4 - n) for n in (4, 1, 3, 2, 4, 1)]).bool()
    idx = torch.tensor([4, 0, 5, 2, 1])  # the micro-batch (caption 3 not in it)
    mine = shard(idx, env)
    logits = model(x[mine])
    loss = torch.nn.functional.cross_entropy(logits[mask[mine]], y[mine][mask[mine]])
    (loss * shard_weight(mask.sum(1), idx, env)).backward()
    all_reduce_gradients(model, env)
    if env.is_main:
        torch.save([p.grad for p in model.parameters()], sys.argv[1])
    env.close()
    """
)


def test_summed_weighted_shard_gradients_equal_the_full_batch_gradient(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(GRAD_WORKER)
    out = tmp_path / "grads.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    done = subprocess.run(
        [*cmd, str(worker), str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The same micro-batch in one process.
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 5)
    x, y = torch.randn(6, 4, 3), torch.randint(0, 5, (6, 4))
    mask = torch.tensor([[1] * n + [0] * (4 - n) for n in (4, 1, 3, 2, 4, 1)]).bool()
    idx = torch.tensor([4, 0, 5, 2, 1])
    loss = torch.nn.functional.cross_entropy(model(x[idx])[mask[idx]], y[idx][mask[idx]])
    loss.backward()
    all_reduce_gradients(model, DistEnv())  # a no-op for one process
    for got, want in zip(torch.load(out), [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
