"""Data-parallel training (distinctcap.core.distributed, distinctcap.train.launch): sharding
arithmetic by
hand, and real 2-process runs under torchrun on CPU with the gloo backend."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import TINY_CAPTIONER
from train_job import fit, job_parts

from distinctcap.core.distributed import (
    DistEnv,
    GradientReducer,
    my_micro_batches,
    shard,
    shard_weight,
)
from distinctcap.core.errors import DistinctcapError
from distinctcap.train.launch import torchrun_command

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


def test_shards_are_contiguous_slices_covering_the_micro_batch_once() -> None:
    idx = torch.tensor([9, 4, 6, 1, 8])
    assert [shard(idx, DistEnv(r, 2, r)).tolist() for r in range(2)] == [[9, 4, 6], [1, 8]]
    parts = [shard(idx, DistEnv(r, 3, r)).tolist() for r in range(3)]
    assert parts == [[9, 4], [6, 1], [8]]
    with pytest.raises(DistinctcapError, match="cannot be split over 3 processes"):
        shard(torch.tensor([1, 2]), DistEnv(0, 3, 0))


def test_ranks_take_whole_micro_batches_when_the_world_divides_grad_accum() -> None:
    assert my_micro_batches(4, DistEnv()) == ([0, 1, 2, 3], True)
    assert my_micro_batches(4, DistEnv(1, 2, 1)) == ([1, 3], True)
    assert my_micro_batches(3, DistEnv(1, 2, 1)) == ([0, 1, 2], False)  # a slice of each


def test_shard_weights_are_token_or_caption_shares() -> None:
    lengths = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])  # non-pad tokens of captions 0..7
    idx = torch.tensor([0, 2, 5, 7])  # tokens 3, 4, 9, 6 -> total 22
    w = [shard_weight(lengths, idx, DistEnv(r, 2, r)) for r in range(2)]
    assert w == pytest.approx([(3 + 4) / 22, (9 + 6) / 22])
    c = [shard_weight(lengths, idx, DistEnv(r, 3, r), "captions") for r in range(3)]
    assert c == pytest.approx([2 / 4, 1 / 4, 1 / 4])
    with pytest.raises(DistinctcapError, match="mean_over = 'sentences'"):
        shard_weight(lengths, idx, DistEnv(0, 2, 0), "sentences")


def test_torchrun_command_runs_this_module_in_n_local_processes() -> None:
    cmd = torchrun_command(2, "cfg.json")
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in cmd and "--standalone" in cmd
    assert cmd[-3:] == ["-m", "distinctcap.train.launch", "cfg.json"]


# A worker for torchrun: token-weighted shard losses, gradients summed over 2 gloo processes
# bucket by bucket during the backward.
GRAD_WORKER = textwrap.dedent(
    """
    import sys
    import torch
    from distinctcap.core.distributed import DistEnv, GradientReducer, shard, shard_weight

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
    reducer = GradientReducer(model, env, bucket_bytes=1)  # a bucket per parameter
    assert len(reducer.buckets) == 2
    reducer.backward(loss * shard_weight(mask.sum(1), idx, env), last=True)
    reducer.finish()
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
    reducer = GradientReducer(model, DistEnv())  # a no-op for one process
    reducer.backward(loss, last=True)
    reducer.finish()
    for got, want in zip(torch.load(out), [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# The trainer over 2 torchrun processes (gloo, CPU) against one process

V, DV, DP, G, MAXLEN, IMAGES = 24, 6, 5, 3, 8, 16
# The curves agree to ~1e-6 relative (float sums in another order, 1 vs 2 threads); the stated
# tolerance leaves room for other BLAS builds. Weights get an absolute tolerance too: Adam divides
# by sqrt(v), which turns rounding in near-zero gradients into visible per-element differences.
RTOL, WEIGHT_ATOL = 1e-4, 1e-4


def run_data():
    import numpy as np

    from distinctcap.features.batches import CaptionData
    from distinctcap.features.read import ImageFeatures
    from distinctcap.train.data import RunData

    g = torch.Generator().manual_seed(0)
    feats = ImageFeatures(
        np.arange(IMAGES, dtype=np.int64),
        torch.nn.functional.normalize(torch.randn(IMAGES, DP, generator=g), dim=-1),
        torch.randn(IMAGES, G, DV, generator=g).half(),
    )

    def captions(images: np.ndarray, first_id: int) -> CaptionData:
        n = len(images) * 5
        lengths = torch.randint(1, MAXLEN - 1, (n,), generator=g).tolist()
        tokens = [torch.randint(4, V, (k,), generator=g).tolist() for k in lengths]
        ids = np.arange(first_id, first_id + n)
        return CaptionData(feats, ids, np.repeat(images, 5), tokens, MAXLEN)

    return RunData(captions(np.arange(12), 100), captions(np.arange(12, IMAGES), 1000))


def run_config(out_dir: Path, batch_size: int = 10, grad_accum: int = 2) -> dict:
    return {
        "name": "ddp",
        "method": "mle",
        "seed": 3,
        "device": "cpu",
        "captioner": {**TINY_CAPTIONER, "vocab_size": V, "dec_layers": 1, "max_len": MAXLEN},
        "train": {
            "steps": 8,
            "batch_size": batch_size,
            "grad_accum": grad_accum,
            "lr": 0.01,
            "warmup_steps": 2,
            "val_every": 4,
            "checkpoint_every": 0,
            "log_every": 1,
        },
        "paths": {"out_dir": str(out_dir)},
    }


# (10, 2): each process takes one whole micro-batch of 10 per step; (20, 1): each takes a slice
# of 10 of the one micro-batch. The global batch is 20 captions either way.
@pytest.mark.parametrize("batch_size, grad_accum", [(10, 2), (20, 1)], ids=["whole", "sliced"])
def test_two_gloo_processes_give_the_one_process_loss_curve(
    tmp_path: Path, batch_size: int, grad_accum: int
) -> None:
    import pandas as pd

    from distinctcap.captioner.model import Captioner
    from distinctcap.train.data import save_run_data
    from distinctcap.train.launch import launch

    data = run_data()
    one = fit(run_config(tmp_path / "one", batch_size, grad_accum), data)
    data_file = tmp_path / "data.pt"
    save_run_data(data, data_file)
    two_cfg = run_config(tmp_path / "two", batch_size, grad_accum)
    launch(*job_parts(two_cfg), 2, str(tmp_path / "two.log"), str(data_file))

    curve = pd.read_csv(tmp_path / "two" / "curve.csv")
    print("max relative loss difference", (curve.loss / one.curve.loss - 1).abs().max())
    assert list(curve.step) == list(one.curve.step) == list(range(1, 9))
    for column in ("loss", "grad_norm", "lr"):
        assert curve[column].to_numpy() == pytest.approx(one.curve[column].to_numpy(), rel=RTOL)
    val = curve.val_loss.dropna().to_numpy()
    assert len(val) == 2 and val == pytest.approx(one.curve.val_loss.dropna().to_numpy(), rel=RTOL)
    # The loss moved, so the comparison is not between two untrained models.
    assert one.curve.loss.iloc[-1] < one.curve.loss.iloc[0] - 0.1
    assert "rank0 distinctcap.train.trainer: run ddp: mle" in (tmp_path / "two.log").read_text()
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 8
    two = Captioner.load(tmp_path / "two" / "model.pt").state_dict()
    for name, weight in one.model.state_dict().items():
        torch.testing.assert_close(two[name], weight, rtol=RTOL, atol=WEIGHT_ATOL)


class _RunsCode:
    """Unpickling this calls open(): a job data file can hold any such call."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_a_launch_process_reads_job_data_as_tensors_only(tmp_path: Path, monkeypatch) -> None:
    """The probe: launch.main loaded its job data with weights_only=False, so a data file that
    holds a pickled call ran it."""
    from distinctcap.train import launch

    marker, data_file = tmp_path / "code-ran", tmp_path / "data.pt"
    torch.save({"train": _RunsCode(marker)}, data_file)
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"run": {}, "paths": {}, "device": "cpu", "data": str(data_file)}))
    # the worker's logging takes over the process's root logger and excepthook
    monkeypatch.setattr(launch, "_worker_logging", lambda *args: None)
    with pytest.raises(DistinctcapError, match=f"job data {data_file} is not a file written by "
                       "train.data.save_run_data"):
        launch.main([str(job)])
    assert not marker.exists()


def test_job_data_round_trips_through_its_file(tmp_path: Path) -> None:
    from distinctcap.train.data import read_run_data, save_run_data

    data = run_data()
    save_run_data(data, tmp_path / "data.pt")
    back = read_run_data(tmp_path / "data.pt")
    for name in ("train", "val"):
        before, after = getattr(data, name), getattr(back, name)
        assert vars(before).keys() == vars(after).keys()
        for key in ("caption_ids", "image_rows", "inputs", "labels", "lengths"):
            assert torch.equal(getattr(before, key), getattr(after, key))
        assert torch.equal(before.features.grid, after.features.grid)
        assert (before.features.image_ids == after.features.image_ids).all()
