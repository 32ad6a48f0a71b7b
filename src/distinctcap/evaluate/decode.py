"""The decoding stage: a run's captions of one split under one named decoding setting.

A setting is an entry of the `decoding:` config (schema: workflow/schemas/sections/decoding.yaml):
kind greedy | beam (k, length_penalty) | sample (n, temperature, top_k, top_p), plus no_repeat
(specificity paper §4) and batch_size. The result is the `generated` table (ARCHITECTURE.md,
data contracts): run, image_id, sample (0 for greedy/beam, 0..n-1 for sampling), text and
logprob = log p(c | I) under the run's model. The search itself (greedy, beam, sampling) is
distinctcap.captioner.search. Sampling draws from a generator seeded with `seed`, so a rerun writes
the
same captions. Rule `decode` runs this module's `decode_run` (workflow/scripts/decode.py).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd
import torch

from distinctcap.captioner.load import caption_tokenizer, load_captioner
from distinctcap.captioner.model import Captioner
from distinctcap.captioner.search import generate
from distinctcap.core.devices import CPU
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_table, write_table
from distinctcap.features.read import ImageFeatures

log = logging.getLogger(__name__)

OPTIONS = {  # decoding options each kind passes on to distinctcap.captioner.search
    "greedy": ("no_repeat",),
    "beam": ("k", "length_penalty", "no_repeat"),
    "sample": ("n", "temperature", "top_k", "top_p", "no_repeat"),
}


def decode_options(setting: dict, device: torch.device, seed: int) -> dict:
    """The keyword arguments of distinctcap.captioner.search.generate for a decoding setting."""
    kind = setting.get("kind")
    if kind not in OPTIONS:
        raise DistinctcapError(f"decoding kind = {kind!r}: choose one of {sorted(OPTIONS)}")
    options = {key: setting[key] for key in OPTIONS[kind] if key in setting}
    if kind == "sample":
        options["generator"] = torch.Generator(device=device).manual_seed(seed)
    return options


def generate_table(
    model: Captioner,
    features: ImageFeatures,
    setting: dict,
    run: str,
    decode_text,
    seed: int = 0,
) -> pd.DataFrame:
    """Captions of every image in `features` as a `generated` table; `decode_text` maps
    captioner ids to text (CaptionTokenizer.decode)."""
    device = next(model.parameters()).device
    options = decode_options(setting, device, seed)
    caps = generate(
        model,
        features.grid,
        features.pooled,
        setting["kind"],
        batch_size=setting.get("batch_size", 64),
        **options,
    )
    rows = [
        (run, int(image_id), i, decode_text(c.tokens), c.logprob)
        for image_id, per_image in zip(features.image_ids, caps, strict=True)
        for i, c in enumerate(per_image)
    ]
    return pd.DataFrame(rows, columns=["run", "image_id", "sample", "text", "logprob"])


def decode_run(
    model_path: str | os.PathLike,
    features_index: str | os.PathLike,
    images_path: str | os.PathLike,
    vocab_path: str | os.PathLike,
    out_path: str | os.PathLike,
    run: str,
    split: str,
    setting: dict,
    seed: int = 0,
    device: torch.device = CPU,
) -> pd.DataFrame:
    """Decode the images of `split` with the run's model and write the `generated` table."""
    model = load_captioner(model_path, map_location=device).eval()
    images = read_table(images_path, "images")
    ids = np.sort(images.image_id[images.split == split].to_numpy())
    if len(ids) == 0:
        raise DistinctcapError(f"no images in split {split!r} to decode for run {run}")
    features = ImageFeatures.load(features_index, ids)
    tokenizer = caption_tokenizer(model, vocab_path)
    table = generate_table(model, features, setting, run, tokenizer.decode, seed)
    write_table(table, out_path, "generated")
    log.info(
        "run %s, %s, %s: %d captions of %d images, mean logprob %.3f",
        run,
        split,
        setting["kind"],
        len(table),
        len(ids),
        table.logprob.mean(),
    )
    return table
