"""The captioner: a Transformer encoder-decoder over CLIP grid tokens (UNKT §4.1).

Read top to bottom: attention, blocks, the model, then batching and saving helpers.

- Encoder: grid tokens (B, G, Dv) and the pooled embedding (B, Dp) are projected to the model
  width; the pooled embedding becomes one extra memory token (first), grid tokens get learned
  positional embeddings. Memory is (B, G+1, W). No memory mask: the grid is dense.
- Decoder: token + learned position embeddings, causal self-attention, cross-attention to the
  memory, MLP; output head tied to the token embedding.
- Pre-LN blocks (x + f(LN(x)), one final LN), as in GPT-2/nanoGPT, not the post-LN of
  Vaswani et al.: it trains stably without depending on warm-up. So the hidden states returned
  for UNKT eq. 7 are the residual stream after each decoder block (the last one before the
  final LN).
- No key padding mask in the decoder: captions are right-padded, so under the causal mask a real
  position only ever sees real positions to its left. Pad positions compute garbage that the
  loss ignores (ignore_index) and that UNKT's losses must mask (labels != pad).
- Attention is our own code so that, on request, its probabilities softmax(QK^T/sqrt(d_k))
  (UNKT eq. 8) come back with each decoder layer's hidden states; otherwise the fast
  `F.scaled_dot_product_attention` runs.
- Incremental decoding keeps a `KVCache`: per decoder layer the self-attention keys/values of
  the prefix (preallocated buffers, filled in place) and the cross-attention keys/values of the
  memory (computed once per image, shared by its samples or beams), so each new token costs
  O(N) attention instead of re-running the prefix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path
from distinctcap.data.tokenizer import BOS, EOS, PAD

KV = tuple[Tensor, Tensor]  # keys, values: (B, H, T, Dh) each


@dataclass
class CaptionerConfig:
    vocab_size: int
    visual_dim: int  # Dv, width of a CLIP grid token
    pooled_dim: int  # Dp, width of the pooled CLIP embedding
    width: int = 512
    enc_layers: int = 6
    dec_layers: int = 6
    heads: int = 8
    ffn: int = 2048
    dropout: float = 0.1
    max_len: int = 22  # caption positions: [bos] + tokens, or tokens + [eos]
    max_grid: int = 256  # size of the grid positional table; G must not exceed it

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise DistinctcapError(
                f"captioner width {self.width} must be divisible by heads {self.heads}"
            )


@dataclass
class KVCache:
    """Decoder state for incremental decoding, one entry per decoder layer. Rows come in groups
    of `group` consecutive rows per image (its samples or beams), which share the image's
    memory keys/values. `decode_step` writes into the self-attention buffers in place, so a
    cache is used once: carry on with the one it returns."""

    cross: list[KV]  # memory keys/values per image, (B, H, M, Dh)
    self_: list[KV]  # keys/values per row, (B*group, H, max_len, Dh); the first `length` are set
    length: int = 0

    @property
    def group(self) -> int:
        return self.self_[0][0].shape[0] // self.cross[0][0].shape[0]

    def select(self, index: Tensor) -> KVCache:
        """The rows `index` (B*group,) of the decoded prefix, e.g. to reorder beams; row i and
        index[i] must belong to the same image."""
        return KVCache(self.cross, [(k[index], v[index]) for k, v in self.self_], self.length)


def causal_mask(n: int, s: int, device: torch.device) -> Tensor:
    """(N, S) bool, True = may attend: the N queries are the last N of S positions."""
    return torch.ones(n, s, dtype=torch.bool, device=device).tril(diagonal=s - n)


class Attention(nn.Module):
    """Multi-head attention softmax(QK^T / sqrt(d_k)) V (Vaswani et al. eq. 1)."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width)
        self.proj = nn.Linear(width, width)

    def split_heads(self, x: Tensor) -> Tensor:  # (B, T, W) -> (B, H, T, Dh)
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def project_kv(self, x: Tensor) -> KV:  # (B, T, W) -> 2 x (B, H, T, Dh)
        k, v = self.kv(x).chunk(2, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def forward(
        self, x: Tensor, kv: KV, causal: bool = False, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, N, W) attends to kv (B, H, S, Dh); returns (B, N, W) and, if asked, the
        attention probabilities (B, H, N, S), taken before dropout so rows sum to 1.
        With `causal`, query i is the (S - N + i)-th position: it sees keys 0..S-N+i.
        kv may have B/g rows, shared by g consecutive rows of x (cross-attention of the
        samples or beams of one image): their queries are then stacked, not the keys copied."""
        q, (k, v) = self.split_heads(self.q(x)), kv  # q: (B, H, N, Dh)
        n, s, g = q.shape[2], k.shape[2], q.shape[0] // k.shape[0]
        if g > 1:
            q = q.unflatten(0, (-1, g)).transpose(1, 2).flatten(2, 3)  # (B/g, H, g*N, Dh)
        p_drop = self.dropout if self.training else 0.0
        probs = None
        # Branches, not `is_causal=causal and n > 1`: with dynamic caption lengths under
        # torch.compile that is a symbolic bool, which attention cannot take (a graph break in
        # every block); an `if` on it is a guard instead
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, N, S)
            if causal:
                scores = scores.masked_fill(~causal_mask(n, s, x.device), float("-inf"))
            probs = scores.softmax(dim=-1)
            out = F.dropout(probs, p_drop, self.training) @ v  # (B, H, N, Dh)
        elif not causal or n == 1:  # a single query (the newest position) sees every key
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop)
        elif n != s:  # several new tokens after a cached prefix
            mask = causal_mask(n, s, x.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p_drop)
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop, is_causal=True)
        if g > 1:
            out = out.unflatten(2, (g, n)).transpose(1, 2).flatten(0, 1)  # (B, H, N, Dh)
        out = out.transpose(1, 2).flatten(2)  # (B, N, W)
        return F.dropout(self.proj(out), p_drop, self.training), probs


class MLP(nn.Module):
    def __init__(self, width: int, ffn: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(width, ffn), nn.GELU(), nn.Linear(ffn, width), nn.Dropout(dropout)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class EncoderBlock(nn.Module):
    def __init__(self, cfg: CaptionerConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.width), nn.LayerNorm(cfg.width)
        self.attn = Attention(cfg.width, cfg.heads, cfg.dropout)
        self.mlp = MLP(cfg.width, cfg.ffn, cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:  # (B, M, W) -> (B, M, W)
        h = self.ln1(x)
        x = x + self.attn(h, self.attn.project_kv(h))[0]
        return x + self.mlp(self.ln2(x))


class DecoderBlock(nn.Module):
    def __init__(self, cfg: CaptionerConfig):
        super().__init__()
        self.ln1, self.ln2, self.ln3 = (nn.LayerNorm(cfg.width) for _ in range(3))
        self.self_attn = Attention(cfg.width, cfg.heads, cfg.dropout)
        self.cross_attn = Attention(cfg.width, cfg.heads, cfg.dropout)
        self.mlp = MLP(cfg.width, cfg.ffn, cfg.dropout)

    def forward(
        self,
        x: Tensor,
        memory_kv: KV,
        cache: KV | None = None,
        start: int = 0,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x (B, N, W) at positions start..start+N-1 -> (x, self probs (B, H, N, N),
        cross probs (B, H, N, M)). When decoding incrementally, `cache` holds the buffers of
        the prefix's keys/values: this step's are written into them."""
        h = self.ln1(x)
        k, v = self.self_attn.project_kv(h)
        if cache is not None:
            end = start + k.shape[2]
            cache[0][:, :, start:end], cache[1][:, :, start:end] = k, v
            k, v = cache[0][:, :, :end], cache[1][:, :, :end]
        a, self_p = self.self_attn(h, (k, v), causal=True, need_weights=need_weights)
        x = x + a
        a, cross_p = self.cross_attn(self.ln2(x), memory_kv, need_weights=need_weights)
        x = x + a
        return x + self.mlp(self.ln3(x)), self_p, cross_p


class Captioner(nn.Module):
    def __init__(self, cfg: CaptionerConfig):
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.grid_proj = nn.Linear(cfg.visual_dim, w)
        self.pooled_proj = nn.Linear(cfg.pooled_dim, w)
        self.grid_pos = nn.Parameter(torch.zeros(cfg.max_grid, w))
        self.pooled_type = nn.Parameter(torch.zeros(w))  # marks the pooled memory token
        self.encoder = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.enc_layers))
        self.enc_ln = nn.LayerNorm(w)
        self.tok_emb = nn.Embedding(cfg.vocab_size, w)
        self.pos_emb = nn.Embedding(cfg.max_len, w)
        self.decoder = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.dec_layers))
        self.dec_ln = nn.LayerNorm(w)
        self.head = nn.Linear(w, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying, as in nanoGPT
        self.drop = nn.Dropout(cfg.dropout)
        self.apply(self._init_weights)
        nn.init.normal_(self.grid_pos, std=0.02)
        nn.init.normal_(self.pooled_type, std=0.02)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def encode(self, grid: Tensor, pooled: Tensor) -> Tensor:
        """grid (B, G, Dv), pooled (B, Dp) -> memory (B, G+1, W)."""
        g = grid.shape[1]
        if g > self.cfg.max_grid:
            raise DistinctcapError(f"{g} grid tokens, but captioner max_grid={self.cfg.max_grid}")
        dtype = self.grid_proj.weight.dtype
        grid_tok = self.grid_proj(grid.to(dtype)) + self.grid_pos[:g]  # (B, G, W)
        pooled_tok = self.pooled_proj(pooled.to(dtype)) + self.pooled_type  # (B, W)
        x = self.drop(torch.cat([pooled_tok[:, None], grid_tok], dim=1))  # (B, G+1, W)
        for block in self.encoder:
            x = block(x)
        return self.enc_ln(x)

    def init_cache(self, memory: Tensor, group: int = 1) -> KVCache:
        """An empty cache for decoding `group` captions per image of memory (B, M, W) at once."""
        cross = [
            tuple(t.contiguous() for t in blk.cross_attn.project_kv(memory)) for blk in self.decoder
        ]
        b, h, _, dh = cross[0][0].shape
        shape = (b * group, h, self.cfg.max_len, dh)
        return KVCache(cross, [(memory.new_empty(shape), memory.new_empty(shape)) for _ in cross])

    def _decode(
        self, tokens: Tensor, cross: list[KV], cache: KVCache | None, need_weights: bool
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """tokens (B, N) at positions start..start+N-1 -> logits (B, N, V)."""
        start = 0 if cache is None else cache.length
        n = tokens.shape[1]
        if start + n > self.cfg.max_len:
            raise DistinctcapError(
                f"caption positions {start + n} exceed captioner max_len={self.cfg.max_len}"
            )
        pos = torch.arange(start, start + n, device=tokens.device)
        x = self.drop(self.tok_emb(tokens) + self.pos_emb(pos))  # (B, N, W)
        internals: dict[str, list[Tensor]] = {"hidden": [], "self_attn": [], "cross_attn": []}
        for i, blk in enumerate(self.decoder):
            buffers = None if cache is None else cache.self_[i]
            x, self_p, cross_p = blk(x, cross[i], buffers, start, need_weights)
            if need_weights:
                internals["hidden"].append(x)
                internals["self_attn"].append(self_p)
                internals["cross_attn"].append(cross_p)
        return self.head(self.dec_ln(x)), internals

    def decode(
        self, memory: Tensor, tokens_in: Tensor, return_internals: bool = False
    ) -> Tensor | tuple[Tensor, dict[str, list[Tensor]]]:
        """Teacher-forced decoding: memory (B, M, W), tokens_in (B, N) -> logits (B, N, V).
        With `return_internals`, also {"hidden": L x (B, N, W), "self_attn": L x (B, H, N, N),
        "cross_attn": L x (B, H, N, M)} for UNKT eq. 7-8."""
        cross = [blk.cross_attn.project_kv(memory) for blk in self.decoder]
        logits, internals = self._decode(tokens_in, cross, None, return_internals)
        return (logits, internals) if return_internals else logits

    def decode_step(self, tokens: Tensor, cache: KVCache) -> tuple[Tensor, KVCache]:
        """Incremental decoding: the next tokens (B, T) after the cache's prefix ->
        logits (B, T, V) and the cache extended by T positions. For inference (under
        torch.no_grad): the cache is filled in place, which backward cannot go through."""
        logits, _ = self._decode(tokens, cache.cross, cache, False)
        return logits, KVCache(cache.cross, cache.self_, cache.length + tokens.shape[1])

    def forward(
        self,
        grid: Tensor,
        pooled: Tensor,
        tokens_in: Tensor,
        labels: Tensor | None = None,
        pad_id: int = PAD,
        return_internals: bool = False,
    ) -> tuple:
        """-> (logits (B, N, V), loss or None[, internals]). The loss is the token
        cross-entropy (UNKT eq. 1), mean over non-pad labels."""
        out = self.decode(self.encode(grid, pooled), tokens_in, return_internals)
        logits, internals = out if return_internals else (out, None)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=pad_id)
        return (logits, loss, internals) if return_internals else (logits, loss)

    def save(self, path: str | os.PathLike) -> None:
        """Write config + weights atomically."""
        with atomic_path(path) as tmp:
            torch.save({"config": asdict(self.cfg), "state_dict": self.state_dict()}, tmp)

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Captioner:
        """The saved model, on `map_location` (its weights were copied into a CPU model before, so
        a frozen teacher or reference loaded for a GPU run stayed on the CPU)."""
        return cls.from_checkpoint(torch.load(path, map_location=map_location, weights_only=True),
                                   map_location)

    @classmethod
    def from_checkpoint(cls, ckpt: dict, map_location: str | torch.device = "cpu") -> Captioner:
        model = cls(CaptionerConfig(**ckpt["config"])).to(map_location)
        model.load_state_dict(ckpt["state_dict"])
        return model



def label_logprobs(logits: Tensor, labels: Tensor, pad_id: int = PAD) -> Tensor:
    """Sequence log-probabilities log p(c | I) = sum over non-pad positions of
    log softmax(logits)[label] (a sum, not a mean): logits (B, N, V), labels (B, N) -> (B,).
    Differentiable, for CL eq. 7-10."""
    logp = logits.float().log_softmax(dim=-1).gather(-1, labels[..., None]).squeeze(-1)
    return logp.masked_fill(labels == pad_id, 0.0).sum(dim=-1)


def make_batch(
    token_lists: Sequence[Sequence[int]],
    max_len: int,
    bos: int = BOS,
    eos: int = EOS,
    pad: int = PAD,
    dtype: torch.dtype = torch.long,
) -> tuple[Tensor, Tensor]:
    """inputs = [bos] + tokens, labels = tokens + [eos], each truncated to `max_len` (a caption
    of max_len tokens or more loses its eos), right-padded with `pad` to the longest row.
    Returns two tensors (B, N) of `dtype`, N <= max_len.

    Filled a block of captions at a time from their tokens laid end to end, without a list per
    caption: COCO's 590,855 training captions took 26 s and peaked 1,821 MB in a training job
    when each row was a Python list (issue 55)."""
    lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
    n = int(np.minimum(lengths + 1, max_len).max()) if len(lengths) else 1
    inputs = torch.full((len(lengths), n), pad, dtype=dtype)
    labels = torch.full((len(lengths), n), pad, dtype=dtype)
    inputs[:, :1] = bos
    for s in range(0, len(lengths), FILL_BLOCK):
        block = slice(s, s + FILL_BLOCK)
        flat = _tokens_end_to_end(token_lists[block])
        _fill_block(inputs[block].numpy(), labels[block].numpy(), flat, lengths[block], max_len)
    short = np.flatnonzero(lengths < max_len)
    labels.numpy()[short, lengths[short]] = eos
    return inputs, labels


FILL_BLOCK = 65_536  # captions make_batch fills at a time: its scratch is a few MB, not the data's


def _fill_block(
    inputs: np.ndarray, labels: np.ndarray, flat: np.ndarray, lengths: np.ndarray, max_len: int
) -> None:
    """Write captions' tokens (`flat`, end to end) after the bos of `inputs`' rows and from
    the start of `labels`' rows, each cut at `max_len`."""
    row = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    at = np.arange(len(flat), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    kept = at + 1 < max_len
    inputs[row[kept], at[kept] + 1] = flat[kept]
    kept = at < max_len
    labels[row[kept], at[kept]] = flat[kept]


def _tokens_end_to_end(token_lists: Sequence[Sequence[int]]) -> np.ndarray:
    """Every caption's tokens in one int64 array (a caption's numpy array is taken as is)."""
    arrays = [np.asarray(t) for t in token_lists if len(t)]
    if not arrays:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(arrays).astype(np.int64, copy=False)
