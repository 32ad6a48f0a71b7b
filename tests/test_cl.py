"""CL objective (methods/cl.py) on a tiny captioner: the loss is contrastive_loss (CL eq. 7-10)
of the right pairs, negatives come from other images and are reproducible, P/N-only ablations,
a frozen reference, reference replacement (Table 6), and optimisation lowers the loss."""

import copy
import math

import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT, TINY_CAPTIONER, TINY_TRAIN, shrink_runs, tiny_captioner
from train_job import fit, kill_after, run_of

from distinctcap.captioner.model import Captioner
from distinctcap.captioner.search import sequence_logprob
from distinctcap.config.check import load_schema, validate
from distinctcap.config.rungraph import effective_run_config
from distinctcap.core import work
from distinctcap.core.errors import DistinctcapError
from distinctcap.features.batches import CaptionData
from distinctcap.features.read import ImageFeatures
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext
from distinctcap.methods.cl import ContrastiveLearning, sample_negatives, step_generator
from distinctcap.methods.losses import contrastive_loss
from distinctcap.train.data import RunData

pytestmark = pytest.mark.usefixtures("one_thread")

V, DV, DP, G = 20, 6, 5, 7
IMAGES, PER_IMAGE = 6, 3
ROWS = [0, 4, 7, 11]  # a micro-batch: captions of images 0, 1, 2, 3


def captioner(seed: int) -> Captioner:
    return tiny_captioner(V, DV, DP, seed)


def caption_data(image_ids: np.ndarray, seed: int = 0) -> tuple[CaptionData, list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    distinct = np.unique(image_ids)
    feats = ImageFeatures(
        distinct,
        torch.randn(len(distinct), DP, generator=g),
        torch.randn(len(distinct), G, DV, generator=g).half(),
    )
    lengths = torch.randint(2, 7, (len(image_ids),), generator=g).tolist()
    tokens = [torch.randint(4, V, (n,), generator=g).tolist() for n in lengths]
    return CaptionData(feats, np.arange(len(image_ids)) + 100, image_ids, tokens, 8), tokens


@pytest.fixture
def data():
    return caption_data(np.repeat(np.arange(IMAGES) * 10, PER_IMAGE))


def objective(data, reference, **options) -> ContrastiveLearning:
    ctx = TrainContext(torch.device("cpu"), data, {"reference": reference})
    return METHODS["cl"](run_of({"name": "cl", "method": "cl", "seed": 3, **options}), ctx)


def frozen(model: Captioner) -> Captioner:
    return copy.deepcopy(model).eval().requires_grad_(False)


def hand_logprobs(model, batch, tokens, neg):
    """log p(c|I) of the positives (B,) and negatives (B, K), scored one by one by search.py."""
    pos = sequence_logprob(model, batch.grid, batch.pooled, [tokens[i] for i in ROWS])
    k = neg.shape[1]
    neg_lp = sequence_logprob(
        model,
        batch.grid,
        batch.pooled,
        [tokens[j] for j in neg.flatten().tolist()],
        image_index=torch.arange(len(ROWS)).repeat_interleave(k),
    )
    return pos, neg_lp.view(len(ROWS), k)


@pytest.mark.parametrize(
    ("nu", "in_sigmoid", "effective_nu"), [(1.0, True, 1.0), (2.0, True, 2.0), (2.0, False, 1.0)]
)
def test_loss_is_contrastive_loss_of_hand_scored_pairs(data, nu, in_sigmoid, effective_nu):
    data, tokens = data
    target, reference = captioner(0).eval(), frozen(captioner(1))
    obj = objective(data, reference, negatives=3, nu=nu, nu_in_sigmoid=in_sigmoid)
    batch = data.batch(ROWS)
    loss, extras = obj.loss(target, batch, 5, 10)
    neg = obj.negatives(batch, 5)
    pos_t, neg_t = hand_logprobs(target, batch, tokens, neg)
    pos_r, neg_r = hand_logprobs(reference, batch, tokens, neg)
    expected = contrastive_loss(pos_t, pos_r, neg_t, neg_r, nu=effective_nu)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert float(extras["g_pos"]) == pytest.approx((pos_t - pos_r).mean().item(), abs=1e-4)
    assert float(extras["g_neg"]) == pytest.approx((neg_t - neg_r).mean().item(), abs=1e-4)


@pytest.mark.parametrize(
    ("constraints", "expected"),
    [("both", 2 * math.log(2)), ("positive", math.log(2)), ("negative", math.log(2))],
)
def test_identical_target_and_reference_give_ln_two_per_constraint(data, constraints, expected):
    data, _ = data
    target = captioner(0)
    obj = objective(data, frozen(target), constraints=constraints)
    loss, _ = obj.loss(target, data.batch(ROWS), 0, 10)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()  # grad J != 0 at identical models (CL §4.3)
    assert sum(float(p.grad.abs().sum()) for p in target.parameters() if p.grad is not None) > 0


def test_positive_only_and_negative_only_match_their_halves(data):
    data, tokens = data
    target, reference = captioner(0).eval(), frozen(captioner(1))
    batch = data.batch(ROWS)
    neg = objective(data, reference, negatives=2).negatives(batch, 4)
    pos_t, neg_t = hand_logprobs(target, batch, tokens, neg)
    pos_r, neg_r = hand_logprobs(reference, batch, tokens, neg)
    p_only = objective(data, reference, negatives=2, constraints="positive")
    n_only = objective(data, reference, negatives=2, constraints="negative")
    assert len(p_only.rows(batch, 4)[0]) == len(ROWS)
    assert len(n_only.rows(batch, 4)[0]) == 2 * len(ROWS)
    p_loss = p_only.loss(target, batch, 4, 10)[0].item()
    n_loss = n_only.loss(target, batch, 4, 10)[0].item()
    assert p_loss == pytest.approx(contrastive_loss(pos_t, pos_r).item(), abs=1e-5)
    assert n_loss == pytest.approx(contrastive_loss(None, None, neg_t, neg_r).item(), abs=1e-5)


def test_negatives_never_come_from_the_same_image(data):
    data, _ = data
    obj = objective(data, frozen(captioner(0)), negatives=5)
    for step in range(20):
        batch = data.batch(torch.arange(step % 6, step % 6 + 12) % len(data))
        neg = obj.negatives(batch, step)
        assert neg.shape == (12, 5)
        assert (data.image_ids[neg] != batch.image_ids[:, None]).all()


def test_negatives_found_when_one_image_owns_almost_every_caption():
    image_ids = torch.tensor([7] * 200 + [8])
    own = torch.tensor([7, 7, 7])
    neg = sample_negatives(image_ids, own, 4, torch.Generator().manual_seed(0))
    assert (neg == 200).all()  # the only caption of another image
    with pytest.raises(DistinctcapError, match="at least two images"):
        sample_negatives(torch.tensor([7, 7]), torch.tensor([7]), 1, torch.Generator())


def test_one_image_only_is_an_error():
    data, _ = caption_data(np.zeros(4, dtype=np.int64))
    with pytest.raises(DistinctcapError, match="at least two images"):
        objective(data, frozen(captioner(0)))


def test_negatives_are_reproducible_for_the_same_seed_and_step(data):
    data, _ = data
    batch = data.batch(ROWS)
    first = objective(data, frozen(captioner(0))).negatives(batch, 7)
    resumed = objective(data, frozen(captioner(0))).negatives(batch, 7)  # a fresh objective
    assert torch.equal(first, resumed)
    assert not torch.equal(first, objective(data, frozen(captioner(0))).negatives(batch, 8))
    ctx = TrainContext(torch.device("cpu"), data, {"reference": frozen(captioner(0))})
    other_seed = ContrastiveLearning(run_of({"seed": 4}), ctx).negatives(batch, 7)
    assert not torch.equal(first, other_seed)
    g1 = step_generator(3, 7, batch.caption_ids)
    g2 = step_generator(3, 7, batch.caption_ids[:2])  # another micro-batch of the same step
    assert not torch.equal(torch.rand(8, generator=g1), torch.rand(8, generator=g2))


def test_reference_gets_no_gradient_and_does_not_move(data):
    data, _ = data
    target, reference = captioner(0), frozen(captioner(1))
    before = copy.deepcopy(reference.state_dict())
    obj = objective(data, reference)
    opt = torch.optim.Adam(target.parameters(), lr=1e-2)
    loss, _ = obj.loss(target, data.batch(ROWS), 0, 10)
    loss.backward()
    opt.step()
    assert all(p.grad is None for p in reference.parameters())
    assert all(torch.equal(v, before[k]) for k, v in reference.state_dict().items())


def test_reference_replacement_copies_the_target_weights(data):
    data, _ = data
    target, reference = captioner(0), frozen(captioner(1))
    original = copy.deepcopy(reference.state_dict())
    obj = objective(data, reference, replace_reference_every=2)
    batch = data.batch(ROWS)
    for step in (0, 1):
        obj.loss(target, batch, step, 10)
        assert all(torch.equal(v, original[k]) for k, v in reference.state_dict().items())
    obj.loss(target, batch, 2, 10)
    copied = copy.deepcopy(target.state_dict())
    assert all(torch.equal(v, copied[k]) for k, v in reference.state_dict().items())
    assert all(p.grad is None and not p.requires_grad for p in reference.parameters())
    assert not reference.training
    with torch.no_grad():  # a later micro-batch of step 2 must not copy again
        next(target.parameters()).add_(1.0)
    obj.loss(target, batch, 2, 10)
    assert all(torch.equal(v, copied[k]) for k, v in reference.state_dict().items())
    # resume: a fresh objective with the original reference takes the replaced one back
    fresh_reference = frozen(captioner(1))
    resumed = objective(data, fresh_reference, replace_reference_every=2)
    resumed.load_state_dict(obj.state_dict())
    assert resumed.replaced_at == 2
    assert all(torch.equal(v, copied[k]) for k, v in fresh_reference.state_dict().items())


def test_a_few_steps_lower_the_cl_loss(data):
    data, _ = data
    target = captioner(0)
    obj = objective(data, frozen(captioner(0)))
    batch = data.batch(ROWS)
    opt = torch.optim.Adam(target.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss, _ = obj.loss(target, batch, 0, 10)  # step 0 every time: the same negatives
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"constraints": "pos"}, "runs.cl.constraints = 'pos': choose one of"),
        ({"negatives": 0}, "runs.cl.negatives = 0: allowed >= 1"),
        ({"nu": 0}, "runs.cl.nu = 0: allowed > 0"),
        ({"replace_reference_every": -1}, "runs.cl.replace_reference_every = -1"),
    ],
)
def test_bad_options_name_the_key(data, options, message):
    data, _ = data
    with pytest.raises(DistinctcapError, match=message):
        objective(data, frozen(captioner(0)), **options)


# -- the preset's ablation entries train through the real trainer ---------------------------

PRESET = ROOT / "presets" / "cl-smile-ablations.yaml"
PRESET_RUNS = yaml.safe_load(PRESET.read_text())["runs"]
BASE_RUNS = {
    "reference": {"method": "mle"},
    "cl": {"method": "cl", "init": "reference", "reference": "reference"},
    "smile": {"method": "smile", "init": "reference"},
}
CAPTIONER = {**TINY_CAPTIONER, "vocab_size": V, "dec_layers": 1}


def preset_config() -> dict:
    schema = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")
    config = validate({"runs": shrink_runs({**BASE_RUNS, **PRESET_RUNS}, TINY_TRAIN)}, schema)
    return {**config, "train": TINY_TRAIN, "captioner": CAPTIONER, "device": "cpu"}


def test_preset_entries_are_valid_runs():
    config = preset_config()
    assert config["runs"]["cl_neg_only"]["negatives"] == 5  # schema default filled
    assert config["runs"]["smile_mle_0_01"]["mle_weight"] == 0.01


@pytest.fixture(scope="module")
def trained_reference(tmp_path_factory):
    """A tiny MLE reference, trained 3 steps by the real trainer, saved like a run's model.pt."""
    data, _ = caption_data(np.repeat(np.arange(IMAGES) * 10, PER_IMAGE))
    config = preset_config()
    result = fit(effective_run_config(config, "reference"), RunData(data))
    path = tmp_path_factory.mktemp("reference") / "model.pt"
    result.model.save(path)
    return config, RunData(data), path


@pytest.mark.parametrize("name", sorted(PRESET_RUNS))
def test_every_preset_entry_trains_a_few_steps(trained_reference, name):
    config, data, path = trained_reference
    cfg = effective_run_config(config, name)
    cfg["paths"] = {edge: str(path) for edge in ("init", "reference") if cfg.get(edge)}
    result = fit(cfg, data)
    assert result.steps == TINY_TRAIN["steps"]
    assert np.isfinite(result.curve["loss"]).all()
    if cfg["method"] == "cl" and cfg["constraints"] != "negative":
        assert "g_pos" in result.curve


@pytest.mark.parametrize("replace_every", [0, 2])
def test_cl_resumed_mid_run_ends_with_the_uninterrupted_weights(
    trained_reference, tmp_path, replace_every
):
    config, data, path = trained_reference
    cfg = effective_run_config(config, "cl")
    cfg["replace_reference_every"] = replace_every
    cfg["train"] = {**cfg["train"], "steps": 5, "checkpoint_every": 0}
    cfg["paths"] = {"init": str(path), "reference": str(path)}
    whole = fit(cfg, data)
    cfg["paths"]["out_dir"] = str(tmp_path)
    kill_after(cfg, data, 3)  # the reference was replaced at step 2 (when replace_every = 2)
    resumed = fit(cfg, data)
    assert resumed.resumed_from == 3
    after = resumed.model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in whole.model.state_dict().items())


def test_the_negatives_scored_are_counted(data):
    data, _ = data
    obj = objective(data, frozen(captioner(1)), negatives=3)
    with work.counting() as counted:
        obj.loss(captioner(0), data.batch(ROWS), 0, 10)
    assert counted == {"cl_negatives": 3 * len(ROWS)}
