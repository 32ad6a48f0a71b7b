"""Live training curves (issue 57): the trainer writes curve.csv's rows as TensorBoard scalars
beside it, `<run folder>/tensorboard/` (distinctcap.train.board), and nothing else changes."""

import pandas as pd
import pytest
import torch
from test_train import Counting, tiny_cfg, tiny_data
from train_job import fit

from distinctcap.methods import METHODS

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}  # fmt: skip


def test_training_writes_the_curve_as_tensorboard_scalars(tmp_path):
    result = fit(tiny_cfg(tmp_path, steps=8, val_every=4, checkpoint_every=0), tiny_data())
    curve = pd.read_csv(tmp_path / "curve.csv")
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    board = scalars(tmp_path / "tensorboard")
    assert set(board) == set(curve.columns) - {"step"}
    for name in ("loss", "val_loss", "lr"):
        rows = curve.dropna(subset=[name])
        assert [step for step, _ in board[name]] == rows.step.tolist()
        assert [value for _, value in board[name]] == pytest.approx(rows[name].tolist(), rel=1e-6)
    # without a run folder there is no board: the same curve and weights
    no_board = fit(tiny_cfg(None, steps=8, val_every=4, checkpoint_every=0), tiny_data())
    assert result.curve.drop(columns="tokens_per_s").equals(
        no_board.curve.drop(columns="tokens_per_s")
    )
    for a, b in zip(result.model.parameters(), no_board.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_fresh_run_replaces_the_old_events(tmp_path):
    fit(tiny_cfg(tmp_path, steps=4, val_every=0, checkpoint_every=0), tiny_data())
    fit(tiny_cfg(tmp_path, steps=6, val_every=0, checkpoint_every=0), tiny_data())
    steps = [step for step, _ in scalars(tmp_path / "tensorboard")["loss"]]
    assert steps == sorted(set(steps)) and steps[-1] == 6


def test_a_resumed_run_shows_each_step_once_with_the_curves_values(tmp_path, monkeypatch):
    """A crash after step 6 leaves events of steps 5-6 beyond the checkpoint of step 4; the
    resumed run rewrites them, and TensorBoard shows each step once, as curve.csv has it."""
    monkeypatch.setitem(METHODS, "counting", Counting)
    cfg = {**tiny_cfg(tmp_path, log_every=1, checkpoint_every=4), "method": "counting"}
    monkeypatch.setattr(Counting, "crash_at", 6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(cfg, tiny_data())
    assert [step for step, _ in scalars(tmp_path / "tensorboard")["count"]] == [1, 2, 3, 4, 5, 6]
    monkeypatch.setattr(Counting, "crash_at", None)
    assert fit(cfg, tiny_data()).resumed_from == 4
    curve = pd.read_csv(tmp_path / "curve.csv")
    board = scalars(tmp_path / "tensorboard")
    for name in ("count", "loss"):
        assert [step for step, _ in board[name]] == curve.step.tolist()
        assert [value for _, value in board[name]] == pytest.approx(curve[name].tolist(), rel=1e-6)
