"""Time the evaluate stage on the shapes default split sizes: one run, greedy + 20 samples.

    PYTHONPATH=src python bench/bench_evaluate.py [--workdir DIR] [--test 200] [--samples 20]

Builds (once, cached in --workdir) the shapes world at the default sizes (2000 / 200 / 200)
through the real data stage, features of the tiny CLIP (random weights: the cost is the same
as a trained one's) through the real features stage, a captioner of the default architecture
(random weights) and generated captions drawn from the shapes grammar at mixed specificity
(1 greedy-like caption and `--samples` samples per test image). Then runs
`evaluate_decoding` for both decodings with the default `evaluate:` settings on one torch
thread, as the rule does, and prints wall and CPU seconds (own process and finished child
processes, i.e. the Java tools) per part, and the split between the Java metrics, the Python
n-gram metrics (BLEU, ROUGE-L, CIDEr-D, diversity, consensus), CLIP retrieval and the model's
self-retrieval.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

import numpy as np
import open_clip
import pandas as pd
import torch

from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.clip.load import load_clip
from distinctcap.clip.train import save_weights
from distinctcap.core.config import EvalSettings, load_schema, validate
from distinctcap.core.io import read_table, write_table
from distinctcap.data.prepare import prepare
from distinctcap.data.shapes import LEVELS, caption
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.evaluate.stage import EvalPaths, evaluate_decoding
from distinctcap.features.extract import FeatureSettings, extract_features

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def build(workdir: Path, n_test: int, samples: int) -> EvalPaths:
    """The world, features, captioner and generated tables (reused when already there)."""
    data, done = workdir / "data", workdir / f"done-{n_test}-{samples}"
    cfg = validate({"data": {"shapes": {"n_test": n_test}}}, load_schema(SCHEMA))
    paths = EvalPaths(
        str(workdir / "generated.parquet"),
        str(data / "images.parquet"),
        str(data / "captions.parquet"),
        str(data / "vocab.json"),
        str(workdir / "features" / "index.json"),
        str(workdir / "model.pt"),
    )
    if done.exists():
        return paths
    torch.manual_seed(0)
    prepare(
        cfg["data"],
        "skip",
        {
            "images": paths.images,
            "captions": paths.captions,
            "vocab": paths.vocab,
            "quarantine": str(data / "q.parquet"),
        },
    )
    clip_model, _, _ = open_clip.create_model_and_transforms("shapes-vit-tiny")
    save_weights(clip_model, workdir / "clip.pt")
    clip = load_clip("shapes-vit-tiny", str(workdir / "clip.pt"))
    images, captions = read_table(paths.images), read_table(paths.captions)
    extract_features(
        images,
        captions,
        clip,
        paths.features,
        workdir / "features" / "cache",
        FeatureSettings(workers=0),
        device=torch.device("cpu"),
    )
    arch = cfg["captioner"]
    arch = {k: v for k, v in arch.items() if k in CaptionerConfig.__dataclass_fields__}
    vocab = CaptionTokenizer.load(paths.vocab).vocab_size
    Captioner(CaptionerConfig(vocab_size=vocab, visual_dim=128, pooled_dim=128, **arch)).save(
        paths.model
    )
    write_generated(images[images.split == "test"], workdir, samples)
    done.write_text("ok")
    return paths


def write_generated(test: pd.DataFrame, workdir: Path, samples: int) -> None:
    """greedy: one caption per image, samples: `samples` captions at mixed specificity."""
    import json

    rng = np.random.default_rng(0)
    for name, n in (("greedy", 1), (f"sample{samples}", samples)):
        rows = []
        for image_id, scene in zip(test.image_id, test.scene, strict=True):
            scene = json.loads(scene)
            for s in range(n):
                level = LEVELS[int(rng.choice(4, p=[0.2, 0.2, 0.3, 0.3]))]
                rows.append(("bench", int(image_id), s, caption(scene, level, rng), 0.0))
        table = pd.DataFrame(rows, columns=["run", "image_id", "sample", "text", "logprob"])
        write_table(table, workdir / f"test-{name}.parquet", "generated")


def cpu_now() -> tuple[float, float]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/distinctcap-bench-evaluate")
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    paths = build(workdir, args.test, args.samples)
    torch.set_num_threads(1)  # the evaluate rule's default thread count
    settings = EvalSettings(seed=0, device="cpu")
    load = os.getloadavg()[0]
    groups = {"java": 0.0, "python": 0.0, "retrieval": 0.0, "self-retrieval": 0.0, "other": 0.0}
    wall0, (cpu0, child0) = time.perf_counter(), cpu_now()
    print("   wall s   own CPU s  child CPU s  decoding: part")
    for name in ("greedy", f"sample{args.samples}"):
        paths.generated = str(workdir / f"test-{name}.parquet")
        ev = evaluate_decoding(paths, "test", name, settings)
        for part, (wall, cpu, child) in ev.timings.items():
            print(f"  {wall:7.2f}  {cpu:10.2f}  {child:11.2f}  {name}: {part}")
            if part.startswith("text metrics"):
                groups["java"] += child
                groups["python"] += cpu
            elif part.startswith("CLIP"):
                groups["retrieval"] += cpu + child
            elif part.startswith("model"):
                groups["self-retrieval"] += cpu + child
            else:
                groups["other"] += cpu + child
        print(
            f"           {name}: cider {ev.row['cider']:.3f}, oracle_cider_20 "
            f"{ev.row['oracle_cider_20']:.3f}, skipped {sorted(ev.skipped)[:4]}..."
        )
    wall = time.perf_counter() - wall0
    cpu1, child1 = cpu_now()
    cpu = (cpu1 - cpu0) + (child1 - child0)
    print(
        f"\n{args.test} test images, greedy + {args.samples} samples; {os.cpu_count()} CPUs, "
        f"load average {load:.1f} at start"
    )
    print("CPU seconds by group (own + children), share of all:")
    for group, sec in groups.items():
        print(f"{group:>15}: {sec:7.2f} s  {100 * sec / max(cpu, 1e-9):5.1f} %")
    print(f"{'total':>15}: {cpu:7.2f} s CPU (incl. Java), {wall:.2f} s wall")


if __name__ == "__main__":
    main()
