"""A tiny random BLIP (BlipForConditionalGeneration + BlipProcessor) built from a BlipConfig and
saved with save_pretrained, so tests load it by the same path a hub id takes, offline."""

from __future__ import annotations

import re
from pathlib import Path


def shapes_words() -> list[str]:
    """Every word the shapes world's captions use (its vocabulary tables, flattened)."""
    from distinctcap.data import shapes

    tables = [shapes.SHAPES, shapes.COLOURS, shapes.SIZES, shapes.RELATIONS, shapes.NUMBERS,
              shapes.BACKGROUNDS, shapes.GENERIC]
    text = " ".join(re.sub(r"[^a-z ]", " ", str(t).lower()) for t in tables)
    extra = "a an the of and with some other on in it its is are picture objects shapes background"
    return sorted(set(text.split()) | set(extra.split()))


def save_tiny_blip(folder: Path, image_size: int = 32, seed: int = 0) -> Path:
    """A random BLIP with 1 vision and 2 text layers of width 32 over the shapes words, saved
    to `folder` (model + processor). Returns `folder`."""
    import torch
    from transformers import (
        BertTokenizer,
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
    )

    folder.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (folder / "vocab.txt").write_text("\n".join(specials + shapes_words()) + "\n")
    tokenizer = BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})  # as BLIP's processor
    (folder / "vocab.txt").unlink()
    processor = BlipProcessor(
        image_processor=BlipImageProcessor(size={"height": image_size, "width": image_size}),
        tokenizer=tokenizer,
    )
    ids = {"bos_token_id": tokenizer.bos_token_id, "sep_token_id": tokenizer.sep_token_id,
           "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.sep_token_id}
    config = BlipConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=image_size, patch_size=8),
        text_config=dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64,
                         **ids),
    )
    torch.manual_seed(seed)
    BlipForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
