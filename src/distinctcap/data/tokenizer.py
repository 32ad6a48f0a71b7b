"""Captioner tokeniser: open_clip's BPE restricted to the tokens seen in training captions.

Captioner ids are 0 = pad, 1 = bos, 2 = eos, 3 = unk, then the BPE tokens in CLIP-id order.
`clip_ids[i]` maps captioner id i back to CLIP's token id, so generated tokens can be fed
straight into the CLIP text encoder (specificity paper §3.2). pad maps to CLIP's pad (0),
bos/eos to CLIP's start/end of text, unk to the BPE token of "unknown".
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from functools import cached_property

from distinctcap.core.io import atomic_path

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
# Hessel et al. 2021 encode candidates as "A photo depicts <caption>" for CLIPScore, and
# references the same way for RefCLIPScore (their clipscore.py): the evaluation's CLIPScore
# (scores.ranks) and the CLIPScore reward of self-critical training (methods.scst)
CLIPSCORE_PREFIX = "A photo depicts "


class CaptionTokenizer:
    def __init__(self, clip_ids: list[int]):
        self.clip_ids = list(clip_ids)
        self.index = {c: i for i, c in enumerate(self.clip_ids) if i >= len(SPECIALS)}

    @classmethod
    def fit(cls, texts: Iterable[str]) -> CaptionTokenizer:
        bpe = _bpe()
        seen = sorted({t for text in texts for t in bpe.encode(text)})
        specials = [0, bpe.encoder["<start_of_text>"], bpe.encoder["<end_of_text>"],
                    bpe.encode("unknown")[0]]
        return cls(specials + [t for t in seen if t not in specials])

    @property
    def vocab_size(self) -> int:
        return len(self.clip_ids)

    def encode(self, text: str) -> list[int]:
        """Caption text -> captioner ids, without bos/eos."""
        return [self.index.get(t, UNK) for t in _bpe().encode(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """Captioner ids -> text; stops at eos, skips pad and bos."""
        clip = []
        for i in ids:
            if i == EOS:
                break
            if i not in (PAD, BOS):
                clip.append(self.clip_ids[i])
        return _bpe().decode(clip).strip()

    def to_clip(self, ids: Iterable[int]) -> list[int]:
        return [self.clip_ids[i] for i in ids]

    @cached_property
    def words(self) -> list[str]:
        """Readable form of each captioner id (for logs and plots)."""
        bpe = _bpe()
        return [*SPECIALS, *(bpe.decoder[c] for c in self.clip_ids[len(SPECIALS):])]

    def save(self, path: str | os.PathLike) -> None:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps({"clip_ids": self.clip_ids}))

    @classmethod
    def load(cls, path: str | os.PathLike) -> CaptionTokenizer:
        with open(path) as f:
            return cls(json.load(f)["clip_ids"])


def clip_bpe_ids(text: str) -> list[int]:
    """CLIP's own token ids of `text` (open_clip's BPE, lowercased), without sot/eot."""
    return list(_bpe().encode(text))


_BPE = None


def _bpe():
    """open_clip's BPE (SimpleTokenizer), made on first use: importing open_clip takes seconds,
    and every module that needs only the special ids (PAD, BOS, EOS, UNK) imports this one."""
    global _BPE
    if _BPE is None:
        from open_clip.tokenizer import SimpleTokenizer

        _BPE = SimpleTokenizer()
    return _BPE
