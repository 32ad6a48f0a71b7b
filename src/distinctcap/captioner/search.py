"""Caption decoding and scoring, batched over images on the model's device.

Every function runs the model in eval mode under no_grad (restoring its mode afterwards) and
decodes incrementally with the model's key/value cache. A `Caption` holds the tokens without
bos/eos and its log-probability log p(c | I) under the model itself (temperature 1, no top-k/p
truncation): the sum of the token log-probs including eos, so `sequence_logprob` of a decoded
caption returns its `logprob`. A caption that hits `max_len` without eos has no eos term, which
is also what `sequence_logprob` computes for it when `max_len` is the model's (`make_batch`
truncates the same way). Pad and bos are never generated.

All of them, and the specificity objective's argmax / Gumbel-max captions (`decode_ids`), run
one left-to-right loop; what differs is the hook that turns each step's log-probabilities into
the next token (`NextToken`). Beam search keeps its own loop (it reorders rows).

`no_repeat` follows the specificity paper §4: after decoding, any token equal to the
immediately previous token is removed ("such duplicates were an issue in our non-contrastive
models"). The decoding itself is unchanged; the cleaned caption is then rescored so `logprob`
stays log p(tokens | I).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from distinctcap.captioner.model import Captioner, label_logprobs, make_batch
from distinctcap.core import work
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.logs import progress
from distinctcap.data.tokenizer import BOS, EOS, PAD

NextToken = Callable[[Tensor], Tensor]  # log-probs (B, V), pad/bos banned -> next ids (B,)
DONE_CHECK_EVERY = 4  # decoding steps between the reads of "is every caption done?" on a GPU


@dataclass
class Caption:
    tokens: list[int]  # captioner ids, without bos/eos
    logprob: float  # log p(tokens + [eos] | image), a sum over tokens


@contextmanager
def _inference(model: Captioner) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _device(model: Captioner) -> torch.device:
    return next(model.parameters()).device


def _memory(model: Captioner, grid: Tensor, pooled: Tensor) -> Tensor:
    dev = _device(model)
    return model.encode(grid.to(dev), pooled.to(dev))  # (B, M, W)


def _max_len(model: Captioner, max_len: int | None) -> int:
    if max_len is None:
        return model.cfg.max_len
    if not 1 <= max_len <= model.cfg.max_len:
        raise DistinctcapError(f"decoding max_len={max_len}: allowed 1..{model.cfg.max_len}")
    return max_len


def _trim(row: Sequence[int]) -> list[int]:
    """Generated ids -> caption tokens: up to the first eos, pads dropped."""
    out = []
    for t in row:
        if t == EOS:
            break
        if t != PAD:
            out.append(t)
    return out


def drop_repeats(tokens: Sequence[int]) -> list[int]:
    """Remove every token equal to the immediately previous one (specificity paper §4)."""
    return [t for i, t in enumerate(tokens) if i == 0 or t != tokens[i - 1]]


def _score(model: Captioner, memory: Tensor, token_lists: Sequence[Sequence[int]]) -> Tensor:
    """log p(c | I) for memory (B, M, W) and B captions -> (B,) float32 on memory's device."""
    inputs, labels = make_batch(token_lists, model.cfg.max_len)
    logits = model.decode(memory, inputs.to(memory.device))
    return label_logprobs(logits, labels.to(memory.device))


def _finish(
    model: Captioner, memory: Tensor, seqs: Tensor, logprob: Tensor, no_repeat: bool
) -> list[Caption]:
    """Generated ids (B*g, T) and their log-probs (B*g,), g rows per image of memory
    (B, M, W) -> captions."""
    caps = [Caption(_trim(r), lp) for r, lp in zip(seqs.tolist(), logprob.tolist(), strict=True)]
    if no_repeat:
        changed = [i for i, c in enumerate(caps) if drop_repeats(c.tokens) != c.tokens]
        if changed:
            cleaned = [drop_repeats(caps[i].tokens) for i in changed]
            images = torch.tensor(changed, device=memory.device) // (len(caps) // len(memory))
            scores = _score(model, memory[images], cleaned).tolist()
            for i, toks, lp in zip(changed, cleaned, scores, strict=True):
                caps[i] = Caption(toks, lp)
    return caps


def ban_specials(logp: Tensor) -> Tensor:
    """Pad and bos are never generated: they are not caption tokens (the loss never asks for
    them). Only the choice is restricted; reported log-probs stay the model's own."""
    return logp.index_fill(-1, torch.tensor([PAD, BOS], device=logp.device), float("-inf"))


def _generate(
    model: Captioner,
    memory: Tensor,
    group: int,
    max_len: int,
    choose: NextToken,
    check_every: int = 1,
) -> tuple[Tensor, Tensor]:
    """The decoding loop: left to right with the key/value cache, `group` rows per image of
    memory (B, M, W), one token per row and step chosen by the hook `choose(log-probs
    (B*group, V))` (model log-probs in float32, pad and bos at -inf). Rows that emitted eos get
    pad; the loop stops when every row has. Returns ids (B*group, T) (pad after eos) and log p
    of each row's tokens up to eos (B*group,).

    Whether every row is done is read (a host sync) every `check_every` steps; the few extra
    steps only add pad columns, which are cut off, so the result is the same as with 1 as long
    as `choose` draws no random numbers that a later call would see."""
    b = memory.shape[0] * group
    work.count("decoded", b)
    cache = model.init_cache(memory, group)
    tok = torch.full((b, 1), BOS, dtype=torch.long, device=memory.device)
    logprob = torch.zeros(b, device=memory.device)
    done = torch.zeros(b, dtype=torch.bool, device=memory.device)
    out = []
    for _ in range(max_len):
        logits, cache = model.decode_step(tok, cache)
        logp = logits[:, -1].float().log_softmax(dim=-1)  # (B, V)
        nxt = choose(ban_specials(logp)).masked_fill(done, PAD)  # (B,)
        logprob += logp.gather(1, nxt[:, None]).squeeze(1).masked_fill(done, 0.0)
        out.append(nxt)
        done |= nxt == EOS
        if len(out) % check_every == 0 and done.all():
            break
        tok = nxt[:, None]
    seqs = torch.stack(out, dim=1)
    if check_every > 1:  # the columns after every row's eos hold only pad
        seqs = seqs[:, : int((seqs != PAD).any(dim=0).nonzero().max()) + 1]
    return seqs, logprob


def done_check_every(device: torch.device) -> int:
    """`_generate`'s check_every for loops whose hook draws no shared random numbers: on a GPU
    a host sync per token stalls the queue of kernels, on the CPU extra steps only cost."""
    return DONE_CHECK_EVERY if device.type == "cuda" else 1


def _draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row of probs (B, V) by inverting the CDF with one uniform number per
    row: the same law as torch.multinomial, which draws V exponentials per row (several times
    slower here). right=True never returns a zero-probability token."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(len(probs), 1, generator=generator, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[-1] - 1).squeeze(1)


def decode_ids(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    choose: NextToken,
    max_len: int | None = None,
) -> tuple[Tensor, Tensor]:
    """One caption per image, each token chosen by the hook `choose` (see `_generate`), in
    eval mode without gradient: ids (B, T) with eos, pad after it, and their log p (B,). The
    entry point for objectives that pick tokens their own way (specificity's Gumbel-max); on a
    GPU `choose` may be called for a few steps after the last caption ended
    (`done_check_every`): a hook that draws random numbers must draw them from a generator of
    this call only and keep the first T steps' draws."""
    with _inference(model):
        memory = _memory(model, grid, pooled)
        every = done_check_every(memory.device)
        return _generate(model, memory, 1, _max_len(model, max_len), choose, every)


def sample_ids(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    n: int,
    generator: torch.Generator | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, Tensor]:
    """n captions per image drawn from the model's own distribution (temperature 1, no
    truncation: `sample`'s law with its defaults), in eval mode without gradient: ids (B*n, T),
    image i's in rows i*n .. i*n + n - 1, each with eos unless it hit max_len, pad after it;
    and their log p (B*n,). For REINFORCE (self-critical training, methods.scst), which scores
    the ids without a round trip through `Caption`s. `generator` must be this call's own
    (`decode_ids`: on a GPU a few draws after the last eos are thrown away)."""
    if n < 1:
        raise DistinctcapError(f"sampling n={n}: allowed n >= 1")
    with _inference(model):
        memory = _memory(model, grid, pooled)
        every = done_check_every(memory.device)
        choose = lambda logp: _draw(logp.softmax(dim=-1), generator)  # noqa: E731
        return _generate(model, memory, n, _max_len(model, max_len), choose, every)


def greedy(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    max_len: int | None = None,
    no_repeat: bool = False,
) -> list[Caption]:
    """The most likely next token at each step; one caption per image.
    grid (B, G, Dv), pooled (B, Dp); max_len defaults to the model's."""
    with _inference(model):
        memory = _memory(model, grid, pooled)
        seqs, logprob = _generate(
            model, memory, 1, _max_len(model, max_len), lambda lp: lp.argmax(-1),
            done_check_every(memory.device),
        )
        return _finish(model, memory, seqs, logprob, no_repeat)


def sample(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    n: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_len: int | None = None,
    generator: torch.Generator | None = None,
    no_repeat: bool = False,
) -> list[list[Caption]]:
    """n sampled captions per image (images repeated n times in one batch). Tokens are drawn
    from softmax(logits / temperature), restricted to the top_k most likely (0 = all) and to
    the smallest set with probability >= top_p (nucleus); `generator` (on the model's device)
    makes it reproducible. `logprob` is the model's own, untempered and untruncated."""
    if n < 1 or temperature <= 0 or top_k < 0 or not 0 < top_p <= 1:
        raise DistinctcapError(
            f"sampling n={n}, temperature={temperature}, top_k={top_k}, top_p={top_p}: "
            "allowed n >= 1, temperature > 0, top_k >= 0, 0 < top_p <= 1"
        )

    def choose(logp: Tensor) -> Tensor:
        logits = logp / temperature  # log-softmax differs from the logits by a constant
        if top_k > 0:
            kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            outside = probs.cumsum(dim=-1) - probs >= top_p  # mass before it already >= top_p
            logits = logits.scatter(1, order, sorted_logits.masked_fill(outside, float("-inf")))
        return _draw(logits.softmax(dim=-1), generator)

    with _inference(model):
        memory = _memory(model, grid, pooled)
        seqs, logprob = _generate(model, memory, n, _max_len(model, max_len), choose)
        caps = _finish(model, memory, seqs, logprob, no_repeat)
    return [caps[i : i + n] for i in range(0, len(caps), n)]


def beam_search_all(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    k: int,
    max_len: int | None = None,
    length_penalty: float = 0.0,
    no_repeat: bool = False,
) -> list[list[Caption]]:
    """Beam search of width k; all k final beams per image, best first.

    Beams are ranked during the search by their summed log-prob; a beam that emitted eos stays
    in the beam with a frozen score (its only continuation is pad at no cost) until better
    beams push it out. The final beams are sorted by logprob / length**length_penalty, length
    counting eos (0 = plain log-prob, > 0 favours longer captions). With k = 1 this is greedy."""
    v = model.cfg.vocab_size
    if not 1 <= k <= v - 2:
        raise DistinctcapError(f"beam size k={k}: allowed 1..{v - 2} (vocabulary minus pad, bos)")
    with _inference(model):
        memory = _memory(model, grid, pooled)
        b, dev = memory.shape[0], memory.device
        work.count("decoded", b * k)  # k beams an image
        cache = model.init_cache(memory, group=k)
        scores = torch.full((b, k), float("-inf"), device=dev)
        scores[:, 0] = 0.0  # start from one beam, or the k copies would fill the beam
        done = torch.zeros(b, k, dtype=torch.bool, device=dev)
        lengths = torch.zeros(b, k, dtype=torch.long, device=dev)
        seqs = torch.zeros(b * k, 0, dtype=torch.long, device=dev)
        tok = torch.full((b * k, 1), BOS, dtype=torch.long, device=dev)
        first = torch.arange(b, device=dev)[:, None] * k  # (B, 1): row of each image's beam 0
        finished_lp = torch.full((k,), float("-inf"), device=dev)
        finished_lp[0] = 0.0
        for _ in range(_max_len(model, max_len)):
            logits, cache = model.decode_step(tok, cache)
            logp = ban_specials(logits[:, -1].float().log_softmax(dim=-1)).view(b, k, v)
            # The best k continuations of each beam contain the best k overall.
            cand_lp, cand_tok = logp.topk(k, dim=-1)  # (B, k, k)
            cand_lp = torch.where(done[..., None], finished_lp, cand_lp)
            cand_tok = cand_tok.masked_fill(done[..., None], PAD)
            scores, pick = (scores[..., None] + cand_lp).view(b, k * k).topk(k, dim=-1)
            parent = pick // k  # (B, k)
            new_tok = cand_tok.view(b, k * k).gather(1, pick)  # (B, k)
            rows = (first + parent).view(-1)  # (B*k,)
            seqs = torch.cat([seqs[rows], new_tok.view(-1, 1)], dim=1)
            was_done = done.gather(1, parent)
            lengths = lengths.gather(1, parent) + (~was_done).long()
            done = was_done | (new_tok == EOS)
            if done.all():
                break
            cache = cache.select(rows)
            tok = new_tok.view(-1, 1)
        rank = scores / lengths.clamp(min=1).float() ** length_penalty
        order = rank.argsort(dim=-1, descending=True)  # (B, k)
        rows = (first + order).view(-1)
        caps = _finish(model, memory, seqs[rows], scores.gather(1, order).view(-1), no_repeat)
    return [caps[i : i + k] for i in range(0, len(caps), k)]


def beam_search(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    k: int,
    max_len: int | None = None,
    length_penalty: float = 0.0,
    no_repeat: bool = False,
) -> list[Caption]:
    """The best beam per image (see `beam_search_all`)."""
    beams = beam_search_all(model, grid, pooled, k, max_len, length_penalty, no_repeat)
    return [b[0] for b in beams]


def sequence_logprob(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    token_lists: Sequence[Sequence[int]],
    batch_size: int = 256,
    image_index: Sequence[int] | Tensor | None = None,
) -> Tensor:
    """log p(c | I) (sum over tokens incl. eos) for N (image, caption) pairs -> (N,) float32 on
    CPU. Caption i goes with image `image_index[i]` of grid (B, G, Dv) / pooled (B, Dp), or with
    image i when `image_index` is None. Each batch encodes its distinct images once."""
    n = len(token_lists)
    index = torch.arange(n) if image_index is None else torch.as_tensor(image_index).long()
    if len(index) != n:
        raise DistinctcapError(f"{n} captions but {len(index)} entries in image_index")
    work.count("logprob_scored", n)
    out = []
    with _inference(model):
        for s in range(0, n, batch_size):
            images, inverse = index[s : s + batch_size].unique(return_inverse=True)
            memory = _memory(model, grid[images], pooled[images])[inverse.to(_device(model))]
            out.append(_score(model, memory, token_lists[s : s + batch_size]).cpu())
    return torch.cat(out) if out else torch.zeros(0)


METHODS = ("greedy", "beam", "sample")


def generate(
    model: Captioner,
    grid: Tensor,
    pooled: Tensor,
    method: str,
    batch_size: int = 64,
    **options,
) -> list[list[Caption]]:
    """Decode many images in batches with a progress bar: `method` is greedy, beam (options
    k, length_penalty, ...) or sample (options n, temperature, ...); returns the captions of
    each image (one for greedy and beam, n for sampling)."""
    if method not in METHODS:
        raise DistinctcapError(f"decoding method {method!r}: allowed {', '.join(METHODS)}")
    out: list[list[Caption]] = []
    with progress(total=len(grid), unit="images", desc=f"decode ({method})") as bar:
        for s in range(0, len(grid), batch_size):
            g, p = grid[s : s + batch_size], pooled[s : s + batch_size]
            if method == "greedy":
                out += [[c] for c in greedy(model, g, p, **options)]
            elif method == "beam":
                out += [[c] for c in beam_search(model, g, p, **options)]
            else:
                out += sample(model, g, p, **options)
            bar.update(len(g))
    return out
