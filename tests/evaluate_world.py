"""A tiny real world for the evaluation and report tests, built once per test session.

The shapes world through the real data stage, CLIP features of the registered tiny CLIP with
random weights (retrieval numbers are then plumbing checks only) through the real features
stage, a random-init captioner, and hand-made generated captions of two runs:
`perfect` says each image's specific reference caption (samples: its references), `generic`
says "a picture of some shapes" (samples: generic phrasings).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import open_clip
import pandas as pd
import torch
from conftest import ROOT

from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.clip.load import load_clip
from distinctcap.config.check import load_schema, validate
from distinctcap.core.io import read_table, write_table
from distinctcap.data.prepare import prepare
from distinctcap.data.shapes import GENERIC
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.features.extract import FeatureSettings, extract_features
from distinctcap.features.read import load_image_features
from distinctcap.train.clip import save_weights

N_TEST = 12
SAMPLES = 4


@dataclass
class World:
    root: Path
    images: str
    captions: str
    vocab: str
    features: str
    model: str

    def generated(self, run: str, decoding: str) -> str:
        return str(self.root / "generated" / run / f"test-{decoding}.parquet")


def config() -> dict:
    """The real config schema, shrunk: defaults filled for every section."""
    raw = {
        "data": {
            "source": "shapes",
            "shapes": {"n_train": 30, "n_val": 4, "n_test": N_TEST, "seed": 0},
        },
        "runs": {"reference": {"method": "mle"}},
    }
    return validate(raw, load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml"))


def build(root: Path) -> World:
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    world = World(
        root,
        str(data / "images.parquet"),
        str(data / "captions.parquet"),
        str(data / "vocab.json"),
        str(root / "features" / "index.json"),
        str(root / "model.pt"),
    )
    if (root / "done").exists():
        return world
    torch.manual_seed(0)
    outputs = {
        "images": world.images,
        "captions": world.captions,
        "vocab": world.vocab,
        "quarantine": str(data / "quarantine.parquet"),
    }
    prepare(config()["data"], "fail", outputs)
    model, _, _ = open_clip.create_model_and_transforms("shapes-vit-tiny")
    save_weights(model, root / "clip.pt")
    clip = load_clip("shapes-vit-tiny", str(root / "clip.pt"))
    images, captions = read_table(world.images), read_table(world.captions)
    extract_features(
        images,
        captions,
        clip,
        world.features,
        root / "features" / "cache",
        FeatureSettings(batch_size=64, workers=0),
        device=torch.device("cpu"),
    )
    vocab = CaptionTokenizer.load(world.vocab).vocab_size
    _, pooled, grid = load_image_features(world.features)
    cfg = CaptionerConfig(
        vocab_size=vocab,
        visual_dim=grid.shape[-1],
        pooled_dim=pooled.shape[-1],
        width=32,
        enc_layers=1,
        dec_layers=1,
        heads=2,
        ffn=64,
        max_len=32,
    )
    Captioner(cfg).save(world.model)
    write_generated(world, images, captions)
    (root / "done").write_text("ok")
    return world


def write_generated(world: World, images: pd.DataFrame, captions: pd.DataFrame) -> None:
    test = captions[captions.split == "test"].sort_values("caption_id")
    rows = {
        ("perfect", "greedy"): [],
        ("perfect", "sample4"): [],
        ("generic", "greedy"): [],
        ("generic", "sample4"): [],
    }
    for image_id, group in test.groupby("image_id"):
        refs = group.text.tolist()
        specific = refs[1]  # the shapes world's second caption of an image is its specific one
        others = [t for t in refs if t != specific]
        rows["perfect", "greedy"].append((image_id, 0, specific))
        rows["generic", "greedy"].append((image_id, 0, GENERIC[0]))
        for s, text in enumerate([specific, *others][:SAMPLES]):
            rows["perfect", "sample4"].append((image_id, s, text))
        for s, text in enumerate(GENERIC[:SAMPLES]):
            rows["generic", "sample4"].append((image_id, s, text))
    for (run, decoding), items in rows.items():
        table = pd.DataFrame(items, columns=["image_id", "sample", "text"])
        table.insert(0, "run", run)
        table["logprob"] = 0.0
        write_table(table, world.generated(run, decoding), "generated")
