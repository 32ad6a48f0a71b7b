"""Decoding: greedy, beam search, sampling, no_repeat, sequence scoring, on tiny real models."""

import itertools

import pytest
import torch
from conftest import tiny_captioner

from distinctcap.captioner.model import Captioner, CaptionerConfig, make_batch
from distinctcap.captioner.search import (
    Caption,
    beam_search,
    beam_search_all,
    drop_repeats,
    generate,
    greedy,
    sample,
    sequence_logprob,
)
from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import BOS, EOS, PAD

pytestmark = pytest.mark.usefixtures("one_thread")

G, DV, DP = 5, 6, 4


def random_model(vocab: int = 12, max_len: int = 6, seed: int = 0) -> Captioner:
    """An untrained model with peaked, image-dependent next-token distributions."""
    model = tiny_captioner(vocab, DV, DP, seed, dropout=0.1, max_len=max_len)
    with torch.no_grad():  # larger weights than the 0.02 init: peaked, image-dependent outputs
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(std=0.5)
    return model


def images(b: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, G, DV, generator=g), torch.randn(b, DP, generator=g)


def naive_greedy(model: Captioner, grid, pooled, max_len: int) -> list[Caption]:
    """Greedy by re-running the whole prefix each step (no cache), one image at a time."""
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(len(grid)):
            memory = model.encode(grid[i : i + 1], pooled[i : i + 1])
            seq, lp = [BOS], 0.0
            for _ in range(max_len):
                logp = model.decode(memory, torch.tensor([seq]))[0, -1].log_softmax(-1)
                logp[[PAD, BOS]] = float("-inf")
                tok = int(logp.argmax())
                lp += float(logp[tok])
                seq.append(tok)
                if tok == EOS:
                    break
            out.append(Caption([t for t in seq[1:] if t != EOS], lp))
    return out


@pytest.fixture(scope="module")
def overfit():
    """A tiny captioner trained on 4 (image, caption) pairs until it knows them by heart."""
    torch.manual_seed(0)
    grid, pooled = images(4, seed=7)
    captions = [[4, 5, 6], [7, 8, 9, 10, 11], [4, 12], [13, 13, 5, 6]]
    cfg = CaptionerConfig(
        16, DV, DP, width=32, enc_layers=1, dec_layers=1, heads=2, ffn=64, dropout=0.0, max_len=8
    )
    model = Captioner(cfg)
    inputs, labels = make_batch(captions, cfg.max_len)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(200):
        _, loss = model(grid, pooled, inputs, labels=labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, grid, pooled, captions, loss.item()


def test_overfit_model_reproduces_its_captions(overfit):
    model, grid, pooled, captions, loss = overfit
    assert loss < 0.05
    assert [c.tokens for c in greedy(model, grid, pooled)] == captions
    assert [c.tokens for c in beam_search(model, grid, pooled, k=3)] == captions
    best = greedy(model, grid, pooled)
    assert all(-0.1 < c.logprob <= 0 for c in best)
    assert model.training  # decoding restores the mode it found


def test_greedy_with_kv_cache_equals_recomputation():
    model = random_model()
    grid, pooled = images(5)
    fast = greedy(model, grid, pooled)
    slow = naive_greedy(model, grid, pooled, model.cfg.max_len)
    assert [c.tokens for c in fast] == [c.tokens for c in slow]
    assert torch.allclose(
        torch.tensor([c.logprob for c in fast]), torch.tensor([c.logprob for c in slow]), atol=1e-4
    )
    assert len({tuple(c.tokens) for c in fast}) > 1  # not a degenerate model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_of_one_is_greedy(seed):
    model = random_model(seed=seed)
    grid, pooled = images(8, seed=seed)
    g = greedy(model, grid, pooled)
    b = beam_search(model, grid, pooled, k=1)
    assert [c.tokens for c in b] == [c.tokens for c in g]
    assert [c.logprob for c in b] == [c.logprob for c in g]  # exactly, same float sums


def test_exhaustive_beam_finds_the_most_likely_captions():
    """With 4 real tokens and 2 steps, k=4 keeps every prefix: the result is the true top 4."""
    model = random_model(vocab=6, max_len=2)
    grid, pooled = images(3)
    real = [EOS, 3, 4, 5]
    space = (
        [[]] + [[t] for t in real[1:]] + [list(p) for p in itertools.product(real[1:], real[1:])]
    )
    beams = beam_search_all(model, grid, pooled, k=4)
    for i, found in enumerate(beams):
        scores = sequence_logprob(model, grid[[i] * len(space)], pooled[[i] * len(space)], space)
        top = scores.topk(4).indices.tolist()
        assert [c.tokens for c in found] == [space[j] for j in top]
        assert torch.allclose(torch.tensor([c.logprob for c in found]), scores[top], atol=1e-5)


def test_length_penalty_ranks_by_normalised_score():
    model = random_model()
    grid, pooled = images(6)
    for alpha in (0.0, 1.0):
        for beams in beam_search_all(model, grid, pooled, k=3, length_penalty=alpha):
            assert len(beams) == 3
            rank = [c.logprob / min(len(c.tokens) + 1, 6) ** alpha for c in beams]
            assert rank == sorted(rank, reverse=True)


def test_sequence_logprob_equals_decoded_logprob():
    model = random_model()
    grid, pooled = images(6)
    for caps in (greedy(model, grid, pooled), beam_search(model, grid, pooled, k=3)):
        scores = sequence_logprob(model, grid, pooled, [c.tokens for c in caps], batch_size=4)
        assert torch.allclose(scores, torch.tensor([c.logprob for c in caps]), atol=1e-5)
    caps = sample(model, grid, pooled, n=3, generator=torch.Generator().manual_seed(0))
    flat = [c for per_image in caps for c in per_image]
    index = [i for i in range(6) for _ in range(3)]
    scores = sequence_logprob(model, grid, pooled, [c.tokens for c in flat], image_index=index)
    assert torch.allclose(scores, torch.tensor([c.logprob for c in flat]), atol=1e-5)


def test_sampling_is_reproducible_and_seed_dependent():
    model = random_model()
    grid, pooled = images(4)

    def draw(seed):
        caps = sample(model, grid, pooled, n=5, generator=torch.Generator().manual_seed(seed))
        return [[c.tokens for c in per] for per in caps]

    a = draw(0)
    assert len(a) == 4 and all(len(per) == 5 for per in a)
    assert a == draw(0)
    assert a != draw(1)


def test_top_k_one_and_tiny_top_p_are_greedy():
    model = random_model()
    grid, pooled = images(4)
    g = [c.tokens for c in greedy(model, grid, pooled)]
    for opts in ({"top_k": 1}, {"top_p": 1e-6}, {"top_k": 1, "temperature": 5.0}):
        caps = sample(model, grid, pooled, n=3, generator=torch.Generator().manual_seed(0), **opts)
        assert [[c.tokens for c in per] for per in caps] == [[t] * 3 for t in g]


def test_sampling_follows_the_model_distribution():
    """First-token frequencies over 4000 draws match the model's probabilities (pad and bos
    banned, so renormalised over the rest); top_k=2 keeps exactly the two most likely."""
    model = random_model(seed=3).eval()
    with torch.no_grad():
        model.tok_emb.weight.div_(10)  # a flat-ish distribution
    grid, pooled = images(1)
    with torch.no_grad():
        memory = model.encode(grid, pooled)
        p = model.decode(memory, torch.tensor([[BOS]]))[0, -1].softmax(-1)
    p[[PAD, BOS]] = 0
    p = p / p.sum()
    gen = torch.Generator().manual_seed(0)
    caps = sample(model, grid, pooled, n=4000, max_len=1, generator=gen)[0]
    first = torch.tensor([c.tokens[0] if c.tokens else EOS for c in caps])
    freq = torch.bincount(first, minlength=len(p)).float() / len(first)
    assert (freq - p).abs().max() < 0.03
    caps = sample(model, grid, pooled, n=200, max_len=1, top_k=2, generator=gen)[0]
    seen = {c.tokens[0] if c.tokens else EOS for c in caps}
    assert seen == set(p.topk(2).indices.tolist())


def test_drop_repeats_removes_immediate_duplicates_only():
    assert drop_repeats([4, 4, 5, 4, 4, 4, 6]) == [4, 5, 4, 6]
    assert drop_repeats([]) == []


def test_no_repeat_cleans_and_rescores(overfit):
    model, grid, pooled, captions, _ = overfit
    caps = greedy(model, grid, pooled, no_repeat=True)
    assert caps[3].tokens == [13, 5, 6]  # trained caption [13, 13, 5, 6]
    assert [c.tokens for c in caps[:3]] == captions[:3]
    scores = sequence_logprob(model, grid, pooled, [c.tokens for c in caps])
    assert torch.allclose(scores, torch.tensor([c.logprob for c in caps]), atol=1e-5)
    assert caps[3].logprob < -1  # the cleaned caption is unlikely under this model
    samples = sample(
        model,
        grid,
        pooled,
        n=4,
        temperature=3.0,
        no_repeat=True,
        generator=torch.Generator().manual_seed(0),
    )
    for c in (c for per in samples for c in per):
        assert all(a != b for a, b in itertools.pairwise(c.tokens))


def test_generate_batches_images_and_checks_options():
    model = random_model()
    grid, pooled = images(7)
    assert [c[0].tokens for c in generate(model, grid, pooled, "greedy", batch_size=3)] == [
        c.tokens for c in greedy(model, grid, pooled)
    ]
    out = generate(
        model, grid, pooled, "sample", batch_size=3, n=2, generator=torch.Generator().manual_seed(0)
    )
    assert len(out) == 7 and all(len(c) == 2 for c in out)
    assert len(generate(model, grid, pooled, "beam", batch_size=4, k=2)) == 7
    with pytest.raises(DistinctcapError, match="allowed greedy, beam, sample"):
        generate(model, grid, pooled, "nucleus")
    with pytest.raises(DistinctcapError, match="beam size"):
        beam_search(model, grid, pooled, k=11)
    with pytest.raises(DistinctcapError, match="max_len=9"):
        greedy(model, grid, pooled, max_len=9)
    with pytest.raises(DistinctcapError, match="temperature"):
        sample(model, grid, pooled, n=1, temperature=0.0)
