"""The trainer: determinism, exact resume after SIGKILL, NaN stop, lr schedule, accumulation,
checkpoint selection, early stopping, run configs; tiny models on in-memory data (the tests of
resuming onto changed inputs write real input files)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY_CAPTIONER
from train_job import fit, job_parts, kill_after

from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.config.check import load_schema, validate
from distinctcap.config.rungraph import effective_run_config
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_table, write_table
from distinctcap.core.run import RunConfig
from distinctcap.core.settings import TrainConfig
from distinctcap.features.batches import BatchOrder, CaptionData, encode_batch, select_captions
from distinctcap.features.read import ImageFeatures
from distinctcap.methods import METHODS
from distinctcap.methods.base import Objective
from distinctcap.methods.losses import mle_loss
from distinctcap.train.checkpoints import Fingerprint, fingerprint
from distinctcap.train.data import RunData
from distinctcap.train.schedule import lr_factor
from distinctcap.train.selection import VAL_METRICS, ValMetric
from distinctcap.train.stats import NonFiniteLossError
from distinctcap.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
V = 16


def tiny_data(n_images: int = 8, per_image: int = 4, equal_len: bool = False) -> RunData:
    """Random features; captions whose tokens depend on the image, so there is something to
    learn. Val = the first two images' captions."""
    g = torch.Generator().manual_seed(0)
    feats = ImageFeatures(
        np.arange(100, 100 + n_images),
        torch.randn(n_images, 6, generator=g),
        torch.randn(n_images, 5, 4, generator=g).half(),
    )
    image_ids, tokens = [], []
    for i in range(n_images):
        for j in range(per_image):
            length = 4 if equal_len else 2 + (i + j) % 4
            tokens.append([4 + (i * 3 + j + k) % (V - 4) for k in range(length)])
            image_ids.append(100 + i)
    caption_ids = np.arange(1000, 1000 + len(tokens))
    train_data = CaptionData(feats, caption_ids, image_ids, tokens, max_len=10)
    val = CaptionData(feats, caption_ids[:8], image_ids[:8], tokens[:8], max_len=10)
    return RunData(train_data, val)


def tiny_cfg(out_dir: Path | None = None, dropout: float = 0.1, **train_kw) -> dict:
    trainer = {
        "steps": 12,
        "batch_size": 8,
        "lr": 3e-3,
        "warmup_steps": 3,
        "val_every": 4,
        "log_every": 2,
        "checkpoint_every": 4,
        **train_kw,
    }
    return {
        "name": "tiny",
        "method": "mle",
        "seed": 0,
        "device": "cpu",
        "captioner": {
            **TINY_CAPTIONER, "vocab_size": V, "dec_layers": 1, "dropout": dropout, "max_len": 10
        },
        "train": trainer,
        "paths": {"out_dir": str(out_dir)} if out_dir else {},
    }


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_lr_schedule_warms_up_linearly_then_decays():
    f = [lr_factor(s, warmup=4, total=10, schedule="linear", final_ratio=0.0) for s in range(10)]
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[4:] == pytest.approx([1 - k / 5 for k in range(6)])  # 1.0 at step 4 ... 0 at 9
    cos = [lr_factor(s, 4, 10, "cosine", 0.1) for s in range(4, 10)]
    assert cos[0] == pytest.approx(1.0) and cos[-1] == pytest.approx(0.1)
    assert cos[2] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 5)))
    assert lr_factor(7, 4, 10, "constant", 0.0) == 1.0
    assert lr_factor(0, 0, 10, "linear", 0.0) == 1.0  # no warm-up: start at the peak


def test_trainer_applies_the_schedule_to_the_optimiser():
    result = fit(tiny_cfg(steps=10, warmup_steps=4, log_every=1, val_every=0), tiny_data())
    expected = [3e-3 * lr_factor(s, 4, 10, "linear", 0.0) for s in range(10)]
    assert result.curve.lr.tolist() == pytest.approx(expected)  # the lr each step used


def test_same_seed_gives_identical_weights_and_another_seed_does_not():
    a = fit(tiny_cfg(), tiny_data()).model.state_dict()
    b = fit(tiny_cfg(), tiny_data()).model.state_dict()
    assert same_weights(a, b)
    other = tiny_cfg()
    other["seed"] = 1
    assert not same_weights(a, fit(other, tiny_data()).model.state_dict())


def test_training_lowers_the_loss_and_writes_outputs(tmp_path):
    result = fit(tiny_cfg(tmp_path, steps=40, val_every=10, checkpoint_every=10), tiny_data())
    curve = pd.read_csv(tmp_path / "curve.csv")
    assert {"step", "epoch", "lr", "loss", "grad_norm", "tokens_per_s", "val_loss"} <= set(curve)
    assert curve.loss.iloc[-1] < curve.loss.iloc[0] - 0.3
    assert curve.val_loss.notna().sum() == 4
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["metric"] == "val_loss"
    assert not (tmp_path / "checkpoints").exists()  # resume state is dropped after success
    loaded = Captioner.load(tmp_path / "model.pt")
    assert same_weights(loaded.state_dict(), result.model.state_dict())


def test_grad_accumulation_equals_a_larger_batch():
    """Equal-length captions: the mean of the two micro-batch means is the mean of the batch,
    and BatchOrder gives accumulation 2 x 4 the same captions as one batch of 8."""
    data = tiny_data(equal_len=True)
    big = fit(tiny_cfg(dropout=0.0, batch_size=8, val_every=0), data).model.state_dict()
    acc = fit(tiny_cfg(dropout=0.0, batch_size=4, grad_accum=2, val_every=0), data)
    for k, v in acc.model.state_dict().items():
        torch.testing.assert_close(v, big[k], atol=1e-5, rtol=1e-4)  # float sum order


class NaNAtStep(Objective):
    """MLE that turns into NaN at optimiser step 3 (0-based), i.e. the 4th step."""

    needs: tuple[str, ...] = ()

    def __init__(self, run_cfg, ctx):
        self.pad_id = ctx.pad_id

    def loss(self, model, batch, step, total_steps):
        logits, _ = model(batch.grid, batch.pooled, batch.inputs)
        loss = mle_loss(logits, batch.labels, self.pad_id)
        return (loss * float("nan") if step == 3 else loss), {}


def test_nan_loss_stops_naming_step_and_captions_without_a_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setitem(METHODS, "nan_at_3", NaNAtStep)
    cfg = tiny_cfg(tmp_path, checkpoint_every=1)
    cfg["method"] = "nan_at_3"
    data = tiny_data()
    with pytest.raises(NonFiniteLossError) as info:
        fit(cfg, data)
    order = BatchOrder(len(data.train), 8, 0, groups=data.train.image_rows)
    expected_ids = data.train.caption_ids[order.indices(3)].tolist()
    assert info.value.step == 4 and info.value.caption_ids == expected_ids
    assert "loss is nan at step 4 of 12" in str(info.value)
    assert str(expected_ids) in str(info.value)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 3  # the last good state; nothing written from step 4
    assert not (tmp_path / "model.pt").exists()


def test_an_exploding_lr_never_reaches_a_checkpoint(tmp_path):
    with pytest.raises(DistinctcapError, match="not finite|is nan|is inf"):
        fit(tiny_cfg(tmp_path, lr=float("inf"), warmup_steps=0, checkpoint_every=1), tiny_data())
    assert not (tmp_path / "checkpoints" / "last.pt").exists()


def scripted_metric(values: list[float], seen: list[dict]) -> ValMetric:
    """A selection metric that returns `values` in turn and records the weights it saw."""

    def fn(model, val, batches, autocast):
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return values[len(seen) - 1]

    return ValMetric(fn, "max")


def test_validation_keeps_the_best_weights(tmp_path, monkeypatch):
    seen: list[dict] = []
    monkeypatch.setitem(VAL_METRICS, "scripted", scripted_metric([0.1, 0.5, 0.3], seen))
    result = fit(tiny_cfg(tmp_path, select_metric="scripted"), tiny_data())
    assert len(seen) == 3 and result.best_step == 8 and result.best_metric == 0.5
    assert same_weights(result.model.state_dict(), seen[1])
    assert same_weights(Captioner.load(tmp_path / "model.pt").state_dict(), seen[1])
    assert result.curve.dropna(subset=["scripted"]).scripted.tolist() == [0.1, 0.5, 0.3]


def test_early_stopping_after_patience_validations_without_improvement(monkeypatch):
    seen: list[dict] = []
    monkeypatch.setitem(VAL_METRICS, "scripted", scripted_metric([0.5, 0.4, 0.45, 0.3], seen))
    result = fit(tiny_cfg(steps=40, select_metric="scripted", patience=2), tiny_data())
    assert result.stopped_early and result.steps == 12 and len(seen) == 3
    assert result.best_step == 4 and same_weights(result.model.state_dict(), seen[0])


class MLEWithOwnMetric(NaNAtStep):
    """Selection on a metric the objective computes itself (as specificity's mean rank)."""

    val_metrics = {"own": "min"}

    def __init__(self, run_cfg, ctx):
        super().__init__(run_cfg, ctx)
        self.values = iter([3.0, 1.0, 2.0])

    def loss(self, model, batch, step, total_steps):
        return super().loss(model, batch, -1, total_steps)  # never NaN

    def val_metric(self, name, model, val, batches, autocast):
        return next(self.values)


def test_selection_on_a_metric_of_the_objective_and_unknown_metrics(monkeypatch):
    monkeypatch.setitem(METHODS, "own", MLEWithOwnMetric)
    result = fit({**tiny_cfg(select_metric="own"), "method": "own"}, tiny_data())
    assert (result.best_step, result.best_metric) == (8, 1.0)
    with pytest.raises(DistinctcapError, match="select_metric = 'own': choose one of"):
        fit(tiny_cfg(select_metric="own"), tiny_data())


def test_self_retrieval_selection_runs_and_is_a_fraction():
    result = fit(tiny_cfg(select_metric="self_retrieval", steps=4), tiny_data())
    assert 0.0 <= result.best_metric <= 1.0 and result.metric == "self_retrieval"


class Counting(NaNAtStep):
    """An objective with state of its own (a count of its calls), saved in checkpoints."""

    crash_at: int | None = None  # a class switch, so the run config (and fingerprint) stays

    def __init__(self, run_cfg, ctx):
        super().__init__(run_cfg, ctx)
        self.count = 0

    def loss(self, model, batch, step, total_steps):
        if step == self.crash_at:
            raise RuntimeError("simulated crash")
        self.count += 1
        return super().loss(model, batch, -1, total_steps)[0], {"count": float(self.count)}

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def test_objective_state_is_resumed(tmp_path, monkeypatch):
    monkeypatch.setitem(METHODS, "counting", Counting)
    cfg = {**tiny_cfg(tmp_path, log_every=1), "method": "counting"}
    monkeypatch.setattr(Counting, "crash_at", 6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(cfg, tiny_data())
    monkeypatch.setattr(Counting, "crash_at", None)
    result = fit(cfg, tiny_data())
    assert result.resumed_from == 4
    assert result.curve["count"].tolist() == [float(k) for k in range(1, 13)]


class EvenStepExtra(NaNAtStep):
    """Reports `even` (= the step) on even steps only."""

    def loss(self, model, batch, step, total_steps):
        loss = super().loss(model, batch, -1, total_steps)[0]
        return loss, ({"even": float(step)} if step % 2 == 0 else {})


def test_an_extra_missing_on_some_steps_is_averaged_over_the_steps_that_report_it(monkeypatch):
    monkeypatch.setitem(METHODS, "even", EvenStepExtra)
    cfg = {**tiny_cfg(log_every=4, val_every=0), "method": "even"}
    result = fit(cfg, tiny_data())
    assert result.curve["even"].tolist() == [1.0, 5.0, 9.0]  # steps (0, 2), (4, 6), (8, 10)


RESUME_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads({threads})
from test_train import tiny_cfg, tiny_data
from train_job import fit
cfg = tiny_cfg(__import__("pathlib").Path({out!r}), **{kw!r})
fit({{**cfg, "method": {method!r}}}, tiny_data())
"""


def run_tiny(out: Path, kw: dict, log: Path, method: str = "mle") -> subprocess.Popen:
    code = RESUME_SCRIPT.format(tests=str(ROOT / "tests"), threads=1, out=str(out), kw=kw,
                                method=method)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with open(log, "w") as err:  # a file, not a pipe: a full pipe would block the child
        return subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=err
        )


@pytest.mark.parametrize("method", ["mle", "scst"])  # scst: its samples' generator, too
def test_resume_after_sigkill_ends_with_the_uninterrupted_weights(method, tmp_path):
    kw = {"steps": 60, "checkpoint_every": 5, "val_every": 20}
    proc = run_tiny(tmp_path / "killed", kw, tmp_path / "first.log", method)
    ckpt = tmp_path / "killed" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 120
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()
    assert not (tmp_path / "killed" / "model.pt").exists()

    rerun = run_tiny(tmp_path / "killed", kw, tmp_path / "rerun.log", method)
    assert rerun.wait(timeout=300) == 0, (tmp_path / "rerun.log").read_text()
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["resumed_from"] is not None and 0 < summary["resumed_from"] < 60

    whole = fit({**tiny_cfg(tmp_path / "whole", **kw), "method": method}, tiny_data())
    resumed = Captioner.load(tmp_path / "killed" / "model.pt").state_dict()
    assert same_weights(resumed, whole.model.state_dict())
    curve = pd.read_csv(tmp_path / "killed" / "curve.csv")
    pd.testing.assert_series_equal(curve.loss, whole.curve.loss, check_exact=True)
    assert summary["work"] == whole.work  # the work before the kill comes with the checkpoint


def test_a_checkpoint_of_another_config_is_not_resumed(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="distinctcap.train.trainer")
    monkeypatch.setitem(METHODS, "nan_at_3", NaNAtStep)
    with pytest.raises(NonFiniteLossError):  # leaves a checkpoint of step 3 behind
        fit({**tiny_cfg(tmp_path, checkpoint_every=1), "method": "nan_at_3"}, tiny_data())
    result = fit(tiny_cfg(tmp_path), tiny_data())
    assert result.resumed_from is None
    (line,) = set_aside_lines(caplog)
    assert "(config changed); training from step 0" in line
    assert same_weights(
        result.model.state_dict(), fit(tiny_cfg(), tiny_data()).model.state_dict()
    )


# -- resume only onto the same inputs: a killed run's state is a few real steps + save_checkpoint

NO_VAL = {"val_every": 0}  # selection at the end only, so a few train_step()s are a kill's state


def write_captions(path: Path) -> Path:
    """tiny_data's training captions as a real captions table."""
    train_data = tiny_data().train
    table = pd.DataFrame(
        {
            "caption_id": train_data.caption_ids.numpy(),
            "image_id": train_data.image_ids.numpy(),
            "split": "train",
            "text": "a caption",
            "tokens": [t[t != 0].tolist()[:-1] for t in train_data.labels],  # less eos
        }
    )
    write_table(table, path, "captions")
    return path


def write_subset(folder: Path, caption_ids: list[int]) -> Path:
    """A D- subset as the entropy stage writes it: a folder of parquet shards."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    half = len(caption_ids) // 2
    for i, ids in enumerate((caption_ids[:half], caption_ids[half:])):
        pd.DataFrame({"caption_id": ids}).to_parquet(folder / f"part-{i:05d}.parquet")
    return folder


def subset_data(captions: Path, subset: Path) -> RunData:
    """The training data a D- run reads from these files (features: tiny_data's)."""
    chosen = select_captions(read_table(captions, "captions"), "train", "D-", subset)
    tiny = tiny_data()
    return RunData(CaptionData.from_table(chosen, tiny.train.features, 10), tiny.val)


def subset_cfg(out: Path, captions: Path, subset: Path) -> dict:
    cfg = tiny_cfg(out, **NO_VAL)
    cfg["data"] = "D-"
    cfg["paths"].update(captions=str(captions), subset=str(subset))
    return cfg


def write_init(path: Path, seed: int) -> Path:
    """A reference model.pt of the tiny captioner's shape, weights drawn from `seed`."""
    cap = {k: v for k, v in tiny_cfg()["captioner"].items() if k != "vocab_size"}
    torch.manual_seed(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Captioner(CaptionerConfig(vocab_size=V, visual_dim=4, pooled_dim=6, **cap)).save(path)
    return path


def init_cfg(out: Path, init: Path) -> dict:
    cfg = {**tiny_cfg(out, **NO_VAL), "init": "reference"}
    cfg["paths"]["init"] = str(init)
    return cfg


def set_aside_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]


def test_a_checkpoint_of_other_subset_shards_is_set_aside(tmp_path, caplog):
    """Issue #14, 1: D- rewritten (entropy fraction changed) while teacher_neg was killed."""
    caplog.set_level(logging.INFO, logger="distinctcap.train.trainer")
    captions = write_captions(tmp_path / "captions.parquet")
    subset = write_subset(tmp_path / "D-", list(range(1000, 1024)))
    cfg = subset_cfg(tmp_path / "run", captions, subset)
    ckpt = kill_after(cfg, subset_data(captions, subset), 4)
    old = torch.load(ckpt, weights_only=True)["fingerprint"]

    write_subset(subset, list(range(1008, 1032)))  # same folder, other captions
    result = fit(cfg, subset_data(captions, subset))

    assert result.resumed_from is None
    stale = ckpt.with_name(f"stale-{Fingerprint(old).hash}.pt")
    assert stale.exists() and not ckpt.exists()
    (line,) = set_aside_lines(caplog)
    assert f"checkpoint {ckpt} set aside as {stale.name} (subset changed: {subset})" in line
    assert line.endswith("training from step 0")
    clean = fit(subset_cfg(tmp_path / "clean", captions, subset), subset_data(captions, subset))
    assert same_weights(result.model.state_dict(), clean.model.state_dict())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["inputs"]) == {"config", "captions", "subset"}
    assert summary["inputs"]["subset"] != old["subset"]
    assert summary["inputs"]["config"] == old["config"]


def test_a_checkpoint_on_another_init_model_is_set_aside(tmp_path, caplog):
    """Issue #14, 1: the reference retrained (other lr) while smile was killed."""
    caplog.set_level(logging.INFO, logger="distinctcap.train.trainer")
    init = write_init(tmp_path / "reference" / "model.pt", seed=1)
    cfg = init_cfg(tmp_path / "smile", init)
    ckpt = kill_after(cfg, tiny_data(), 4)

    write_init(init, seed=2)  # the retrained reference, at the same path
    result = fit(cfg, tiny_data())

    assert result.resumed_from is None and not ckpt.exists()
    assert len(list(ckpt.parent.glob("stale-*.pt"))) == 1
    (line,) = set_aside_lines(caplog)
    assert f"(init changed: {init}); training from step 0" in line
    clean = fit(init_cfg(tmp_path / "clean", init), tiny_data())
    assert same_weights(result.model.state_dict(), clean.model.state_dict())


def test_a_rerun_on_unchanged_inputs_resumes_to_the_uninterrupted_weights(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="distinctcap.train.trainer")
    captions = write_captions(tmp_path / "captions.parquet")
    subset = write_subset(tmp_path / "D-", list(range(1000, 1024)))
    init = write_init(tmp_path / "reference" / "model.pt", seed=1)

    def cfg(out):
        c = subset_cfg(out, captions, subset)
        c["init"], c["paths"]["init"] = "reference", str(init)
        return c

    kill_after(cfg(tmp_path / "run"), subset_data(captions, subset), 4)
    write_subset(subset, list(range(1000, 1024)))  # rewritten with the same content
    result = fit(cfg(tmp_path / "run"), subset_data(captions, subset))
    assert result.resumed_from == 4 and not set_aside_lines(caplog)
    whole = fit(cfg(tmp_path / "whole"), subset_data(captions, subset))
    assert same_weights(result.model.state_dict(), whole.model.state_dict())
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_an_old_format_checkpoint_is_set_aside(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="distinctcap.train.trainer")
    cfg = tiny_cfg(tmp_path, **NO_VAL)
    ckpt = kill_after(cfg, tiny_data(), 4)
    state = torch.load(ckpt, weights_only=True)
    torch.save({**state, "fingerprint": "0123456789abcdef"}, ckpt)  # before input fingerprints
    result = fit(cfg, tiny_data())
    assert result.resumed_from is None
    assert (ckpt.parent / "stale-0123456789abcdef.pt").exists()  # kept past the run's success
    (line,) = set_aside_lines(caplog)
    assert "old-format fingerprint" in line
    assert same_weights(
        result.model.state_dict(), fit(tiny_cfg(**NO_VAL), tiny_data()).model.state_dict()
    )


def test_the_fingerprint_covers_input_contents_not_paths(tmp_path):
    features = tmp_path / "features"
    (features / "cache" / "images").mkdir(parents=True)
    shard = features / "cache" / "images" / "part-00000.parquet"
    shard.write_bytes(b"features")
    index = {"images": {"shards": [{"path": "cache/images/part-00000.parquet", "key": "k"}]}}
    (features / "index.json").write_text(json.dumps(index))
    subset = write_subset(tmp_path / "D-", [1, 2, 3])
    (tmp_path / "clip.bin").write_bytes(b"clip")
    paths = {
        "features": str(features / "index.json"),
        "subset": str(subset),
        "clip_files": [str(tmp_path / "clip.bin")],
        "clip": "openai",  # a tag, not a file
        "clip_arch": "ViT-B-32",
        "out_dir": str(tmp_path),
    }
    def fingerprint_of(paths: dict):
        run, run_paths, _ = job_parts({**tiny_cfg(), "paths": paths})
        return fingerprint(run.effective(), run_paths.inputs)

    before = fingerprint_of(paths)
    assert set(before.parts) == {"config", "features", "subset", "clip_files"}
    moved = {**paths, "out_dir": str(tmp_path / "elsewhere")}
    assert fingerprint_of(moved) == before
    shard.write_bytes(b"other features")  # the index is unchanged: its key is not content
    assert fingerprint_of(paths).changes(before.parts) == ["features"]
    (subset / "part-00001.parquet").rename(subset / "part-00002.parquet")
    after = fingerprint_of(paths)
    assert after.changes(before.parts) == ["features", "subset"]
    assert after.hash != before.hash


SCHEMA = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")


def test_effective_run_config_merges_the_run_train_block_over_the_defaults():
    config = validate(
        {
            "runs": {
                "reference": {"method": "mle"},
                "teacher_neg": {"method": "mle", "data": "D-", "train": {"steps": 7, "lr": 0.01}},
            }
        },
        SCHEMA,
    )
    ref = effective_run_config(config, "reference", SCHEMA)
    neg = effective_run_config(config, "teacher_neg", SCHEMA)
    assert ref["train"] == config["train"] and ref["captioner"] == config["captioner"]
    assert neg["train"] == {**config["train"], "steps": 7, "lr": 0.01}
    assert neg["data"] == "D-" and neg["name"] == "teacher_neg" and "paths" not in neg
    TrainConfig.from_dict(neg["train"])


def test_a_run_config_gives_back_the_effective_config_it_was_built_from():
    """summary.json's "config" and the fingerprint read RunConfig.effective(): for every run of
    config.yaml it is the effective run config itself."""
    import yaml

    from distinctcap.methods.facts import FACTS

    config = validate(yaml.safe_load((ROOT / "config.yaml").read_text()), SCHEMA)
    for name in config["runs"]:
        effective = effective_run_config(config, name, SCHEMA)
        run = RunConfig.from_effective(effective)
        assert run.effective() == effective, name
        assert run.train == TrainConfig.from_dict(effective["train"])
        assert set(run.options) == set(FACTS[run.method].options), name


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"stepz": 3}, "unknown key runs.r.train.stepz; did you mean steps? allowed keys here: "),
        ({"steps": "many"}, "runs.r.train.steps = 'many' has the wrong type"),
        ({"schedule": "step"}, "runs.r.train.schedule = 'step' is not allowed"),
    ],
)
def test_bad_run_train_overrides_are_named(override, message):
    config = validate({"runs": {"r": {"method": "mle", "train": override}}}, SCHEMA)
    with pytest.raises(DistinctcapError, match=re.escape(message)):
        effective_run_config(config, "r", SCHEMA)


CL_EDGES = {"init": "ref", "reference": "ref"}


def test_a_run_keeps_only_its_own_method_options():
    config = validate(
        {"runs": {"ref": {"method": "mle"}, "c": {"method": "cl", "negatives": 3, **CL_EDGES}}},
        SCHEMA,
    )
    ref, c = (effective_run_config(config, n, SCHEMA) for n in ("ref", "c"))
    assert set(ref) == {"name", "method", "data", "seed", "captioner", "train"}
    assert c["negatives"] == 3 and "subset" not in c and "w_pred" not in c
    smile_default = {**config, "runs": {**config["runs"]}}
    smile_default["runs"]["c"] = {**config["runs"]["c"], "subset": "random"}  # a smile option
    with pytest.raises(DistinctcapError, match=r"runs.c.subset is an option of smile runs"):
        effective_run_config(smile_default, "c", SCHEMA)


def test_batch_order_is_a_pure_function_of_seed_and_epoch_and_groups_images():
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 4, 4, 4, 4])
    order = BatchOrder(12, 4, seed=3, groups=groups)
    assert order.per_epoch == 3
    epoch0 = torch.cat([order.indices(j) for j in range(3)])
    assert sorted(epoch0.tolist()) == list(range(12))
    runs = groups[epoch0].unique_consecutive()
    assert len(runs) == 5  # each image's captions are consecutive
    again = BatchOrder(12, 4, seed=3, groups=groups)
    assert torch.equal(again.indices(4), order.indices(4))  # resumed mid-epoch 1: same batch
    assert not torch.equal(torch.cat([order.indices(j) for j in range(3, 6)]), epoch0)


def test_encode_batch_equals_encoding_every_caption():
    data = tiny_data()
    batch = data.train.batch(torch.tensor([0, 1, 5, 2, 9]))  # images 100, 100, 101, 100, 102
    cfg = CaptionerConfig(V, 4, 6, width=16, enc_layers=1, dec_layers=1, heads=2, ffn=32)
    model = Captioner(cfg).eval()
    torch.testing.assert_close(encode_batch(model, batch), model.encode(batch.grid, batch.pooled))


def test_subset_selection_reads_the_subset_shards(tmp_path):
    captions = pd.DataFrame(
        {
            "caption_id": [1, 2, 3, 4, 5],
            "image_id": [1, 1, 2, 2, 3],
            "split": ["train"] * 4 + ["val"],
            "text": list("abcde"),
            "tokens": [[4]] * 5,
        }
    )
    (tmp_path / "D-").mkdir()
    pd.DataFrame({"caption_id": [2]}).to_parquet(tmp_path / "D-" / "part-00000.parquet")
    pd.DataFrame({"caption_id": [4, 5]}).to_parquet(tmp_path / "D-" / "part-00001.parquet")
    assert select_captions(captions, "train", "D-", tmp_path / "D-").caption_id.tolist() == [2, 4]
    assert select_captions(captions, "train").caption_id.tolist() == [1, 2, 3, 4]
    with pytest.raises(DistinctcapError, match="choose one of"):
        select_captions(captions, "train", "D0")


def test_generated_table_has_one_row_per_caption_and_reproducible_samples():
    from distinctcap.evaluate.decode import generate_table

    data = tiny_data()
    cfg = CaptionerConfig(V, 4, 6, width=16, enc_layers=1, dec_layers=1, heads=2, ffn=32)
    torch.manual_seed(0)
    model = Captioner(cfg).eval()
    feats = data.train.features.subset([101, 103])
    text = lambda ids: " ".join(map(str, ids))  # noqa: E731
    greedy = generate_table(model, feats, {"kind": "greedy"}, "ref", text)
    assert greedy[["run", "image_id", "sample"]].values.tolist() == [
        ["ref", 101, 0],
        ["ref", 103, 0],
    ]
    setting = {"kind": "sample", "n": 3, "temperature": 1.5, "batch_size": 1}
    a = generate_table(model, feats, setting, "ref", text, seed=4)
    b = generate_table(model, feats, setting, "ref", text, seed=4)
    assert a.image_id.tolist() == [101] * 3 + [103] * 3 and a["sample"].tolist() == [0, 1, 2] * 2
    pd.testing.assert_frame_equal(a, b)
    assert (a.logprob <= 0).all() and a.text.map(lambda t: isinstance(t, str)).all()
    beam = generate_table(model, feats, {"kind": "beam", "k": 1}, "ref", text)
    pd.testing.assert_frame_equal(beam, greedy)  # beam search of width 1 is greedy


def test_compile_that_fails_warns_once_and_trains_uncompiled(monkeypatch, caplog):
    """Where compiling fails (train.compile: true) the run trains uncompiled after one warning
    line, with the weights of the uncompiled run. (Compiled runs: tests/test_device_path.py.)"""
    plain = fit(tiny_cfg(checkpoint_every=0), tiny_data())
    monkeypatch.setenv("DISTINCTCAP_COMPILE_BACKEND", "no-such-backend")
    with caplog.at_level(logging.WARNING, logger="distinctcap"):
        compiled = fit(tiny_cfg(checkpoint_every=0, compile=True), tiny_data())
    warned = [r.getMessage() for r in caplog.records if "train.compile" in r.getMessage()]
    assert len(warned) == 1 and "failed, training uncompiled" in warned[0], warned
    for (name, a), b in zip(plain.model.state_dict().items(), compiled.model.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    assert plain.curve.drop(columns="tokens_per_s").equals(
        compiled.curve.drop(columns="tokens_per_s")
    )


def deferred_trainer(cfg, data):
    """A Trainer that reads its numbers only at flushes, as it does on a GPU."""

    trainer = Trainer(*job_parts(cfg), data)
    trainer.eager = False
    return trainer


def test_reading_the_numbers_only_at_log_steps_gives_the_same_run():
    """On a GPU the host syncs only at log, validation and checkpoint steps (Trainer.flush):
    the curve and the weights are those of the step-by-step reading."""
    cfg = tiny_cfg(checkpoint_every=0, log_every=3, grad_accum=2)
    eager = fit(cfg, tiny_data())
    deferred = deferred_trainer(cfg, tiny_data()).run()
    assert eager.curve.drop(columns="tokens_per_s").equals(
        deferred.curve.drop(columns="tokens_per_s")
    )
    for a, b in zip(eager.model.parameters(), deferred.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_nan_loss_read_at_the_next_log_step_names_its_own_step(monkeypatch):
    monkeypatch.setitem(METHODS, "nan_at_3", NaNAtStep)
    cfg = {**tiny_cfg(checkpoint_every=0, log_every=5, val_every=0), "method": "nan_at_3"}
    data = tiny_data()
    with pytest.raises(NonFiniteLossError) as info:
        deferred_trainer(cfg, data).run()
    order = BatchOrder(len(data.train), 8, 0, groups=data.train.image_rows)
    assert info.value.step == 4
    assert info.value.caption_ids == data.train.caption_ids[order.indices(3)].tolist()


def test_the_trainer_computes_exactly_the_registered_selection_metrics():
    """distinctcap.train.select_metrics is the one list: the trainer has a function of each of
    its metrics with its mode, and each method's objective computes its own `val_metrics`."""
    from distinctcap.methods.clipval import CLIP_VAL
    from distinctcap.methods.facts import FACTS
    from distinctcap.train.select_metrics import SELECT_METRICS

    assert {name: m.mode for name, m in VAL_METRICS.items()} == SELECT_METRICS
    for method, facts in FACTS.items():
        assert METHODS[method].val_metrics == facts.val_metrics
        assert set(facts.val_metrics) <= set(CLIP_VAL), method


def test_cider_selection_metrics():
    """cider (CL), oracle_cider / sample_cider (UNKT): CIDEr-D of greedy captions / the best and
    mean of seeded samples against each validation image's references."""
    from distinctcap.captioner.search import greedy
    from distinctcap.scores.cider import CiderD
    from distinctcap.train.selection import (
        references,
        val_cider,
        val_oracle_cider,
        val_sample_cider,
    )

    data = tiny_data()
    result = fit(tiny_cfg(select_metric="cider", steps=8), data)
    model, val = result.model.eval(), data.val
    rows = torch.unique(val.image_rows, sorted=True)
    refs = references(val, rows)
    assert [len(r) for r in refs] == [4, 4]  # val: the first two images' 4 captions each
    caps = greedy(model, val.features.grid[rows].float(), val.features.pooled[rows])
    scorer = CiderD(refs)
    words = [" ".join(map(str, c.tokens)) for c in caps]
    by_hand = np.mean([scorer.score(w, r) for w, r in zip(words, refs, strict=True)])
    assert val_cider(model, val) == pytest.approx(by_hand)
    oracle, mean = val_oracle_cider(model, val), val_sample_cider(model, val)
    assert oracle >= mean >= 0 and oracle == val_oracle_cider(model, val)  # seeded
    assert result.metric == "cider" and result.best_metric >= 0


def test_checkpoints_by_wall_time_are_written_and_leave_the_weights_alone(tmp_path, monkeypatch):
    monkeypatch.setitem(METHODS, "nan_at_3", NaNAtStep)
    timed = {"checkpoint_every": 0, "checkpoint_minutes": 1e-9}  # due after every step
    with pytest.raises(NonFiniteLossError):
        fit({**tiny_cfg(tmp_path / "nan", **timed), "method": "nan_at_3"}, tiny_data())
    ckpt = torch.load(tmp_path / "nan" / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 3  # by wall time alone, the last good step
    plain = fit(tiny_cfg(checkpoint_every=0), tiny_data())
    by_time = fit(tiny_cfg(tmp_path / "timed", **timed), tiny_data())
    assert same_weights(by_time.model.state_dict(), plain.model.state_dict())


def test_a_batch_larger_than_the_training_captions_is_capped_with_a_warning(caplog):
    """The probe's `batch_size: 1000000000` trained silently on one capped batch."""
    caplog.set_level(logging.WARNING, logger="distinctcap.train.trainer")
    data = tiny_data()
    fit(tiny_cfg(steps=2, batch_size=1_000_000_000, val_captions=10**6, val_every=0), data)
    lines = [r.getMessage() for r in caplog.records]
    n_train, n_val = len(data.train), len(data.val)
    assert f"run tiny: train.batch_size = 1000000000 exceeds the run's {n_train} training " \
        f"captions; capped to {n_train}" in lines
    assert f"run tiny: train.val_captions = 1000000 exceeds the run's {n_val} validation " \
        f"captions; capped to {n_val}" in lines
