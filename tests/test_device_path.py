"""Training near the hardware (issue 30): batches gathered on the device, compiled blocks,
decoding that reads "all done?" only every few steps. On the CPU each path must give today's
numbers (bit for bit) or, compiled, the same within a stated tolerance."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from test_train import V, fit, tiny_cfg, tiny_data

from distinctcap.captioner import search
from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.data.tokenizer import EOS
from distinctcap.methods.specificity import generate_ids
from distinctcap.train.compiling import compile_wanted
from distinctcap.train.data import DeviceCaptions


@pytest.mark.parametrize("resident", [True, False])
def test_device_captions_give_the_batches_of_caption_data(resident):
    data = tiny_data().train
    batches = DeviceCaptions(data, torch.device("cpu"), resident=resident)
    assert batches.resident is resident
    for idx in (torch.tensor([0, 1, 5, 2, 9]), torch.tensor([31, 30, 7]), torch.arange(32)):
        got, want = batches.batch(idx), data.batch(idx)
        for name in vars(want):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert batches.tokens(idx) == want.n_tokens


def test_compile_setting_auto_means_a_gpu_only():
    assert compile_wanted("auto", torch.device("cuda")) is True
    assert compile_wanted("auto", torch.device("cpu")) is False
    assert compile_wanted(True, torch.device("cpu"))
    assert not compile_wanted(False, torch.device("cuda"))


def test_compiled_training_and_its_greedy_captions_equal_eager_within_tolerance(
    monkeypatch, caplog
):
    """train.compile: losses within 1e-5 and weights after 4 steps within 1e-4 relative /
    1e-5 absolute of the eager run, and the same greedy captions (decoded through the
    compiled blocks, cache and all). The suite uses dynamo's `eager` backend (graph capture
    and guards, eager kernels). With DISTINCTCAP_TEST_COMPILE_BACKEND=aot_eager (AOT
    autograd, the graphs inductor gets) it passed in 332 s on the loaded 2-core box; inductor
    compiles here (gcc) but took minutes for the blocks alone."""
    cfg = {"checkpoint_every": 0, "val_every": 0, "steps": 4, "log_every": 1}
    eager = fit(tiny_cfg(**cfg), tiny_data(equal_len=True))
    backend = os.environ.get("DISTINCTCAP_TEST_COMPILE_BACKEND", "eager")
    monkeypatch.setenv("DISTINCTCAP_COMPILE_BACKEND", backend)
    with caplog.at_level(logging.WARNING, logger="distinctcap"):
        compiled = fit(tiny_cfg(**cfg, compile=True), tiny_data(equal_len=True))
    assert not [r for r in caplog.records if "train.compile" in r.getMessage()]  # compiled
    for (name, a), b in zip(eager.model.state_dict().items(),
                            compiled.model.state_dict().values(), strict=True):  # fmt: skip
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(compiled.curve.loss.to_numpy(), eager.curve.loss.to_numpy(),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    feats = tiny_data().train.features
    grid, pooled = feats.grid.float(), feats.pooled
    plain = search.greedy(eager.model, grid, pooled, max_len=3)
    with_compiled_blocks = search.greedy(compiled.model, grid, pooled, max_len=3)
    assert [c.tokens for c in with_compiled_blocks] == [c.tokens for c in plain]


def ends_at_row_dependent_steps():
    """A decoding hook: argmax, but row r says eos at step 2 + r % 4 (lengths 2 to 5)."""
    step = [0]

    def choose(logp: torch.Tensor) -> torch.Tensor:
        step[0] += 1
        nxt = logp.argmax(-1)
        ends = 2 + torch.arange(len(nxt)) % 4 == step[0]
        return nxt.masked_fill(ends, EOS)

    return choose


def test_decoding_that_checks_for_the_end_every_few_steps_gives_the_same_captions(monkeypatch):
    """As on a GPU (`done_check_every`): the ids and log-probs of a loop that reads "all
    done?" every 2-4 steps equal those of one that reads it after every step; specificity's
    Gumbel noise is cut to the ids' length."""
    torch.manual_seed(0)
    cfg = CaptionerConfig(V, 4, 6, width=16, enc_layers=1, dec_layers=1, heads=2, ffn=32,
                          max_len=10)  # fmt: skip
    model = Captioner(cfg).eval()
    feats = tiny_data().train.features
    grid, pooled = feats.grid.float(), feats.pooled

    def decoded(every: int):
        monkeypatch.setattr(search, "done_check_every", lambda device: every)
        ids, logprob = search.decode_ids(model, grid, pooled, ends_at_row_dependent_steps())
        _, noise = generate_ids(model, grid, pooled, "gumbel", torch.Generator().manual_seed(3))
        return ids, logprob, noise

    want = decoded(1)
    assert want[0].shape[1] == 5 and (want[0][:, -1] == EOS).any()  # ended before max_len
    for every in (2, 3, 4):
        got = decoded(every)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), every


def test_compiled_blocks_have_no_graph_break_at_any_caption_length():
    """Compiled blocks (dynamo's `eager` backend, train.compiling.compile_blocks) over captions of
    three lengths (dynamic shapes after the second) and through cached greedy decoding: no
    graph break, counted by torch._dynamo, and the eager model's numbers within 1e-5. A
    symbolic `is_causal` once broke every decoder block's graph."""
    from torch._dynamo.utils import counters

    from distinctcap.train.compiling import compile_blocks

    torch.manual_seed(0)
    cfg = CaptionerConfig(vocab_size=V, visual_dim=16, pooled_dim=8, width=32, enc_layers=1,
                          dec_layers=2, heads=4, ffn=64, dropout=0.0)  # fmt: skip
    eager = Captioner(cfg)
    compiled = Captioner(cfg)
    compiled.load_state_dict(eager.state_dict())
    grid, pooled = torch.randn(3, 4, 16), torch.randn(3, 8)
    torch._dynamo.reset()
    counters.clear()
    assert compile_blocks(compiled, lambda: None, "eager") is None
    for length in (5, 7, 9):
        tokens = torch.randint(4, V, (3, length))
        outs = [m.decode(m.encode(grid, pooled), tokens) for m in (eager, compiled)]
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
        outs[1].sum().backward()
    greedy = [search.greedy(m.eval(), grid, pooled, max_len=6) for m in (eager, compiled)]
    assert [c.tokens for c in greedy[1]] == [c.tokens for c in greedy[0]]
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()
