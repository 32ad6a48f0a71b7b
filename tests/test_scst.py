"""Self-critical sequence training (methods.scst): the objective's CIDEr-D reward against the
evaluation's CIDEr-D (the token-id CIDEr-D itself: tests/test_scores.py), the baselines and
the REINFORCE loss on hand-computed cases, the CLIP rewards, sampling, and runs of a tiny
model through the real trainer (training, resume)."""

import re

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from conftest import CLIP_TESTS_CAPTIONER, CLIP_TESTS_TRAIN, ROOT, shrink_runs
from train_job import fit, kill_after, run_of

import distinctcap.clip.weights  # noqa: F401  (registers the tiny `shapes-vit-tiny` architecture)
import distinctcap.train.clip  # save_weights
from distinctcap.captioner.search import sample, sample_ids
from distinctcap.clip.text import ClipTextEncoder
from distinctcap.config.check import load_schema, validate
from distinctcap.config.rungraph import effective_run_config
from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import CLIPSCORE_PREFIX, EOS, PAD, CaptionTokenizer, clip_bpe_ids
from distinctcap.features.batches import CaptionData
from distinctcap.features.read import ImageFeatures
from distinctcap.methods.base import TrainContext
from distinctcap.methods.rewards import (
    clipscore_reward,
    greedy_advantages,
    new_scst_advantages,
    reinforce_loss,
    retrieval_reward,
)
from distinctcap.methods.scst import SCST
from distinctcap.scores.cider import CiderD, TokenCiderD
from distinctcap.train.data import RunData

pytestmark = pytest.mark.usefixtures("one_thread")

ARCH = "shapes-vit-tiny"

# ------------------------------------------------------------------ baselines and the loss


def test_new_scst_baseline_and_loss_hand_computed():
    """2 images x 3 samples. Baseline of a sample = mean of its image's other two rewards:
    image 0 rewards (1, 2, 3) -> advantages (1 - 2.5, 2 - 2, 3 - 1.5) = (-1.5, 0, 1.5); image 1
    (0, 0, 3) -> (-1.5, -1.5, 3). Every token's log-prob is -1 and the samples have 3, 2, 1,
    3, 2, 1 tokens (eos included; 12 in all), so
    L = -sum_n A_n * (-len_n) / 12 = (-4.5 + 0 + 1.5 - 4.5 - 3 + 3) / 12 = -0.625."""
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]], dtype=torch.float64)
    adv = new_scst_advantages(rewards)
    assert adv.tolist() == [[-1.5, 0.0, 1.5], [-1.5, -1.5, 3.0]]
    lengths = torch.tensor([3, 2, 1, 3, 2, 1])
    mask = torch.arange(3)[None, :] < lengths[:, None]
    logp = torch.where(mask, -1.0, -100.0).requires_grad_()  # masked positions must not count
    loss = reinforce_loss(logp, mask, adv.view(-1).float())
    assert loss.item() == pytest.approx(-0.625, abs=1e-7)
    loss.backward()
    expected = torch.where(mask, -adv.view(-1, 1).float() / 12, 0.0)
    assert torch.allclose(logp.grad, expected)
    with pytest.raises(DistinctcapError, match="k >= 2"):
        new_scst_advantages(rewards[:, :1])


def test_greedy_baseline_hand_computed():
    """Rennie et al. eq. 9: each sample's reward minus its image's greedy caption's."""
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]])
    assert greedy_advantages(rewards, torch.tensor([2.0, 1.0])).tolist() == [
        [-1.0, 0.0, 1.0],
        [-1.0, -1.0, 2.0],
    ]


def test_retrieval_and_clipscore_rewards_hand_computed():
    """Images e0 = (1, 0), e1 = (0, 1); caption 0 (of image 0) = (1, 0), caption 1 (of image 1)
    = (0.8, 0.6); margin 0.1. Caption 0: [0.1 - 1 + s(e1, c0) = 0]_+ = 0 and
    [0.1 - 1 + s(e0, c1) = 0.8]_+ = 0 -> r = 0. Caption 1: [0.1 - 0.6 + s(e0, c1) = 0.8]_+ = 0.3
    and [0.1 - 0.6 + s(e1, c0) = 0]_+ = 0 -> r = -0.3. CLIPScore: 2.5 * (1, 0.6) = (2.5, 1.5)."""
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    text = torch.tensor([[1.0, 0.0], [0.8, 0.6]])
    image_of = torch.tensor([0, 1])
    got = retrieval_reward(text, images, image_of, margin=0.1)
    assert torch.allclose(got, torch.tensor([0.0, -0.3]))
    assert torch.allclose(clipscore_reward(text, images, image_of), torch.tensor([2.5, 1.5]))
    # a caption pointing away from its image scores 0, not less (the max(cos, 0) of eq. 1)
    assert clipscore_reward(-text[:1], images[:1], image_of[:1]).item() == 0.0
    # one image in the batch: no negatives, no hinge
    assert retrieval_reward(text[:1], images[:1], image_of[:1], 0.1).item() == 0.0


# ------------------------------------------------------------------ a tiny world

TEXTS = [
    ["a red circle left of a blue square", "a red circle and a blue square"],
    ["a small green triangle", "a green triangle"],
    ["some shapes on a grey background", "shapes on grey"],
    ["a large yellow star above a purple circle", "a yellow star"],
    ["two blue squares", "blue squares"],
    ["a picture of some shapes", "some shapes"],
]


@pytest.fixture(scope="module")
def clip():
    torch.manual_seed(0)
    return open_clip.create_model(ARCH).eval()  # random weights: no download


@pytest.fixture(scope="module")
def tok():
    return CaptionTokenizer.fit([t for texts in TEXTS for t in texts] + [CLIPSCORE_PREFIX])


def clip_embed_dim() -> int:
    return open_clip.get_model_config(ARCH)["embed_dim"]


def world(clip, tok):
    """Six images with two captions each; CLIP image embeddings = the first caption's text
    embedding (so the CLIP rewards have an optimum), random grid features."""
    with torch.no_grad():
        raw = clip.encode_text(open_clip.get_tokenizer(ARCH)([t[0] for t in TEXTS]))
    grid = torch.randn(len(TEXTS), 4, 16, generator=torch.Generator().manual_seed(0)).half()
    ids = np.arange(100, 100 + len(TEXTS))
    feats = ImageFeatures(ids, F.normalize(raw, dim=-1), grid, raw.norm(dim=-1))
    captions = [(i, t) for i, texts in enumerate(TEXTS) for t in texts]
    return CaptionData(
        feats,
        np.arange(len(captions)),
        ids[[i for i, _ in captions]],
        [tok.encode(t) for _, t in captions],
        max_len=12,
    )


def test_sample_ids_are_samples_captions(tok):
    """`sample_ids` draws `sample`'s captions (the same law, the same generator draws)."""
    from conftest import tiny_captioner

    model = tiny_captioner(tok.vocab_size, 16, 8, seed=0, max_len=12)
    grid, pooled = torch.randn(3, 4, 16), torch.randn(3, 8)
    seqs, logprob = sample_ids(model, grid, pooled, 4, torch.Generator().manual_seed(5))
    caps = sample(model, grid, pooled, 4, generator=torch.Generator().manual_seed(5))
    flat = [c for image in caps for c in image]
    for row, cap in zip(seqs.tolist(), flat, strict=True):
        assert [t for t in row if t not in (PAD, EOS)] == cap.tokens
    assert torch.allclose(logprob, torch.tensor([c.logprob for c in flat]))


def test_prefixed_clip_tokens_match_open_clip(clip, tok):
    """The CLIPScore reward encodes "A photo depicts <caption>" as the evaluation does."""
    texts = [t[0] for t in TEXTS]
    enc = ClipTextEncoder(clip, tok.clip_ids, clip_bpe_ids(CLIPSCORE_PREFIX))
    rows = [tok.encode(t) + [EOS] for t in texts]
    seqs = torch.full((len(rows), max(map(len, rows))), PAD)
    for i, r in enumerate(rows):
        seqs[i, : len(r)] = torch.tensor(r)
    expected = open_clip.get_tokenizer(ARCH)([CLIPSCORE_PREFIX + t for t in texts])
    assert torch.equal(enc.clip_tokens(seqs), expected)
    with torch.no_grad():
        assert torch.allclose(enc(seqs), clip.encode_text(expected, normalize=True), atol=1e-5)


def test_rewards_of_the_objective(clip, tok):
    """The objective's CIDEr-D of a training caption against its own image's captions is the
    evaluation's with the training captions as the document-frequency corpus."""
    from conftest import tiny_captioner

    data = world(clip, tok)
    ctx = TrainContext(torch.device("cpu"), data, {}, tok)
    run = run_of({"method": "scst", "seed": 0, "rewards": {"retrieval": 1.0, "clipscore": 1.0}})
    objective = SCST(run, ctx, clip=clip)
    model = tiny_captioner(tok.vocab_size, 16, clip_embed_dim(), seed=0, max_len=12)
    seqs = data.labels[[0, 2]]
    parts = objective.rewards(model, seqs, torch.tensor([0, 1]), torch.tensor([0, 1]))
    # the end token counted as a word (cider_end_token, the default), in the corpus too
    docs = [[" ".join(map(str, [*tok.encode(t), EOS])) for t in texts] for texts in TEXTS]
    expected = [CiderD(docs).score(docs[i][j], docs[i]) for i, j in ((0, 0), (1, 0))]
    np.testing.assert_allclose(parts["cider"].numpy(), expected, rtol=1e-12)
    texts = [CLIPSCORE_PREFIX + TEXTS[i][0] for i in (0, 1)]
    with torch.no_grad():
        prefixed = clip.encode_text(open_clip.get_tokenizer(ARCH)(texts), normalize=True)
    cos = (prefixed * data.features.pooled[:2]).sum(dim=1)
    assert torch.allclose(parts["clipscore"].float(), 2.5 * cos.clamp(min=0), atol=1e-5)
    total = parts["cider"] + parts["retrieval"] + parts["clipscore"]
    assert torch.allclose(parts["reward"], total)


def cider_rewards(clip, tok, seqs: torch.Tensor, image_of: list[int], **options) -> np.ndarray:
    """The objective's CIDEr-D reward of captions `seqs` of images `image_of` (world's)."""
    from conftest import tiny_captioner

    data = world(clip, tok)
    objective = SCST(run_of({"method": "scst", "seed": 0, **options}),
                     TrainContext(torch.device("cpu"), data, {}, tok))  # fmt: skip
    model = tiny_captioner(tok.vocab_size, 16, clip_embed_dim(), seed=0, max_len=12)
    rows = torch.arange(len(TEXTS))
    return objective.rewards(model, seqs, rows, torch.tensor(image_of))["cider"].numpy()


def caption_ids(tok, texts: list[str], width: int = 12) -> torch.Tensor:
    """Captions as the sampler returns them: tokens, eos, pad."""
    seqs = torch.full((len(texts), width), PAD)
    for i, text in enumerate(texts):
        row = [*tok.encode(text), EOS]
        seqs[i, : len(row)] = torch.tensor(row)
    return seqs


def test_a_caption_cut_before_its_end_loses_more_reward_with_the_end_token(clip, tok):
    """Issue 58: counting the end token (ruotianluo's reward, the default) takes from a caption
    cut before its end ("a red circle left of a blue") the n-grams that end its references
    ("square <eos>", "blue square <eos>", ...), so the cut costs more than without it. Off,
    the caption ends before eos: the n-grams of the words alone, today's reward."""
    texts = ["a red circle left of a blue square", "a red circle left of a blue",
             "a red circle left of a"]  # fmt: skip
    seqs = caption_ids(tok, texts)
    on = cider_rewards(clip, tok, seqs, [0, 0, 0])
    off = cider_rewards(clip, tok, seqs, [0, 0, 0], cider_end_token=False)
    assert (on[1:] < off[1:]).all()  # the cut captions score lower with the end token
    assert (on[0] - on[1:] > off[0] - off[1:]).all()  # and lose more against the whole one


def test_without_the_end_token_the_reward_is_todays(clip, tok):
    """cider_end_token: false gives the reward before the option to the last digit: CIDEr-D
    of the words before eos, the training captions' document frequencies without it."""
    data = world(clip, tok)
    cut = caption_ids(tok, ["a red circle", "shapes"], width=data.labels.shape[1])
    seqs = torch.cat([data.labels[[0, 3, 5]], cut])
    image_of = [0, 1, 2, 0, 5]
    got = cider_rewards(clip, tok, seqs, image_of, cider_end_token=False)
    docs = [[" ".join(map(str, tok.encode(t))) for t in texts] for texts in TEXTS]
    words = [" ".join(str(t) for t in row if t not in (PAD, EOS)) for row in seqs.tolist()]
    today = [CiderD(docs).score(w, docs[i]) for w, i in zip(words, image_of, strict=True)]
    np.testing.assert_allclose(got, today, rtol=1e-12)
    reward = TokenCiderD(data.labels.numpy(), np.repeat(np.arange(len(TEXTS)), 2),
                         tok.vocab_size, (PAD, EOS))  # fmt: skip
    assert np.array_equal(got, reward.score(seqs.numpy(), np.array(image_of)))


def test_scst_steps_raise_the_expected_cider_reward(clip, tok):
    """The direction of the gradient: 60 Adam steps of the objective on the six images raise
    the mean CIDEr-D of 20 fresh samples an image (the same draws before and after) by more
    than 10 % (0.22 -> 0.27-0.32 after 40 steps from three random initialisations)."""
    from conftest import tiny_captioner

    data = world(clip, tok)
    ctx = TrainContext(torch.device("cpu"), data, {}, tok)
    objective = SCST(run_of({"method": "scst", "seed": 0}), ctx)
    model = tiny_captioner(tok.vocab_size, 16, clip_embed_dim(), seed=0, max_len=12)
    batch = data.batch(torch.arange(len(data)))
    first = torch.arange(0, len(data), 2)  # one caption of each image

    def expected_cider() -> float:
        grid, pooled = batch.grid[first].float(), batch.pooled[first]
        seqs, _ = sample_ids(model, grid, pooled, 20, torch.Generator().manual_seed(9))
        image_of = torch.arange(len(first)).repeat_interleave(20)
        rewards = objective.rewards(model, seqs, batch.image_rows[first], image_of)
        return float(rewards["cider"].mean())

    before = expected_cider()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(60):
        loss, _ = objective.loss(model, batch, step, 60)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert expected_cider() > 1.1 * before


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"k": 1}, "runs.s.k = 1: baseline new averages an image's other samples; set k >= 2"),
        ({"rewards": {"cider": 0.0}}, "runs.s.rewards: every weight is 0"),
    ],
)
def test_bad_options_are_named(clip, tok, options, match):
    ctx = TrainContext(torch.device("cpu"), world(clip, tok), {}, tok)
    with pytest.raises(DistinctcapError, match=match):
        SCST(run_of({"method": "scst", "name": "s", **options}), ctx, clip=clip)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"k": 1}, "runs.s.k = 1: baseline new averages an image's other samples; set k >= 2"),
        ({"baseline": "beam"}, "runs.s.baseline = 'beam' is not allowed; choose one of"),
        ({"rewards": {"cider": -1.0}}, "runs.s.rewards.cider = -1.0: -1.0 is less than the "),
        ({"rewards": {"bleu": 1.0}}, "unknown key runs.s.rewards.bleu; allowed keys here: "),
    ],
)
def test_the_config_check_names_a_bad_option(options, match):
    """The schema (types, ranges, the reward names) and the facts' option conflicts check an
    SCST run once, when the config is validated."""
    runs = {"r": {"method": "mle"}, "s": {"method": "scst", "init": "r", **options}}
    with pytest.raises(DistinctcapError, match=re.escape(match)):
        validate({"runs": runs}, load_schema())


# ------------------------------------------------------------------ through the real trainer

RUNS = {
    "reference": {"method": "mle"},
    "scst": {"method": "scst", "init": "reference"},
    "scst_greedy": {"method": "scst", "init": "reference", "baseline": "greedy", "k": 2},
    "scst_clip": {
        "method": "scst",
        "init": "reference",
        "rewards": {"cider": 1.0, "retrieval": 1.0, "clipscore": 1.0},
    },
    "smile_on_scst": {"method": "smile", "init": "scst"},
}


@pytest.fixture(scope="module")
def trained_reference(tmp_path_factory, clip, tok):
    """A 3-step MLE reference and the CLIP weights as a file (as the CLIP stage writes them)."""
    tmp = tmp_path_factory.mktemp("scst")
    schema = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")
    config = {
        **validate({"runs": shrink_runs(RUNS, CLIP_TESTS_TRAIN)}, schema),
        "train": CLIP_TESTS_TRAIN,
        "captioner": CLIP_TESTS_CAPTIONER,
        "device": "cpu",
    }
    run_data = RunData(world(clip, tok), None, tok)
    reference = fit(effective_run_config(config, "reference"), run_data)
    paths = {"init": tmp / "reference.pt", "clip": tmp / "clip.pt", "clip_arch": ARCH}
    reference.model.save(paths["init"])
    distinctcap.train.clip.save_weights(clip, paths["clip"])
    return config, run_data, paths, tmp, reference.model


@pytest.mark.parametrize("name", ["scst", "scst_greedy", "scst_clip"])
def test_scst_runs_train_and_change_the_weights(trained_reference, name):
    config, data, paths, tmp, reference = trained_reference
    cfg = effective_run_config(config, name)
    cfg["paths"] = {k: str(v) for k, v in paths.items()}
    result = fit(cfg, data)
    assert result.steps == CLIP_TESTS_TRAIN["steps"]
    assert np.isfinite(result.curve["loss"]).all()
    assert {"reward", "cider", "gen_len"} <= set(result.curve)
    assert ("greedy_reward" in result.curve) == (name == "scst_greedy")
    assert ("clipscore" in result.curve) == (name == "scst_clip")
    before = reference.state_dict()
    after = result.model.state_dict()
    assert any(not torch.equal(v, after[k]) for k, v in before.items())


def test_any_method_starts_from_an_scst_run():
    """`init: scst` is an ordinary edge: the config layer accepts it for every method."""
    schema = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")
    runs = {**RUNS, "cl_on_scst": {"method": "cl", "init": "scst", "reference": "scst"}}
    config = validate({"runs": runs}, schema)
    assert effective_run_config(config, "smile_on_scst")["init"] == "scst"
    assert effective_run_config(config, "cl_on_scst")["reference"] == "scst"


def test_resumed_mid_run_ends_with_the_uninterrupted_weights(trained_reference):
    """Samples are drawn from a generator of (seed, step, batch), dropout from the torch RNG
    the checkpoint restores: a run killed after 3 steps and resumed equals an uninterrupted
    one."""
    config, data, paths, tmp, _ = trained_reference
    cfg = effective_run_config(config, "scst")
    cfg["captioner"] = {**cfg["captioner"], "dropout": 0.1}
    cfg["train"] = {**cfg["train"], "steps": 5}
    cfg["paths"] = {k: str(v) for k, v in paths.items()}
    whole = fit(cfg, data)
    cfg["paths"]["out_dir"] = str(tmp / "resumed")
    kill_after(cfg, data, 3)
    resumed = fit(cfg, data)
    assert resumed.resumed_from == 3
    after = resumed.model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in whole.model.state_dict().items())


def test_scst_runs_record_their_methods_version_and_other_runs_do_not():
    """SCST's version 2 (its reward counts the end token by default) enters what train_run
    records of an SCST run, so those retrain once; a method at version 1 records nothing."""
    from distinctcap.methods.facts import method_version

    assert method_version({"method": "scst"}) == {"method_version": "scst version 2"}
    assert method_version({"method": "mle"}) == {} == method_version({"method": "cl"})
