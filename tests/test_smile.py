"""SMILE objective (methods/smile.py) on a tiny captioner: it is smile_loss (SMILE eq. 2-3) of
the batch, mixed with MLE by eq. 4, every subset builds, and optimisation lowers the loss."""

import numpy as np
import pytest
import torch
from conftest import tiny_captioner
from train_job import run_of

from distinctcap.captioner.model import Captioner
from distinctcap.core.errors import DistinctcapError
from distinctcap.features.batches import CaptionData
from distinctcap.features.read import ImageFeatures
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext
from distinctcap.methods.cl import step_generator
from distinctcap.methods.losses import mle_loss, smile_loss

pytestmark = pytest.mark.usefixtures("one_thread")

V, DV, DP, G = 20, 6, 5, 7


@pytest.fixture
def model() -> Captioner:
    return tiny_captioner(V, DV, DP)


@pytest.fixture
def data() -> CaptionData:
    g = torch.Generator().manual_seed(0)
    feats = ImageFeatures(
        np.arange(4), torch.randn(4, DP, generator=g), torch.randn(4, G, DV, generator=g).half()
    )
    tokens = [torch.randint(4, V, (n,), generator=g).tolist() for n in (2, 5, 3, 6, 4, 2)]
    return CaptionData(feats, np.arange(6), np.array([0, 0, 1, 2, 3, 3]), tokens, 8)


def smile(data, **options):
    ctx = TrainContext(torch.device("cpu"), data)
    return METHODS["smile"](run_of({"name": "smile", "method": "smile", "seed": 1, **options}), ctx)


def logits_of(model, batch):
    return model(batch.grid, batch.pooled, batch.inputs)[0]


@pytest.mark.parametrize("first_token_mle", [True, False])
def test_objective_is_smile_loss_of_the_batch(model, data, first_token_mle):
    batch = data.batch(range(6))
    loss, extras = smile(data, first_token_mle=first_token_mle).loss(model, batch, 0, 10)
    expected = smile_loss(logits_of(model, batch), batch.labels, 0, first_token_mle)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert extras == {"smile": pytest.approx(expected.item(), abs=1e-6)}


@pytest.mark.parametrize("lam", [1.0, 0.5, 0.01])
def test_mle_weight_mixes_by_eq_4(model, data, lam):
    batch = data.batch(range(6))
    loss, extras = smile(data, mle_weight=lam).loss(model, batch, 0, 10)
    logits = logits_of(model, batch)
    s, m = smile_loss(logits, batch.labels, 0).item(), mle_loss(logits, batch.labels, 0).item()
    assert loss.item() == pytest.approx(lam * m + (1 - lam) * s, abs=1e-6)
    assert float(extras["smile"]) == pytest.approx(s, abs=1e-6)
    assert float(extras["mle"]) == pytest.approx(m, abs=1e-6)
    assert m > s  # the subset softmax gives the label more mass than the full one


def test_reverse_subset_is_smile_loss_reverse(model, data):
    batch = data.batch(range(6))
    loss, _ = smile(data, subset="reverse").loss(model, batch, 0, 10)
    expected = smile_loss(logits_of(model, batch), batch.labels, 0, subset="reverse")
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)


def test_random_subset_is_seeded_by_seed_step_and_batch(model, data):
    batch = data.batch(range(6))
    obj = smile(data, subset="random")
    loss, _ = obj.loss(model, batch, 3, 10)
    gen = step_generator(1, 3, batch.caption_ids)
    expected = smile_loss(logits_of(model, batch), batch.labels, 0, subset="random", generator=gen)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert smile(data, subset="random").loss(model, batch, 3, 10)[0].item() == loss.item()
    others = {round(obj.loss(model, batch, step, 10)[0].item(), 6) for step in range(4, 9)}
    assert len(others - {round(loss.item(), 6)}) > 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subset": "all"}, "runs.smile.subset = 'all': choose one of"),
        ({"mle_weight": 1.5}, "runs.smile.mle_weight = 1.5: allowed 0 <= mle_weight <= 1"),
    ],
)
def test_bad_options_name_the_key(data, options, message):
    with pytest.raises(DistinctcapError, match=message):
        smile(data, **options)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"subset": "random"},
        {"subset": "reverse"},
        {"mle_weight": 0.1},
        {"first_token_mle": False},
    ],
)
def test_a_few_steps_lower_the_loss(model, data, options):
    obj = smile(data, **options)
    batch = data.batch(range(6))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss, _ = obj.loss(model, batch, 0, 10)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05
