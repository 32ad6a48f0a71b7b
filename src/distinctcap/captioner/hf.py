"""The `transformers` captioner backend: a pre-trained image-to-text model (BLIP first,
`BlipForConditionalGeneration`) behind the native captioner's interface
(distinctcap.captioner.model), so
the trainer, every objective, the search and the evaluation run it unchanged.

- `captioner.vision: frozen` (default): the feature stage (`extract_vision_features`) caches
  the vision tower's last hidden states (B, 1 + patches, Dv) as the grid, the way CLIP's grid
  is cached for the native captioner, and `encode(grid, pooled)` returns them as the decoder's
  memory. `vision: train` (end to end): the feature stage caches the processed pixels instead
  (3 x H x W stored as a (3H, W) "grid", about the same bytes as BLIP's states) and `encode`
  runs the tower on them, with gradients, once per distinct image of a batch.
- Ids: the native code assumes pad 0, bos 1, eos 2 (distinctcap.captioner.model). `VocabSwap`
exchanges
  BLIP's bos ([DEC]) and eos ([SEP]) with ids 1 and 2 ([unused0], [unused1]) on the way in and
  out of the model; pad is 0 in both. Tokens in this id space are "captioner ids".
- `decode(..., return_internals=True)` asks the text decoder for `output_hidden_states` /
  `output_attentions` (BLIP's text attention is eager): the residual stream after each
  decoder layer and the self- and cross-attention probabilities, for UNKT eq. 7-8.
- A run folder's `model.pt` holds the weights with the model's config and its source
  (`save`, `load_captioner`); `export_run` writes the `save_pretrained` folder that
  `transformers.pipeline` loads."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distinctcap.core.errors import DistinctcapError, first_line
from distinctcap.core.hub import downloads_off, hub_cache
from distinctcap.core.io import atomic_path
from distinctcap.data.tokenizer import BOS, EOS, PAD

log = logging.getLogger(__name__)


KIND = "transformers"


VISION = ("frozen", "train")  # captioner.vision: cache the tower's states, or train it too


def _transformers():
    import transformers

    transformers.logging.set_verbosity_error()  # no load reports in every job's log
    return transformers


class VocabSwap:
    """Captioner ids <-> the model's ids: bos and eos swapped into 1 and 2 (module doc).
    An involution, so one table maps both ways, and logits are gathered with it."""

    def __init__(self, vocab_size: int, bos: int, eos: int, pad: int):
        if pad != PAD or bos == eos or bos == EOS or eos == BOS:
            raise DistinctcapError(
                f"transformers captioner: pad id {pad}, bos {bos}, eos {eos} cannot be mapped "
                f"onto the captioner's pad {PAD}, bos {BOS}, eos {EOS}"
            )
        table = torch.arange(vocab_size)
        for ours, theirs in ((BOS, bos), (EOS, eos)):
            table[ours], table[theirs] = theirs, ours
        self.table = table
        self._on: dict[torch.device, Tensor] = {}  # the table per device, copied once

    def on(self, device: torch.device) -> Tensor:
        if device not in self._on:
            self._on[device] = self.table.to(device)
        return self._on[device]

    def __call__(self, ids: Tensor) -> Tensor:
        return self.on(ids.device)[ids]

    def logits(self, logits: Tensor) -> Tensor:
        """(..., V) in the model's order -> (..., V) in captioner-id order."""
        return logits.index_select(-1, self.on(logits.device))


def text_config(model) -> object:
    return model.config.text_config


def vocab_swap(model) -> VocabSwap:
    t = text_config(model)
    return VocabSwap(t.vocab_size, t.bos_token_id, t.sep_token_id, t.pad_token_id)


class HFTokenizer:
    """The model's tokenizer in captioner ids: the CaptionTokenizer interface (encode without
    bos/eos, decode up to eos, vocab_size)."""

    def __init__(self, tokenizer, swap: VocabSwap):
        self.tokenizer, self.swap = tokenizer, swap

    @property
    def vocab_size(self) -> int:
        return len(self.swap.table)

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        table = self.swap.table.tolist()
        return [[table[i] for i in row] for row in ids]

    def encode(self, text: str) -> list[int]:
        return self.encode_many([text])[0]

    def decode(self, ids: Iterable[int]) -> str:
        table, out = self.swap.table.tolist(), []
        for i in ids:
            if i == EOS:
                break
            if i not in (PAD, BOS):
                out.append(table[i])
        return self.tokenizer.decode(out, skip_special_tokens=True).strip()


@dataclass
class HFConfig:
    """What the search and objectives read of a captioner's config (CaptionerConfig's names)."""

    vocab_size: int
    max_len: int


@dataclass
class HFCache:
    """Incremental decoding state (model.KVCache's interface): the memory of every row and the
    model's own key/value cache."""

    memory: Tensor  # (rows, M, Dv)
    past: object | None = None  # transformers Cache
    length: int = 0

    def select(self, index: Tensor) -> HFCache:
        if self.past is not None:
            self.past.reorder_cache(index)
        return HFCache(self.memory[index], self.past, self.length)


def _rows(memory: Tensor, n: int) -> Tensor:
    """Memory (B, M, D) for n token rows: g = n / B consecutive rows share an image."""
    return memory if len(memory) == n else memory.repeat_interleave(n // len(memory), dim=0)


class HFCaptioner(nn.Module):
    """A transformers image-to-text model with the native captioner's interface (module doc)."""

    kind = KIND

    def __init__(self, model, source: str, max_len: int, tokenizer=None, vision="frozen"):
        super().__init__()
        if vision not in VISION:
            raise DistinctcapError(f"captioner.vision = {vision!r}: choose one of {VISION}")
        self.hf, self.source, self.vision = model, source, vision
        self.swap = vocab_swap(model)
        t = text_config(model)
        if not 2 <= max_len <= t.max_position_embeddings:
            raise DistinctcapError(
                f"captioner.max_len = {max_len}: allowed 2..{t.max_position_embeddings} "
                f"for {source}"
            )
        self.cfg = HFConfig(t.vocab_size, max_len)
        self.tokenizer = HFTokenizer(tokenizer, self.swap) if tokenizer is not None else None
        model.vision_model.requires_grad_(vision == "train")  # frozen: its states are cached

    @classmethod
    def from_pretrained(cls, source: str, max_len: int, vision: str = "frozen") -> HFCaptioner:
        tf = _transformers()
        model = hub_load(tf.AutoModelForImageTextToText, source, attn_implementation="eager")
        return cls(model.float(), source, max_len, load_processor(source).tokenizer, vision)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- the captioner interface ---------------------------------------------------------------

    def encode(self, grid: Tensor, pooled: Tensor | None = None) -> Tensor:
        """The decoder's memory (B, M, Dv): the cached vision states (frozen), or the tower's
        states of the cached pixels (B, 3H, W) (vision train)."""
        grid = grid.to(self.hf.text_decoder.dtype)
        if self.vision == "frozen":
            return grid
        pixels = grid.unflatten(1, (3, -1))  # (B, 3, H, W)
        return self.hf.vision_model(pixel_values=pixels).last_hidden_state

    def _text(self, memory: Tensor, tokens: Tensor, **kwargs):
        return self.hf.text_decoder(
            input_ids=self.swap(tokens),
            encoder_hidden_states=_rows(memory, len(tokens)),
            return_dict=True,
            **kwargs,
        )

    def decode(
        self, memory: Tensor, tokens_in: Tensor, return_internals: bool = False
    ) -> Tensor | tuple[Tensor, dict[str, list[Tensor]]]:
        """Teacher-forced logits (B, N, V) in captioner ids; with `return_internals` also
        {"hidden", "self_attn", "cross_attn"}, one entry per decoder layer (model.Captioner)."""
        flags = {"output_hidden_states": True, "output_attentions": True}
        out = self._text(memory, tokens_in, use_cache=False, **(flags if return_internals else {}))
        logits = self.swap.logits(out.logits)
        if not return_internals:
            return logits
        internals = {
            "hidden": list(out.hidden_states[1:]),  # [0] is the embedding output
            "self_attn": list(out.attentions),
            "cross_attn": list(out.cross_attentions),
        }
        return logits, internals

    def init_cache(self, memory: Tensor, group: int = 1) -> HFCache:
        return HFCache(memory.repeat_interleave(group, dim=0) if group > 1 else memory)

    def decode_step(self, tokens: Tensor, cache: HFCache) -> tuple[Tensor, HFCache]:
        out = self._text(cache.memory, tokens, cache=cache.past, use_cache=True)
        logits = self.swap.logits(out.logits)
        return logits, HFCache(cache.memory, out.cache, cache.length + tokens.shape[1])

    def forward(self, grid, pooled, tokens_in, labels=None, pad_id: int = PAD, **_):
        logits = self.decode(self.encode(grid, pooled), tokens_in)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=pad_id)
        return logits, loss

    # -- files ---------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """model.pt: the weights, the model's config (JSON text) and its source, atomically."""
        payload = {
            "kind": KIND,
            "source": self.source,
            "max_len": self.cfg.max_len,
            "vision": self.vision,
            "hf_config": self.hf.config.to_json_string(),
            "state_dict": self.hf.state_dict(),
        }
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)

    @classmethod
    def from_checkpoint(cls, ckpt: dict, map_location) -> HFCaptioner:
        tf = _transformers()
        config = tf.AutoConfig.for_model(**json.loads(ckpt["hf_config"]))
        config._attn_implementation = "eager"
        model = tf.AutoModelForImageTextToText.from_config(config)
        model.load_state_dict(ckpt["state_dict"])
        tokenizer = load_processor(ckpt["source"]).tokenizer
        return cls(
            model.float(), ckpt["source"], ckpt["max_len"], tokenizer, ckpt["vision"]
        ).to(map_location)

    def export(self, out_dir: str | os.PathLike) -> None:
        """`save_pretrained` of the model and its processor into `out_dir`, replaced whole
        (written beside it, then renamed); generation stops at eos after max_len tokens."""
        out = Path(out_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
        try:
            t = text_config(self.hf)
            gen = self.hf.generation_config
            gen.max_new_tokens, gen.eos_token_id = self.cfg.max_len, t.sep_token_id
            gen.bos_token_id, gen.pad_token_id = t.bos_token_id, t.pad_token_id
            self.hf.save_pretrained(tmp)
            load_processor(self.source).save_pretrained(tmp)
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def load_processor(source: str):
    return hub_load(_transformers().AutoProcessor, source)


def hub_load(loader, source: str, **kwargs):
    """`loader.from_pretrained(source)`: a local folder or the hub cache first (transformers'
    local_files_only), then downloaded where huggingface_hub's downloads are on; a
    DistinctcapError line naming captioner.pretrained and what was tried otherwise."""
    key = f"captioner.pretrained = {source!r}"
    try:
        return loader.from_pretrained(source, local_files_only=True, **kwargs)
    except OSError as cached_miss:
        if downloads_off():
            raise DistinctcapError(
                f"{key}: no such folder, and not in the hub cache {hub_cache()} "
                f"({first_line(cached_miss)}) while downloads are off (HF_HUB_OFFLINE); run "
                "`distinctcap fetch` where the network is reachable, or give a save_pretrained "
                "folder"
            ) from cached_miss
    try:
        return loader.from_pretrained(source, **kwargs)
    except OSError as error:
        raise DistinctcapError(f"{key}: downloading it failed: {first_line(error)}") from error




def retokenize(captions: pd.DataFrame, source: str) -> tuple[pd.DataFrame, HFTokenizer]:
    """Captions with `tokens` in the pre-trained model's captioner ids, and its tokenizer."""
    tf = _transformers()
    config = hub_load(tf.AutoConfig, source)
    t = config.text_config
    tokenizer = HFTokenizer(
        load_processor(source).tokenizer,
        VocabSwap(t.vocab_size, t.bos_token_id, t.sep_token_id, t.pad_token_id),
    )
    tokens = tokenizer.encode_many(captions.text.tolist()) if len(captions) else []
    return captions.assign(tokens=tokens), tokenizer
