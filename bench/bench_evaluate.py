"""Time the evaluate stage on the shapes default split sizes: one run, greedy + 20 samples;
or, with --coco, one run's text metrics at COCO size, today's serial code against this one.

    PYTHONPATH=src python bench/bench_evaluate.py [--workdir DIR] [--test 200] [--samples 20]
    PYTHONPATH=src python bench/bench_evaluate.py --coco [--scale 0.25] [--workers N]

--coco (bench/coco_evaluate.py): 1,000 test images x 5 references, greedy, greedy_norepeat,
beam3 and sample100, 591,735 training references (all times --scale), scored by the stage's
`text_metrics` in one COCO tools session, first by the code of --old-ref (the serial path
before issue 31, extracted with `git archive`) and then by this checkout on --workers cores
with an empty token cache; each in its own process, one after the other. It prints each
part's wall and CPU seconds (own + children: Java, forked workers) for both, the job's wall
ratio, the load average, and whether every metric value is identical.

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
from distinctcap.config.check import load_schema, validate
from distinctcap.core.io import read_table, write_table
from distinctcap.core.settings import EvalSettings
from distinctcap.data.prepare import prepare
from distinctcap.data.shapes import LEVELS, caption
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.evaluate.inputs import EvalPaths
from distinctcap.evaluate.stage import evaluate_decoding
from distinctcap.features.extract import FeatureSettings, extract_features
from distinctcap.train.clip import save_weights

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
OLD_REF = "7948108"  # main before issue 31: one core, references tokenised per decoding


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
    parser.add_argument("--coco", action="store_true", help="the COCO-size text metrics")
    parser.add_argument("--scale", type=float, default=1.0, help="--coco: share of COCO size")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="--coco: cores")
    parser.add_argument("--old-ref", default=OLD_REF, help="--coco: the serial code's commit")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    if args.coco:
        coco_benchmark(workdir, args.scale, args.workers, args.old_ref)
        return
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


# ---------------------------------------------------------------- --coco


def coco_benchmark(workdir: Path, scale: float, workers: int, old_ref: str) -> None:
    """Old (the serial code of `old_ref`) against new (this checkout) on the same inputs."""
    import json
    import math
    import shutil
    import subprocess
    import sys

    from coco_evaluate import PARTS, make_data

    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / f"coco-{scale:g}.pkl"
    if not data.exists():
        print(f"writing the COCO-like inputs at scale {scale:g} to {data} ...", flush=True)
        make_data(data, scale)
    old_tree = workdir / f"code-{old_ref}"
    if not old_tree.exists():
        old_tree.mkdir()
        archive = subprocess.run(["git", "archive", old_ref], cwd=ROOT, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive.stdout, check=True)
    results, loads = {}, []
    for name, src in (("old", old_tree / "src"), ("new", ROOT / "src")):
        out = workdir / name / "result.json"
        shutil.rmtree(out.parent, ignore_errors=True)  # an empty token cache: a first job
        out.parent.mkdir()
        loads.append(os.getloadavg())
        print(f"{name}: {src} on {workers if name == 'new' else 1} core(s) ...", flush=True)
        env = {**os.environ, "PYTHONPATH": str(src)}
        script = Path(__file__).with_name("coco_evaluate.py")
        cmd = [sys.executable, str(script), "child", str(data), str(workers), str(out)]
        subprocess.run(cmd, env=env, check=True)
        results[name] = json.loads(out.read_text())
    loads.append(os.getloadavg())
    old, new = results["old"], results["new"]
    rows = [row for _, _, row in PARTS] + ["Java servers (CPU at their close)"]
    print(f"\n{'part':<36} {'old wall s':>10} {'old CPU s':>10} {'new wall s':>10} "
          f"{'new CPU s':>10}")
    for row in rows:
        o, n = old["timings"].get(row, [0, 0]), new["timings"].get(row, [0, 0])
        print(f"{row:<36} {o[0]:10.1f} {o[1]:10.1f} {n[0]:10.1f} {n[1]:10.1f}")
    print(f"{'job (all four decodings)':<36} {old['wall']:10.1f} {old['cpu']:10.1f} "
          f"{new['wall']:10.1f} {new['cpu']:10.1f}")
    differ = [
        (d, k)
        for d, values in old["values"].items()
        for k, v in values.items()
        if not (v == new["values"][d][k] or (math.isnan(v) and math.isnan(new["values"][d][k])))
    ]
    count = sum(len(v) for v in old["values"].values())
    print(
        f"\nscale {scale:g}: {round(1000 * scale)} test images, {round(118287 * scale)} training "
        f"images x 5 captions; new on {workers} workers, {os.cpu_count()} CPUs"
    )
    print("load average (1, 5, 15 min) before old, before new, after: "
          + "; ".join(", ".join(f"{x:.2f}" for x in load) for load in loads))
    print(f"job wall old / new: {old['wall'] / new['wall']:.2f}x "
          f"(CPU {old['cpu'] / new['cpu']:.2f}x)")
    print(f"metric values identical: {count - len(differ)} of {count}"
          + (f"; DIFFERENT: {differ[:10]}" if differ else ""))


if __name__ == "__main__":
    main()
