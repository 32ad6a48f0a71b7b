"""UNKT objective (UNKT eq. 5-10, Tables 3-8) on a tiny captioner: eq. 9 assembled by hand,
lambda, masking, ablation configs, the teacher's frozenness, repulsion, hard/random targets, and
every preset entry trained and decoded through distinctcap.train.trainer."""

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import TINY_CAPTIONER, TINY_TRAIN, tiny_captioner
from train_job import fit, kill_after, run_of

from distinctcap.captioner.model import Captioner
from distinctcap.captioner.search import greedy
from distinctcap.core import work
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.settings import steps_per_epoch
from distinctcap.data.tokenizer import EOS, PAD
from distinctcap.features.batches import CaptionData
from distinctcap.features.read import ImageFeatures
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext
from distinctcap.methods.losses import mle_loss, soft_unlikelihood_loss, token_unlikelihood_loss
from distinctcap.methods.unkt import (
    UNKT,
    GreedyCaptions,
    align_negatives,
    attention_maps,
    captions_of_other_images,
    teacher_forcing,
)

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
G, DV, DP, V, MAXLEN = 5, 6, 4, 24, 9
L = TINY_CAPTIONER["dec_layers"]
IMAGES = 8  # 5 captions each


def captioner_cfg() -> dict:
    return {**TINY_CAPTIONER, "max_len": MAXLEN}


def tiny(seed: int) -> Captioner:
    return tiny_captioner(V, DV, DP, seed, **captioner_cfg())


@pytest.fixture(scope="module")
def data() -> CaptionData:
    g = torch.Generator().manual_seed(0)
    feats = ImageFeatures(
        np.arange(IMAGES, dtype=np.int64),
        torch.nn.functional.normalize(torch.randn(IMAGES, DP, generator=g), dim=-1),
        torch.randn(IMAGES, G, DV, generator=g).half(),
    )
    n = IMAGES * 5
    lengths = torch.randint(2, MAXLEN - 1, (n,), generator=g).tolist()
    tokens = [torch.randint(4, V, (k,), generator=g).tolist() for k in lengths]
    return CaptionData(
        feats, np.arange(100, 100 + n), np.repeat(np.arange(IMAGES), 5), tokens, MAXLEN
    )


@pytest.fixture(scope="module")
def negatives(tmp_path_factory, data) -> Path:
    """D- stand-in: the even caption ids, as a subset shard folder."""
    folder = tmp_path_factory.mktemp("entropy") / "D-"
    folder.mkdir()
    ids = data.caption_ids.numpy()[::2]
    pd.DataFrame({"caption_id": ids}).to_parquet(folder / "part-0000.parquet")
    return folder


def make(data, run: dict, teacher: Captioner | None = None, negatives: Path | None = None):
    paths = {"d_minus": str(negatives)} if negatives is not None else {}
    ctx = TrainContext(torch.device("cpu"), data, {"teacher": teacher or tiny(1)}, paths=paths)
    cfg = {"method": "unkt", "train": {"batch_size": 8}, **run}
    return METHODS[cfg["method"]](run_of(cfg), ctx)


def a_batch(data):
    batch = data.batch(torch.arange(0, 12))  # images 0, 1 and 2 (two captions), padded rows
    assert (batch.labels == PAD).any()
    return batch


def rkl_rows(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """exp(-KL(p || q)) averaged over rows (M, D), written out independently of losses.py."""
    kl = (p * (p.clamp_min(1e-30).log() - q.clamp_min(1e-8).log())).sum(-1)
    return torch.exp(-kl).mean()


def test_registered_and_needs_teacher():
    assert METHODS["unkt"] is UNKT and UNKT.needs == ("teacher",)


def test_loss_is_eq9_assembled_by_hand(data):
    teacher, student = tiny(1), tiny(2)
    obj = make(data, {"warmup_steps": 4}, teacher)
    batch = a_batch(data)
    lam = 0.5  # step 2 of a 4-step warm-up
    loss, extras = obj.loss(student, batch, 2, 10)

    mask = batch.labels != PAD
    with torch.no_grad():
        s_logits, _, s = student(batch.grid, batch.pooled, batch.inputs, return_internals=True)
        t_logits, _, t = teacher(batch.grid, batch.pooled, batch.inputs, return_internals=True)
        mle = mle_loss(s_logits, batch.labels, PAD)
        pred = soft_unlikelihood_loss(s_logits, t_logits, batch.labels, PAD)
        hid = [
            rkl_rows(t["hidden"][i][mask].softmax(-1), s["hidden"][i][mask].softmax(-1))
            for i in range(L)
        ]
        att = []
        for i in range(L):
            for kind in ("self_attn", "cross_attn"):
                # (B, H, N, S) -> rows of non-pad query positions, every head: (M * H, S)
                rows_t = t[kind][i].transpose(1, 2)[mask].flatten(0, 1)
                rows_s = s[kind][i].transpose(1, 2)[mask].flatten(0, 1)
                att.append(rkl_rows(rows_t, rows_s))
        expected = (1 - lam) * mle + lam * (pred + sum(hid) + sum(att))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert extras["lambda"] == lam
    assert float(extras["att"]) == pytest.approx(float(sum(att)), rel=1e-5)


@pytest.mark.parametrize("targets", ["soft", "hard"])
def test_token_reduction_and_top_k_reach_eq9(data, targets):
    """token_reduction: sum sums L_mle's and L_pred's token terms per caption (eq. 4, 5, 9 as
    printed); top_k narrows the soft targets of eq. 5 to the teacher's top k."""
    teacher, student = tiny(1), tiny(2)
    run = {"w_hid": 0, "w_att": 0, "lambda_schedule": "fixed", "lambda_value": 0.3}
    run |= {"targets": targets, "token_reduction": "sum"}
    run |= {"top_k": 5} if targets == "soft" else {}
    obj = make(data, run, teacher)
    assert obj.mean_over == "captions" and make(data, {}).mean_over == "tokens"
    batch = a_batch(data)
    loss, extras = obj.loss(student, batch, 0, 10)
    with torch.no_grad():
        s_logits = student(batch.grid, batch.pooled, batch.inputs)[0]
        mle = mle_loss(s_logits, batch.labels, PAD, reduction="sum")
        if targets == "soft":
            t_logits = teacher(batch.grid, batch.pooled, batch.inputs)[0]
            pred = soft_unlikelihood_loss(
                s_logits, t_logits, batch.labels, PAD, top_k=5, reduction="sum"
            )
        else:
            negatives = align_negatives(obj.greedy(batch.image_rows), batch.labels, PAD)
            pred = token_unlikelihood_loss(s_logits, negatives, PAD, reduction="sum")
    assert float(extras["mle"]) == pytest.approx(mle.item(), rel=1e-5)
    assert float(extras["pred"]) == pytest.approx(pred.item(), rel=1e-5)
    assert loss.item() == pytest.approx((0.7 * mle + 0.3 * pred).item(), rel=1e-5)
    mean_mle = mle_loss(s_logits, batch.labels, PAD)
    assert mle.item() > 2 * mean_mle.item()  # captions of several tokens: sums are larger


def test_pad_rows_do_not_count(data):
    """Changing the teacher's internals only at pad query positions changes nothing: compare
    two batches that differ only in the tokens fed at pad positions (garbage there)."""
    obj = make(data, {"lambda_schedule": "fixed", "lambda_value": 1.0})
    student = tiny(2)
    batch = a_batch(data)
    other = copy.copy(batch)
    other.inputs = batch.inputs.clone()
    pad_in = batch.labels == PAD  # query positions whose label is pad (right end)
    other.inputs[pad_in] = 7
    assert not torch.equal(other.inputs, batch.inputs)
    a, _ = obj.loss(student, batch, 0, 10)
    b, _ = obj.loss(student, other, 0, 10)
    assert a.item() == pytest.approx(b.item(), rel=1e-6)


def test_lambda_zero_is_exactly_mle(data):
    student, batch = tiny(2), a_batch(data)
    mle, _ = make(data, {"method": "mle"}).loss(student, batch, 0, 10)
    at_start, extras = make(data, {}).loss(student, batch, 0, 10)  # progressive: lambda(0) = 0
    assert at_start.item() == mle.item() and extras["lambda"] == 0.0
    no_negative = make(data, {"w_pred": 0, "w_hid": 0, "w_att": 0})
    assert no_negative.lam(500, 1000) == 0.0
    assert no_negative.loss(student, batch, 500, 1000)[0].item() == mle.item()


def test_lambda_schedules_and_epoch_warmup(data):
    assert steps_per_epoch(40, 8) == 5
    assert steps_per_epoch(40, 8, grad_accum=2) == 2.5
    assert steps_per_epoch(40, 64) == 1  # one smaller batch, as BatchOrder
    obj = make(data, {"warmup_epochs": 2})  # 40 captions / 8 = 5 steps an epoch -> 10
    assert obj.warmup == 10
    assert obj.lam(5, 110) == pytest.approx(0.5)
    assert obj.lam(10, 110) == pytest.approx(1.0)
    assert obj.lam(110, 110) == pytest.approx(0.5)  # eq. 10 as printed ends at 1/2
    assert obj.lam(2, 4) == pytest.approx(0.5)  # warm-up capped at the run's 4 steps
    assert make(data, {"warmup_steps": 3, "warmup_epochs": 2}).warmup == 3
    fixed = make(data, {"lambda_schedule": "fixed", "lambda_value": 0.5})
    assert fixed.lam(0, 10) == fixed.lam(9, 10) == 0.5


def test_selection_waits_for_the_whole_objective(data):
    """A checkpoint is selectable once the progressive warm-up has taken lambda to 1."""
    obj = make(data, {"warmup_epochs": 2})  # 10 steps of warm-up
    assert [obj.selectable(s, 110) for s in (0, 9, 10, 110)] == [False, False, True, True]
    assert obj.selectable(4, 4)  # warm-up capped at a shorter run: its last step counts
    fixed = make(data, {"lambda_schedule": "fixed", "lambda_value": 0.5})
    assert fixed.selectable(0, 110)
    assert make(data, {"method": "mle"}).selectable(0, 110)


@pytest.mark.parametrize(
    "run, message",
    [
        ({"attention": "encoder"}, "attention"),
        ({"targets": "sampled"}, "targets"),
        ({"lambda_schedule": "cosine"}, "lambda_schedule"),
        ({"lambda_value": 1.5}, "lambda_value"),
        ({"w_hid": -1}, "w_hid"),
        ({"temperature": 0}, "temperature"),
        ({"targets": "random"}, "d_minus"),
        ({"token_reduction": "max"}, "token_reduction"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"targets": "hard", "top_k": 5}, "unkt top_k = 5: keeps the teacher's top k"),
        ({"negative_captions": "model"}, "negative_captions"),
        ({"negative_captions": "teacher", "exclude_gold": True}, "exclude_gold = True"),
        ({"negative_decoding": "sample"}, "negative_decoding = 'sample'"),
        ({"negative_captions": "teacher", "targets": "hard", "negative_decoding": "sample"},
         "negative_decoding"),
        ({"negative_samples": 3}, "negative_samples = 3"),
        ({"negative_samples": 0}, "negative_samples"),
    ],
)
def test_bad_options_name_the_key(data, run, message):
    with pytest.raises(DistinctcapError, match=message):
        make(data, run)


def test_attention_choice_sets_the_terms(data):
    student, batch = tiny(2), a_batch(data)
    _, _, internals = student(batch.grid, batch.pooled, batch.inputs, return_internals=True)
    assert len(attention_maps(internals, "both")) == 2 * L
    assert attention_maps(internals, "cross")[1] is internals["cross_attn"][1]
    sizes = {}
    for which in ("self", "cross", "both"):
        run = {
            "attention": which,
            "w_pred": 0,
            "w_hid": 0,
            "lambda_schedule": "fixed",
            "lambda_value": 1.0,
        }
        sizes[which] = make(data, run).loss(student, batch, 0, 10)[0].item()
    assert sizes["both"] == pytest.approx(sizes["self"] + sizes["cross"], rel=1e-5)


def preset_runs() -> dict:
    return yaml.safe_load((ROOT / "presets" / "unkt-ablations.yaml").read_text())["runs"]


@pytest.mark.parametrize("name", [n for n, r in preset_runs().items() if r["method"] == "unkt"])
def test_every_preset_ablation_builds_and_gives_a_finite_loss(data, negatives, name):
    run = {**preset_runs()[name], "warmup_steps": 2}
    student, batch = tiny(2), a_batch(data)
    loss, extras = make(data, run, negatives=negatives).loss(student, batch, 2, 10)
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in student.parameters() if p.grad is not None)
    for key, term in (("w_pred", "pred"), ("w_hid", "hid"), ("w_att", "att")):
        assert (term in extras) == (run.get(key, 1) > 0)


def test_teacher_gets_no_gradient(data):
    teacher, student = tiny(1), tiny(2)
    teacher.requires_grad_(True)  # even if the trainer forgot to freeze it
    obj = make(data, {"lambda_schedule": "fixed", "lambda_value": 0.7}, teacher)
    loss, _ = obj.loss(student, a_batch(data), 0, 10)
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is not None for p in student.decoder.parameters())


def output_kl(teacher, student, batch) -> tuple[float, float]:
    """Mean KL(p_n || p_s) over non-pad positions and the student's mean probability of the
    teacher's most likely token."""
    with torch.no_grad():
        p_n = teacher(batch.grid, batch.pooled, batch.inputs)[0].softmax(-1)
        p_s = student(batch.grid, batch.pooled, batch.inputs)[0].softmax(-1)
    mask = batch.labels != PAD
    kl = (p_n * (p_n.log() - p_s.log())).sum(-1)[mask].mean()
    top = p_s.gather(-1, p_n.argmax(-1, keepdim=True)).squeeze(-1)[mask].mean()
    return kl.item(), top.item()


@pytest.mark.parametrize(
    "weights",
    [{"w_hid": 0, "w_att": 0}, {"w_pred": 0}],  # L_pred alone; the L_rkl terms alone
    ids=["L_pred", "L_rkl"],
)
def test_negative_terms_push_the_student_away_from_the_teacher(data, weights):
    teacher = tiny(1)
    student = copy.deepcopy(teacher)
    with torch.no_grad():  # a nearby student: at identical models the L_rkl gradient is 0
        for p in student.parameters():
            p.add_(0.02 * torch.randn_like(p))
    run = {**weights, "lambda_schedule": "fixed", "lambda_value": 1.0}  # negative terms only
    obj = make(data, run, teacher)
    batch = a_batch(data)
    kl0, top0 = output_kl(teacher, student, batch)
    hid0 = obj.loss(student, batch, 0, 10)[1].get("hid")
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    for _ in range(5):
        loss, _ = obj.loss(student, batch, 0, 10)
        opt.zero_grad()
        loss.backward()
        opt.step()
    kl1, top1 = output_kl(teacher, student, batch)
    assert kl1 > kl0 + 1e-3
    assert top1 < top0
    if hid0 is not None:  # L_rkl of the hidden states fell: the features moved apart
        assert obj.loss(student, batch, 0, 10)[1]["hid"] < hid0


def test_hard_targets_are_the_teachers_greedy_captions(data):
    teacher, batch = tiny(1), a_batch(data)
    cache = GreedyCaptions(teacher, data.features, PAD)
    hard = cache(batch.image_rows)
    assert hard.shape == (len(batch), MAXLEN)
    assert cache.done.sum() == len(torch.unique(batch.image_rows))  # each image decoded once
    caps = greedy(teacher, batch.grid, batch.pooled)
    for row, cap in zip(hard.tolist(), caps, strict=True):
        seq = [*cap.tokens, EOS][:MAXLEN]  # an untrained teacher may not stop: no eos then
        assert row == seq + [PAD] * (MAXLEN - len(seq))
    same_image = batch.image_ids == batch.image_ids[0]
    assert (hard[same_image] == hard[0]).all()
    cache.labels[batch.image_rows[0]] = 5  # a kept caption is not decoded again
    assert (cache(batch.image_rows[:1]) == 5).all()
    aligned = align_negatives(hard, batch.labels, PAD)
    assert aligned.shape == batch.labels.shape
    assert ((aligned == PAD) >= (batch.labels == PAD)).all()  # pad rows stay excluded
    n = batch.labels.shape[1]
    short = greedy(teacher, batch.grid, batch.pooled, max_len=n)  # greedy is prefix-consistent
    for row, cap in zip(aligned.tolist(), short, strict=True):
        seq = [*cap.tokens, EOS][:n]
        assert all(a in (t, PAD) for a, t in zip(row, seq, strict=False))


def test_random_targets_come_from_the_d_minus_captions(data, negatives):
    obj = make(data, {"targets": "random"}, negatives=negatives)
    d_minus = data.labels[::2]
    assert obj.pool.shape == d_minus.shape and torch.equal(obj.pool, d_minus)
    assert torch.equal(obj.pool_rows, data.image_rows[::2])
    batch = a_batch(data)
    short = align_negatives(obj.pool[:12, :3], batch.labels, PAD)
    assert short.shape == batch.labels.shape and (short[:, 3:] == PAD).all()
    torch.manual_seed(0)
    loss, extras = obj.loss(tiny(2), batch, 100, 100)
    assert torch.isfinite(loss) and extras["pred"] > 0
    with pytest.raises(DistinctcapError, match="none of the D- captions"):
        pd.DataFrame({"caption_id": [1, 2]}).to_parquet(negatives.parent / "other.parquet")
        make(data, {"targets": "random"}, negatives=negatives.parent / "other.parquet")


def test_every_preset_entry_trains_and_decodes(tmp_path, data, negatives):
    """Each preset entry through distinctcap.train.trainer.train (a few steps), then greedy
    decoding."""
    from distinctcap.train.data import RunData

    runs = preset_runs()
    base = {
        "seed": 0,
        "device": "cpu",
        "captioner": {"vocab_size": V, **captioner_cfg()},
        "train": {**TINY_TRAIN, "batch_size": 8},
    }
    run_data = RunData(data)
    paths = {}
    teachers = {"teacher_neg": {"method": "mle", "data": "all"}}
    teachers.update({k: v for k, v in runs.items() if v["method"] == "mle"})
    for name, block in teachers.items():  # teacher data selection does not matter here
        out = tmp_path / name
        fit({**base, "name": name, **block, "paths": {"out_dir": str(out)}}, run_data)
        paths[name] = out / "model.pt"
    for name, block in runs.items():
        if block["method"] != "unkt":
            continue
        cfg = {
            **base,
            "name": name,
            **block,
            "train": {**base["train"], **block.get("train", {})},  # the arm's selection too
            "warmup_epochs": 0.2,
            "paths": {"teacher": str(paths[block["teacher"]]), "d_minus": str(negatives)},
        }
        result = fit(cfg, run_data)
        assert result.steps == 3 and np.isfinite(result.curve["loss"]).all()
        caps = greedy(result.model, data.features.grid[:2].float(), data.features.pooled[:2])
        assert len(caps) == 2 and all(isinstance(c.tokens, list) for c in caps)


@pytest.mark.parametrize("targets", ["soft", "hard", "random"])
def test_resumed_mid_run_ends_with_the_uninterrupted_weights(tmp_path, data, negatives, targets):
    """Hard targets are re-decoded after a resume (greedy of the frozen teacher: the same
    captions); random targets come from the torch RNG that the checkpoint restores."""
    from distinctcap.train.data import RunData

    run_data = RunData(data)
    base = {
        "seed": 0,
        "device": "cpu",
        "captioner": {"vocab_size": V, **captioner_cfg(), "dropout": 0.1},
        "train": {**TINY_TRAIN, "steps": 5, "batch_size": 8},
    }
    teacher = tmp_path / "teacher"
    fit(
        {**base, "name": "teacher_neg", "method": "mle", "paths": {"out_dir": str(teacher)}},
        run_data,
    )
    cfg = {
        **base,
        "name": "unkt",
        "method": "unkt",
        "teacher": "teacher_neg",
        "targets": targets,
        "warmup_steps": 2,
        "paths": {"teacher": str(teacher / "model.pt"), "d_minus": str(negatives)},
    }
    whole = fit(cfg, run_data)
    cfg["paths"]["out_dir"] = str(tmp_path / "unkt")
    kill_after(cfg, run_data, 3)
    resumed = fit(cfg, run_data)
    assert resumed.resumed_from == 3
    after = resumed.model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in whole.model.state_dict().items())


TEACHER_READING = {"negative_captions": "teacher", "lambda_schedule": "fixed", "lambda_value": 0.5}


def test_teacher_reading_is_eq9_on_the_teachers_greedy_captions(data):
    """negative_captions: teacher: L_mle on the gold captions; L_pred, L_hid and L_att with
    teacher and student both teacher-forced on the teacher's greedy caption of each distinct
    image of the batch, decoded once an image and kept."""
    teacher, student, batch = tiny(1), tiny(2), a_batch(data)
    obj = make(data, TEACHER_READING, teacher)
    loss, extras = obj.loss(student, batch, 0, 10)
    images = torch.unique(batch.image_rows)
    assert int(obj.greedy.done.sum()) == len(images)  # one greedy pass per image
    with torch.no_grad():
        s_gold = student(batch.grid, batch.pooled, batch.inputs)[0]
        caps = greedy(teacher, data.features.grid[images], data.features.pooled[images])
        labels = torch.full((len(caps), MAXLEN), PAD)
        for row, cap in enumerate(caps):
            seq = [*cap.tokens, EOS][:MAXLEN]
            labels[row, : len(seq)] = torch.tensor(seq)
        inputs, labels = teacher_forcing(labels, PAD)
        grid, pooled = data.features.grid[images], data.features.pooled[images]
        s_logits, _, s = student(grid, pooled, inputs, return_internals=True)
        t_logits, _, t = teacher(grid, pooled, inputs, return_internals=True)
        mask = labels != PAD
        pred = soft_unlikelihood_loss(s_logits, t_logits, labels, PAD)
        hid = [rkl_rows(t["hidden"][i][mask].softmax(-1), s["hidden"][i][mask].softmax(-1))
               for i in range(L)]  # fmt: skip
        att = [
            rkl_rows(t[k][i].transpose(1, 2)[mask].flatten(0, 1),
                     s[k][i].transpose(1, 2)[mask].flatten(0, 1))
            for i in range(L) for k in ("self_attn", "cross_attn")
        ]  # fmt: skip
        expected = 0.5 * mle_loss(s_gold, batch.labels, PAD) + 0.5 * (pred + sum(hid) + sum(att))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert float(extras["pred"]) == pytest.approx(pred.item(), rel=1e-5)
    obj.greedy.labels[images] = 5  # later steps read the kept captions, not a new decode
    assert not torch.isclose(obj.loss(student, batch, 0, 10)[0], loss)


def test_teacher_forcing_shifts_labels_into_inputs():
    labels = torch.tensor([[5, 6, EOS, PAD, PAD], [7, EOS, PAD, PAD, PAD]])
    inputs, trimmed = teacher_forcing(labels, PAD)
    assert trimmed.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert inputs.tolist() == [[1, 5, 6], [1, 7, PAD]]  # [bos] + tokens, pad where label is


@pytest.mark.parametrize(
    "run",
    [
        {"negative_decoding": "sample", "negative_samples": 3},
        {"targets": "hard"},
        {"targets": "random"},
        {"w_pred": 0},
        {"w_hid": 0, "w_att": 0, "token_reduction": "sum", "top_k": 3},
    ],
)
def test_teacher_reading_variants_give_finite_gradients(data, negatives, run):
    student, batch = tiny(2), a_batch(data)
    torch.manual_seed(0)
    obj = make(data, {**TEACHER_READING, **run}, negatives=negatives)
    loss, extras = obj.loss(student, batch, 0, 10)
    assert torch.isfinite(loss) and ("pred" in extras) == (run.get("w_pred", 1) > 0)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in student.parameters() if p.grad is not None)
    if run.get("targets") == "random":  # a D- caption of another image, the torch RNG's
        rows = torch.unique(batch.image_rows)
        torch.manual_seed(1)
        pick = captions_of_other_images(obj.pool_rows, rows)
        assert (obj.pool_rows[pick] != rows).all()
        torch.manual_seed(1)
        _, _, labels = obj.negative_captions(rows, batch.grid[:3], batch.pooled[:3])
        assert torch.equal(labels, obj.pool[pick][:, : labels.shape[1]])
    if run.get("negative_decoding") == "sample":  # n captions an image, drawn afresh
        image, _, _ = obj.negative_captions(torch.tensor([0, 1]), batch.grid[:2], batch.pooled[:2])
        assert image.tolist() == [0, 0, 0, 1, 1, 1]


# Hand cases of the two readings: a tabular student (free logits per caption prefix) trained on
# (1 - lam) L_mle + lam L_pred with the real loss functions. Tokens: 4 = a, 5 = b, 6 = c, 7 = d.
VOCAB, LAM = 8, 0.5


def teacher_table(sure: dict) -> torch.Tensor:
    """Teacher logits (V,) with probability sure[token] on each listed token, ~0 elsewhere."""
    logits = torch.full((VOCAB,), -40.0)
    for token, p in sure.items():
        logits[token] = float(np.log(p))
    return logits


def optimum_p_gold(gold: list[int], negative: list[int], teacher: dict, steps: int = 50):
    """p_s(gold token | gold prefix) at each gold position after minimising (1 - lam) L_mle on
    `gold` + lam L_pred on the `negative` caption, the student's logits a table by prefix (a
    shared prefix shares its logits), the teacher's distribution `teacher[prefix]`."""
    prefixes = {tuple(c[:i]) for c in (gold, negative) for i in range(len(c))}
    table = {p: torch.zeros(VOCAB, requires_grad=True) for p in prefixes}
    opt = torch.optim.LBFGS(table.values(), max_iter=steps, line_search_fn="strong_wolfe")

    def logits_of(caption):
        return torch.stack([table[tuple(caption[:i])] for i in range(len(caption))])[None]

    t_logits = torch.stack([teacher[tuple(negative[:i])] for i in range(len(negative))])[None]

    def closure():
        opt.zero_grad()
        mle = mle_loss(logits_of(gold), torch.tensor([gold]), PAD)
        pred = soft_unlikelihood_loss(logits_of(negative), t_logits, torch.tensor([negative]), PAD)
        loss = (1 - LAM) * mle + LAM * pred
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return [table[tuple(gold[:i])].softmax(-1)[t].item() for i, t in enumerate(gold)]


def formula(q: float) -> float:
    """The optimum of (1 - lam) L_mle + lam L_pred where both read the same prefix and the
    teacher gives the gold token probability q."""
    return (1 - LAM) / (1 - LAM + LAM * q)


def test_teacher_reading_leaves_p_gold_at_one_where_the_captions_differ():
    """Teacher caption "c d", gold "a b", different from the first token: after it L_pred
    never reads a gold prefix, and the optimum of p_s(gold) is 1 (L_mle's alone). The first
    token is predicted from the one prefix both share, the empty one, where the teacher gives
    "a" q = 0.05: the formula, 0.95. The gold reading of the same teacher: the formula at both
    positions (q(b | a) = 0.7)."""
    gold, own = [4, 5], [6, 7]
    teacher = {
        (): teacher_table({6: 0.95, 4: 0.05}),
        (6,): teacher_table({7: 1.0}),
        (4,): teacher_table({5: 0.7, 7: 0.3}),
    }
    first, second = optimum_p_gold(gold, own, teacher)
    assert first == pytest.approx(formula(0.05), abs=0.01) and second > 0.99
    gold_reading = optimum_p_gold(gold, gold, teacher)
    assert gold_reading == pytest.approx([formula(0.05), formula(0.7)], abs=0.01)


def test_where_the_captions_coincide_the_optimum_is_the_formula():
    """Teacher caption = gold caption "a b" (the gold reading is this case at every position):
    (1 - lam) L_mle + lam L_pred is least at p_s(gold) = (1 - lam) / (1 - lam + lam q), q the
    teacher's probability of the gold token; here q = 0.9 then 0.6."""
    gold = [4, 5]
    teacher = {(): teacher_table({4: 0.9, 6: 0.1}), (4,): teacher_table({5: 0.6, 7: 0.4})}
    assert optimum_p_gold(gold, gold, teacher) == pytest.approx(
        [formula(0.9), formula(0.6)], abs=0.01
    )


def test_shared_prefix_then_divergent_prefix():
    """Teacher caption "a c d", gold "a b a": the first two gold tokens are predicted from
    prefixes the teacher's caption shares ((), (a)), so the formula holds there (q = 0.8,
    0.3); the third reads (a, b), which L_pred never reads, and p_s(a | a b) goes to 1."""
    gold, own = [4, 5, 4], [4, 6, 7]
    teacher = {
        (): teacher_table({4: 0.8, 7: 0.2}),
        (4,): teacher_table({6: 0.7, 5: 0.3}),
        (4, 6): teacher_table({7: 0.9, 4: 0.1}),
    }
    *shared, last = optimum_p_gold(gold, own, teacher)
    assert shared == pytest.approx([formula(0.8), formula(0.3)], abs=0.01)
    assert last > 0.99


@pytest.mark.parametrize(
    ("options", "decoded"),
    # batch images 0, 1, 2: greedy captions decoded once an image and kept (two steps: 3);
    # two samples an image drawn afresh every step (2 x 3 x 2)
    [
        ({"negative_decoding": "greedy"}, 3),
        ({"negative_decoding": "sample", "negative_samples": 2}, 12),
    ],
)
def test_the_teachers_captions_are_counted_where_they_are_decoded(data, options, decoded):
    obj = make(data, {"negative_captions": "teacher", **options})
    with work.counting() as counted:
        for step in (500, 501):
            obj.loss(tiny(0), a_batch(data), step, 1000)
    assert counted == {"decoded": decoded}
