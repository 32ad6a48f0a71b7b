"""The one CLIP text encoding (`TextTower`): `encode_text` for token ids (features, evaluation,
retrieval; bit for bit open_clip's `encode_text`) and `ClipTextEncoder` for the specificity
objective's generated captions, whose one-hot tokens carry a straight-through gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import BOS, EOS, PAD

TEXT_POOLS = ("argmax", "eos", "first", "last")


def _is_causal(mask: torch.Tensor | None, n: int) -> bool:
    """Is `mask` open_clip's additive causal mask (-inf above the diagonal, 0 elsewhere)?"""
    if mask is None or tuple(mask.shape) != (n, n):
        return False
    above = torch.ones(n, n, dtype=torch.bool, device=mask.device).triu(1)
    return bool(torch.isneginf(mask[above]).all() and (mask[~above] == 0).all())


class TextTower:
    """open_clip's text tower run from token embeddings: the one implementation of CLIP text
    encoding behind `encode_text` (hard token ids: features, evaluation, CLIP retrieval) and
    `ClipTextEncoder` (one-hot tokens with a straight-through gradient: the specificity
    objective). It holds the tower and changes nothing in it (mode, requires_grad).

    `features` reproduces `CLIP.encode_text` (and `TextTransformer.forward` of a CustomTextCLIP
    without a CLS token or pad mask): token embeddings + positional embedding, the transformer
    with its mask, ln_final, pooling (open_clip's default `argmax`: eot has the largest id),
    text_projection. A tower of another kind (CLS token, pad mask, a Hugging Face text model)
    is a DistinctcapError here; `encode_text` leaves it to open_clip."""

    def __init__(self, clip: torch.nn.Module):
        clip = getattr(clip, "model", clip)  # LoadedClip or the model
        tower = clip.text if hasattr(clip, "text") else clip  # CustomTextCLIP or CLIP
        needed = ("token_embedding", "positional_embedding", "transformer", "ln_final")
        missing = [a for a in needed if not hasattr(tower, a)]
        if (
            missing
            or getattr(tower, "cls_emb", None) is not None
            or getattr(tower, "use_pad_mask", False)
        ):
            raise DistinctcapError(
                f"CLIP text tower {type(tower).__name__} is not a plain open_clip text "
                "transformer (token embedding, causal transformer, eot pooling); "
                f"missing {missing or 'nothing, but it has a CLS token or pad mask'}"
            )
        self.pool = getattr(tower, "text_pool_type", None) or getattr(tower, "pool_type", "argmax")
        if self.pool not in TEXT_POOLS:
            raise DistinctcapError(f"CLIP text pooling {self.pool!r}: supported {TEXT_POOLS}")
        self.eos_id = getattr(tower, "text_eos_id", None) or getattr(tower, "eos_id", None)
        self.module = tower
        self.context_length = tower.positional_embedding.shape[0]

    @functools.cached_property
    def causal(self) -> bool:
        return _is_causal(self.module.attn_mask, self.context_length)

    def pool_index(self, tok: torch.Tensor) -> torch.Tensor:
        """Row position whose features are the text embedding, from the hard ids (B, L)."""
        if self.pool == "argmax":
            return tok.argmax(dim=-1)
        if self.pool == "eos":
            return (tok == self.eos_id).int().argmax(dim=-1)
        return torch.full_like(tok[:, 0], 0 if self.pool == "first" else tok.shape[1] - 1)

    def features(self, x: torch.Tensor, tok: torch.Tensor, cut: bool) -> torch.Tensor:
        """Token embeddings x (B, L, W) of CLIP ids tok (B, L) -> text features (B, E), not
        normalised, in the tower's dtype.

        With `cut`, under a causal mask the positions after the last pooled one are dropped
        (no position sees later ones): the same numbers as the full context up to float
        rounding, at a fraction of the cost (captions of ~20 tokens in CLIP's 77). Without it
        every operation is open_clip's own, so the result is `encode_text`'s bit for bit."""
        tw = self.module
        n, mask = x.shape[1], tw.attn_mask
        if cut and self.causal and self.pool != "last":
            n = int(self.pool_index(tok).max()) + 1
            x, tok, mask = x[:, :n], tok[:, :n], mask[:n, :n]
        x = x.to(tw.transformer.get_cast_dtype()) + tw.positional_embedding[:n].to(x.dtype)
        x = tw.transformer(x, attn_mask=mask)
        x = tw.ln_final(x)
        x = x[torch.arange(x.shape[0], device=x.device), self.pool_index(tok)]  # (B, W)
        proj = tw.text_projection
        if proj is not None:
            x = proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj
        return x


def encode_text(
    model: torch.nn.Module, tokens: torch.Tensor, normalize: bool = False
) -> torch.Tensor:
    """CLIP ids (B, context_length) -> text embeddings (B, E), as open_clip's
    `model.encode_text(tokens, normalize)` and with the same numbers: through `TextTower`
    (the implementation the specificity objective's one-hot path shares) for a plain text
    transformer, else open_clip's own."""
    try:
        tower = TextTower(model)
    except DistinctcapError:
        return model.encode_text(tokens, normalize=normalize)
    x = tower.features(tower.module.token_embedding(tokens), tokens, cut=False)
    return F.normalize(x, dim=-1) if normalize else x


class ClipTextEncoder(torch.nn.Module):
    """The frozen CLIP text encoder of generated captions, fed with token embeddings so
    one-hot tokens can carry gradient (`TextTower` with `cut`, then L2 normalisation in
    float32).

    Captioner ids map to CLIP ids through `clip_ids` (data/tokenizer.py). A one-hot over CLIP's
    vocabulary (V_clip = 49408) times the token-embedding matrix E equals a one-hot over the
    captioner's vocabulary times E[clip_ids] (V_cap rows), and so do their gradients; the
    second is what runs, so memory is (B, T, V_cap), not (B, T, 49408). Building it freezes
    the tower (requires_grad off, eval mode). `prefix` (CLIP ids) goes before every caption,
    e.g. CLIPScore's "A photo depicts" (data.tokenizer.CLIPSCORE_PREFIX).
    """

    def __init__(self, clip: torch.nn.Module, clip_ids: Sequence[int], prefix: Sequence[int] = ()):
        super().__init__()
        self.prefix = torch.as_tensor(list(prefix), dtype=torch.long)  # CLIP ids after sot
        self.text = TextTower(clip)
        self.tower = self.text.module
        self.pool, self.eos_id = self.text.pool, self.text.eos_id
        self.context_length = self.text.context_length
        self.causal = self.text.causal
        self.register_buffer(
            "clip_ids", torch.as_tensor(list(clip_ids), dtype=torch.long), persistent=False
        )
        self.sot, self.eot = int(self.clip_ids[BOS]), int(self.clip_ids[EOS])
        self.requires_grad_(False).eval()

    def train(self, mode: bool = True) -> ClipTextEncoder:
        return super().train(False)  # frozen: always eval (no dropout)

    def _fit(self, t: int) -> int:
        """Caption positions of a (B, t) batch that fit the context after sot and the prefix."""
        return max(0, min(t, self.context_length - 1 - len(self.prefix)))

    def clip_tokens(self, seqs: torch.Tensor) -> torch.Tensor:
        """Captioner ids (B, T) of generated captions (pad after eos; eos may be missing when
        the caption hit max_len) -> CLIP ids (B, context_length): [sot] + prefix + caption +
        [eot], pad 0. Too long a caption keeps its first context_length - 2 - len(prefix)
        tokens and ends with eot, as open_clip's tokenizer truncates."""
        b, t = seqs.shape
        ctx, p = self.context_length, len(self.prefix)
        n_fit = self._fit(t)
        is_tok = (seqs != PAD) & (seqs != EOS)
        first_end = torch.where(is_tok, t, torch.arange(t, device=seqs.device)).min(dim=1).values
        eot_pos = (first_end + 1 + p).clamp(max=ctx - 1)  # (B,)
        tok = seqs.new_zeros(b, ctx)
        tok[:, 0] = self.sot
        tok[:, 1 : 1 + p] = self.prefix.to(seqs.device)
        tok[:, 1 + p : 1 + p + n_fit] = self.clip_ids[seqs[:, :n_fit]]
        pos = torch.arange(ctx, device=seqs.device)
        tok = tok.masked_fill(pos > eot_pos[:, None], 0)
        return tok.scatter(1, eot_pos[:, None], self.eot)

    def pool_index(self, tok: torch.Tensor) -> torch.Tensor:
        """Row position whose features are the text embedding, from the hard ids (B, L)."""
        return self.text.pool_index(tok)

    def forward_embeddings(
        self, x: torch.Tensor, tok: torch.Tensor, normalize: bool = True
    ) -> torch.Tensor:
        """Token embeddings x (B, L, W) of CLIP ids tok (B, L) -> float32 (B, E), L2-normalised
        unless `normalize` is false, on the positions up to the pooled one (`TextTower.features`
        with `cut`)."""
        x = self.text.features(x, tok, cut=True).float()
        return F.normalize(x, dim=-1) if normalize else x

    def forward(
        self, seqs: torch.Tensor, probs: torch.Tensor | None = None, normalize: bool = True
    ) -> torch.Tensor:
        """Generated captioner ids (B, T) -> CLIP text embeddings (B, E), L2-normalised unless
        `normalize` is false (the unnormalised projection of the specificity paper's dp/cdp).

        With `probs` (B, T, V_cap), the captioner's (differentiable) output probabilities at
        those positions, the forward pass is unchanged (hard tokens) and the gradient w.r.t.
        each one-hot input token flows to probs (straight-through)."""
        tok = self.clip_tokens(seqs)
        x = self.tower.token_embedding(tok)  # (B, L, W): the hard one-hot times E
        if probs is not None:
            n_fit, start = self._fit(seqs.shape[1]), 1 + len(self.prefix)
            kept = tok[:, start : start + n_fit] == self.clip_ids[seqs[:, :n_fit]]
            kept &= seqs[:, :n_fit] != PAD  # positions whose CLIP token is the generated one
            residual = (probs - probs.detach())[:, :n_fit] * kept[..., None]  # value 0
            emb = self.tower.token_embedding.weight[self.clip_ids]  # (V_cap, W)
            delta = residual.to(emb.dtype) @ emb  # (B, n_fit, W)
            x = x + F.pad(delta, (0, 0, start, self.context_length - start - n_fit))
        return self.forward_embeddings(x, tok, normalize)
