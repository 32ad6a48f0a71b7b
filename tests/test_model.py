"""The captioner: shapes, attention maps, fast/explicit paths, KV cache, loss, batching, IO."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_captioner

from distinctcap.captioner import model as model_module
from distinctcap.captioner.model import Captioner, CaptionerConfig, label_logprobs, make_batch
from distinctcap.core.errors import DistinctcapError

pytestmark = pytest.mark.usefixtures("one_thread")

B, G, DV, DP, N, V, W, H, L = 3, 7, 6, 5, 6, 20, 16, 2, 2


def tiny(dropout: float = 0.1, **kw) -> Captioner:
    return tiny_captioner(V, DV, DP, enc_layers=2, dropout=dropout, **kw).eval()


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(1)
    grid = torch.randn(B, G, DV, generator=g)
    pooled = torch.randn(B, DP, generator=g)
    tokens = torch.randint(3, V, (B, N), generator=g)
    return grid, pooled, tokens


def test_shapes_of_every_output(batch):
    grid, pooled, tokens = batch
    model = tiny()
    memory = model.encode(grid, pooled)
    assert memory.shape == (B, G + 1, W)
    logits, internals = model.decode(memory, tokens, return_internals=True)
    assert logits.shape == (B, N, V)
    assert set(internals) == {"hidden", "self_attn", "cross_attn"}
    assert [h.shape for h in internals["hidden"]] == [(B, N, W)] * L
    assert [a.shape for a in internals["self_attn"]] == [(B, H, N, N)] * L
    assert [a.shape for a in internals["cross_attn"]] == [(B, H, N, G + 1)] * L
    out = model(grid, pooled, tokens, labels=tokens, return_internals=True)
    assert len(out) == 3 and out[1].shape == ()
    logits2, loss = model(grid, pooled, tokens)
    assert loss is None and torch.allclose(logits2, logits, atol=1e-5)


@pytest.mark.parametrize("training", [False, True])
def test_attention_rows_sum_to_one_and_self_attention_is_causal(batch, training):
    grid, pooled, tokens = batch
    model = tiny().train(training)  # with dropout on, the maps are still pre-dropout probs
    _, _, internals = model(grid, pooled, tokens, return_internals=True)
    for a in internals["self_attn"] + internals["cross_attn"]:
        assert torch.allclose(a.sum(-1), torch.ones(a.shape[:-1]), atol=1e-6)
    for a in internals["self_attn"]:
        assert torch.all(a.triu(diagonal=1) == 0)
        assert torch.all(a[..., 0, 0] == 1)  # the first position sees only itself
        assert torch.all(a[..., torch.ones(N, N, dtype=torch.bool).tril()] > 0)


def test_hidden_states_are_each_block_output(batch):
    grid, pooled, tokens = batch
    model = tiny()
    logits, _, internals = model(grid, pooled, tokens, return_internals=True)
    # pre-LN: the last hidden state goes through the final LayerNorm and the tied head
    again = model.dec_ln(internals["hidden"][-1]) @ model.tok_emb.weight.T
    assert torch.allclose(again, logits, atol=1e-5)
    assert not torch.allclose(internals["hidden"][0], internals["hidden"][1])


def test_fast_path_equals_explicit_attention(batch):
    grid, pooled, tokens = batch
    model = tiny()
    fast, _ = model(grid, pooled, tokens)
    slow, _, _ = model(grid, pooled, tokens, return_internals=True)
    assert torch.allclose(fast, slow, atol=1e-5)


def test_kv_cache_matches_full_decoding(batch):
    grid, pooled, tokens = batch
    model = tiny()
    memory = model.encode(grid, pooled)
    full = model.decode(memory, tokens)
    cache = model.init_cache(memory)
    steps = []
    for t in range(N):
        logits, cache = model.decode_step(tokens[:, t : t + 1], cache)
        steps.append(logits)
    assert cache.length == N
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
    # several new tokens after a cached prefix: the offset causal mask
    cache = model.init_cache(memory)
    first, cache = model.decode_step(tokens[:, :2], cache)
    rest, cache = model.decode_step(tokens[:, 2:], cache)
    assert torch.allclose(torch.cat([first, rest], 1), full, atol=1e-5)


def test_grouped_cache_shares_memory_between_rows(batch):
    """Three captions per image against one copy of its memory = against three copies."""
    grid, pooled, tokens = batch
    model = tiny()
    memory = model.encode(grid, pooled)
    rows = torch.randint(3, V, (3 * B, N), generator=torch.Generator().manual_seed(2))
    full = model.decode(memory.repeat_interleave(3, dim=0), rows)
    cache = model.init_cache(memory, group=3)
    assert cache.group == 3 and cache.cross[0][0].shape[0] == B
    steps = []
    for t in range(N):
        logits, cache = model.decode_step(rows[:, t : t + 1], cache)
        steps.append(logits)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_right_padding_needs_no_key_mask(batch):
    grid, pooled, tokens = batch
    model = tiny()
    other = tokens.clone()
    other[:, 4:] = 0  # whatever follows position 3 cannot change positions 0..3
    a, _ = model(grid, pooled, tokens)
    b, _ = model(grid, pooled, other)
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_loss_is_mean_cross_entropy_over_non_pad_labels(batch):
    grid, pooled, tokens = batch
    model = tiny()
    labels = tokens.clone()
    labels[0, 3:] = 0
    labels[2, 1:] = 0
    logits, loss = model(grid, pooled, tokens, labels=labels)
    logp = logits.log_softmax(-1)
    terms = [-logp[i, t, labels[i, t]] for i in range(B) for t in range(N) if labels[i, t] != 0]
    assert len(terms) == N + 3 + 1
    assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-6)


def test_label_logprobs_sums_non_pad_token_logprobs():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))  # (1, 2, 3)
    assert torch.allclose(
        label_logprobs(logits, torch.tensor([[1, 2]])), torch.log(torch.tensor([0.25 * 0.8]))
    )
    assert torch.allclose(
        label_logprobs(logits, torch.tensor([[1, 0]])), torch.log(torch.tensor([0.25]))
    )


def test_make_batch_shifts_pads_and_truncates():
    inputs, labels = make_batch([[5, 6, 7], [], [9]], max_len=8)
    assert inputs.tolist() == [[1, 5, 6, 7], [1, 0, 0, 0], [1, 9, 0, 0]]
    assert labels.tolist() == [[5, 6, 7, 2], [2, 0, 0, 0], [9, 2, 0, 0]]
    inputs, labels = make_batch([[5, 6, 7, 8], [4]], max_len=3)
    assert inputs.tolist() == [[1, 5, 6], [1, 4, 0]]
    assert labels.tolist() == [[5, 6, 7], [4, 2, 0]]
    assert inputs.dtype == labels.dtype == torch.long


@pytest.mark.parametrize("block", [7, 65_536])
def test_make_batch_equals_its_per_caption_definition(block, monkeypatch):
    """The block-wise fill against the rows written out one caption at a time: numpy arrays of
    either width and lists, empty captions, captions cut at max_len and some one short of it,
    in blocks that split the captions or hold them all."""
    monkeypatch.setattr(model_module, "FILL_BLOCK", block)
    rng = np.random.default_rng(0)
    captions = [rng.integers(3, 900, rng.integers(0, 12)) for _ in range(300)]
    captions = [c.astype(np.int32) if i % 2 else c.tolist() for i, c in enumerate(captions)]
    for max_len in (1, 2, 6, 11, 12, 20):
        rows_in = [[1, *t][:max_len] for t in captions]
        rows_out = [[*t, 2][:max_len] for t in captions]
        n = max(len(r) for r in rows_in)
        inputs, labels = make_batch(np.array(captions, dtype=object), max_len)
        assert inputs.tolist() == [r + [0] * (n - len(r)) for r in rows_in]
        assert labels.tolist() == [r + [0] * (n - len(r)) for r in rows_out]
    inputs, labels = make_batch([], max_len=8)
    assert inputs.shape == labels.shape == (0, 1)


def test_gradients_reach_every_parameter(batch):
    grid, pooled, tokens = batch
    model = tiny().train()
    _, loss = model(grid, pooled, tokens, labels=tokens)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_save_load_round_trip(tmp_path, batch):
    grid, pooled, tokens = batch
    model = tiny(max_grid=16)
    path = tmp_path / "ckpt" / "model.pt"
    model.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["model.pt"]  # no temp file left
    loaded = Captioner.load(path).eval()
    assert loaded.cfg == model.cfg
    assert loaded.head.weight is loaded.tok_emb.weight  # tying survives loading
    assert torch.equal(loaded(grid, pooled, tokens)[0], model(grid, pooled, tokens)[0])


def test_a_loaded_model_lives_on_its_map_location(tmp_path):
    """A frozen teacher loaded for a GPU run must sit on the GPU (it stayed on the CPU, and
    UNKT/CL training on CUDA failed). The meta device stands in for a GPU here."""
    path = tmp_path / "model.pt"
    tiny().save(path)
    loaded = Captioner.load(path, map_location="meta")
    assert {p.device.type for p in loaded.parameters()} == {"meta"}


def test_errors_name_the_limit(batch):
    grid, pooled, tokens = batch
    with pytest.raises(DistinctcapError, match="divisible by heads"):
        CaptionerConfig(V, DV, DP, width=10, heads=4)
    model = tiny(max_grid=4)
    with pytest.raises(DistinctcapError, match="max_grid=4"):
        model.encode(grid, pooled)
    model = tiny()
    with pytest.raises(DistinctcapError, match="max_len=8"):
        model.decode(torch.zeros(B, 2, W), torch.ones(B, 9, dtype=torch.long))


def test_fast_path_matches_reference_attention_formula():
    """Attention against a hand-written softmax(QK^T/sqrt(d_k))V with a causal mask."""
    model = tiny(dropout=0.0)
    attn = model.decoder[0].self_attn
    x = torch.randn(2, 4, W)
    k, v = attn.project_kv(x)
    out, probs = attn(x, (k, v), causal=True, need_weights=True)
    q = attn.split_heads(attn.q(x))
    scores = q @ k.transpose(-2, -1) / (W // H) ** 0.5
    scores = scores + torch.full((4, 4), float("-inf")).triu(1)
    ref = F.softmax(scores, -1)
    assert torch.allclose(probs, ref, atol=1e-6)
    expect = attn.proj((ref @ v).transpose(1, 2).flatten(2))
    assert torch.allclose(out, expect, atol=1e-6)
    assert torch.allclose(attn(x, (k, v), causal=True)[0], expect, atol=1e-6)
