"""Scale harness: peak RSS and time of each feature-consuming stage as the dataset grows.

    PYTHONPATH=src nice -n 10 python bench/bench_scale.py [--sizes 10000,40000,118287]
        [--root scale-store] [--device cpu|cuda] [--keep] [--test-images 1000]
        [--stages decode,evaluate,train,entropy,neighbours] [--train-steps 20] [--max-len 0]
        [--store-grid-cache]

For each size N it writes a synthetic store in the real on-disk format (`bench/synthetic_store.py`:
the features module's own shard writers) at COCO shape: grid 49 x 768 float16 plus pooled 512
per image, 5 captions per image with their text embeddings, images / captions tables with
splits (test fixed at 1,000 images so decode and evaluate do the same work at every N; val in
COCO's proportion, 4,000 per 118,287). Then it runs each stage's real function in its own
process (`--stage`) and reads that child's peak RSS from os.wait4:

    decode      decode.decode_run: greedy, the 1,000 test images, a random-init COCO-size
                captioner (config.coco.yaml's `captioner`) saved with Captioner.save
    evaluate    the feature-dependent path of evaluate_decoding on 1,000 images x 5 samples:
                read_generated, the captions by image, the consensus neighbours (evaluate.loaded
                JobLoads.training_neighbours: the training features a block at a time) and
                evaluate.device.model_metrics (self-retrieval: ImageFeatures.load of the 1,000
                images; pool 2, since its compute does not depend on N). The text, CLIP and GPT-2
                metrics need Java, a real CLIP and GPT-2 weights and read no image features.
    train       train.train, 20 steps (--train-steps) of config.coco.yaml's reference run
                (batch 50; 100 validation captions at the end, no checkpoints); the first
                train job of a store also builds the grid cache (features.grid_cache), included,
                unless --store-grid-cache had the store write it
    entropy     entropy.score_captions (the retrieval_entropy rule): all train captions over
                all train images
    neighbours  neighbours.build_table (top 1%)

Each stage's line (peak RSS MiB, seconds) is printed as soon as it ends, after the child's line
naming the third-party modules it imported, so a run its time limit stops keeps what finished.
The last line is the ratio of the largest size's peak RSS to the smallest's per stage.
Peak RSS includes the file pages a child touched (the mapped grid cache, for training).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

STAGES = ("decode", "evaluate", "train", "entropy", "neighbours")
# Modules a stage imports that a bare GPU machine may lack and that cannot be carried:
# distinctcap.evaluate.stage imports evaluate.metrics.coco, so pycocoevalcap, at import time,
# although this harness's evaluate path computes none of its metrics and starts no Java.
STAGE_NEEDS = {"evaluate": ("pycocoevalcap",)}
REPO = Path(__file__).resolve().parent.parent
DEVICE = os.environ.get("BENCH_DEVICE", "cpu")  # the parent's --device, for its children


# ---------------------------------------------------------------- the stages (child processes)


def stage_device():
    """The torch.device of DEVICE, resolved once in a stage's child process (as a job's start
    does) for the stage functions that take one."""
    from distinctcap.core.devices import resolve_device

    return resolve_device(DEVICE)


def coco_config() -> dict:
    from distinctcap.config.check import load

    return load(REPO / "config.coco.yaml", REPO / "workflow/schemas/config.schema.yaml")


def stage_decode(store: Path, work: Path, max_len: int = 0) -> None:
    from distinctcap.captioner.model import Captioner, CaptionerConfig
    from distinctcap.data.tokenizer import CaptionTokenizer
    from distinctcap.evaluate.decode import decode_run

    model = work / "model.pt"
    if not model.is_file():
        import torch

        torch.manual_seed(0)
        vocab = CaptionTokenizer.load(store / "data/vocab.json").vocab_size
        captioner = coco_config()["captioner"]
        if max_len:  # a random model never stops early: time is ~ max_len, memory is not
            captioner["max_len"] = max_len
        cfg = CaptionerConfig(vocab_size=vocab, visual_dim=768, pooled_dim=512, **captioner)
        Captioner(cfg).save(model)
    decode_run(
        model,
        store / "features/index.json",
        store / "data/images.parquet",
        store / "data/vocab.json",
        work / "generated.parquet",
        "scale",
        "test",
        {"kind": "greedy"},
        device=stage_device(),
    )


def stage_evaluate(store: Path, work: Path) -> None:
    import numpy as np
    import pandas as pd

    from distinctcap.core.io import read_table, write_table
    from distinctcap.core.settings import EvalSettings
    from distinctcap.evaluate.device import model_metrics
    from distinctcap.evaluate.inputs import EvalPaths, read_generated
    from distinctcap.evaluate.loaded import JobLoads, captions_by_image

    generated = work / "generated5.parquet"
    if not generated.is_file():  # 5 samples per test image (the decode stage wrote 1)
        images = read_table(store / "data/images.parquet", "images")
        test = np.sort(images.image_id[images.split == "test"].to_numpy())
        rows = [("scale", int(i), s, f"synthetic sample {s}", -1.0) for i in test for s in range(5)]
        columns = ["run", "image_id", "sample", "text", "logprob"]
        write_table(pd.DataFrame(rows, columns=columns), generated, "generated")
    paths = EvalPaths(
        generated=str(generated),
        images=str(store / "data/images.parquet"),
        captions=str(store / "data/captions.parquet"),
        vocab=str(store / "data/vocab.json"),
        features=str(store / "features/index.json"),
        model=str(work / "model.pt"),
    )
    settings = EvalSettings(self_retrieval_pool=2, device=DEVICE)
    _, samples = read_generated(paths.generated)
    images, captions = read_table(paths.images), read_table(paths.captions)
    ids = list(samples)
    captions_by_image(captions[captions.split == "test"], ids)
    train_ids = images[images.split == "train"].image_id.astype(int).tolist()
    train_refs = captions_by_image(captions[captions.split == "train"], train_ids)
    JobLoads().training_neighbours(paths.features, ids, train_refs, settings.consensus_neighbours)
    model_metrics(paths, ids, [samples[i][0] for i in ids], settings)


def stage_train(store: Path, work: Path, steps: int = 20) -> None:
    from distinctcap.config.rungraph import effective_run_config
    from distinctcap.core.devices import resolve_device
    from distinctcap.core.run import RunConfig, RunPaths
    from distinctcap.train.trainer import train

    cfg = effective_run_config(coco_config(), "reference")
    # epochs off: config.coco.yaml states its run length in epochs, which would override
    # `steps` (15 epochs: 1,800 steps at 1,200 images, 177,000 at 118,287)
    cfg["train"].update(
        steps=steps, epochs=None, warmup_epochs=None, warmup_steps=2, val_every=0,
        val_captions=100, checkpoint_every=0,
    )
    inputs = {
        "captions": str(store / "data/captions.parquet"),
        "vocab": str(store / "data/vocab.json"),
        "features": str(store / "features/index.json"),
    }
    paths = RunPaths(inputs, work / "run")
    train(RunConfig.from_effective(cfg), paths, resolve_device(DEVICE))


def stage_entropy(store: Path, work: Path) -> None:
    from distinctcap.core.io import read_table, write_table
    from distinctcap.features.entropy import score_captions

    captions = read_table(store / "data/captions.parquet", "captions")
    scores = score_captions(store / "features/index.json", captions, device=stage_device())
    write_table(scores, work / "scores.parquet")


def stage_neighbours(store: Path, work: Path) -> None:
    from distinctcap.features.neighbours import build_table

    build_table(
        store / "features/index.json",
        store / "data/images.parquet",
        work / "neighbours.parquet",
        pct=1.0,
        device=stage_device(),
    )


def third_party_modules() -> list[str]:
    """The top-level modules outside the standard library and distinctcap that this process
    has imported: what a stage needs installed on a bare GPU machine (issue 42: it has no Java,
    pycocoevalcap, jsonschema, snakemake or open_clip unless carried)."""
    local = set(sys.stdlib_module_names) | {"distinctcap", "synthetic_store", "__main__"}
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if "." not in name
        and name not in local
        and not name.startswith("_")
        and (getattr(module, "__file__", None) or hasattr(module, "__path__"))  # not built in
    )


# ---------------------------------------------------------------- the harness (parent)


def child_env() -> dict:
    """The environment with this checkout's src first on PYTHONPATH (and the caller's after)."""
    path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def missing_modules(stage: str) -> list[str]:
    """The modules of STAGE_NEEDS[stage] this Python cannot import: the stage is skipped,
    with a line saying so, instead of failing the run after the GPU minutes went into it."""
    return [m for m in STAGE_NEEDS.get(stage, ()) if importlib.util.find_spec(m) is None]


def run_child(stage: str, store: Path, work: Path, args) -> tuple[float, float]:
    """(peak RSS MiB, seconds) of one stage in its own process."""
    cmd = [sys.executable, __file__, "--stage", stage, "--store", str(store), "--work", str(work),
           "--train-steps", str(args.train_steps), "--max-len", str(args.max_len)]
    start = time.perf_counter()
    child = subprocess.Popen(cmd, env=child_env())
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if child.returncode:
        raise SystemExit(f"stage {stage} at {store} failed ({child.returncode})")
    return usage.ru_maxrss / 1024, seconds  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,40000,118287")
    parser.add_argument("--root", default="scale-store", help="where the stores go (~20 GB)")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--keep", action="store_true", help="keep each store after its run")
    parser.add_argument("--train-steps", type=int, default=20, help="optimiser steps (train)")
    parser.add_argument(
        "--max-len", type=int, default=0, help="decode's captioner max_len (0: the config's)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the stages compute")
    parser.add_argument(
        "--test-images", type=int, default=1000,
        help="test images: what decode and evaluate work on (fewer: a quick CPU check)",
    )
    parser.add_argument(
        "--store-grid-cache", action="store_true",
        help="the store writes training's grid cache (train then does not build it: its time "
        "drops by the re-decode of every grid, its peak RSS stays)",
    )
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.stage:  # a child: one stage, one process
        import faulthandler
        import signal

        import torch

        faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: where is a slow stage?

        torch.set_num_threads(os.cpu_count() or 1)
        args.work.mkdir(parents=True, exist_ok=True)
        extra = {"train": {"steps": args.train_steps}, "decode": {"max_len": args.max_len}}
        extra = extra.get(args.stage, {})
        globals()[f"stage_{args.stage}"](args.store, args.work, **extra)
        print(f"  {args.stage:<10} imported {' '.join(third_party_modules())}", flush=True)
        return

    os.environ["BENCH_DEVICE"] = args.device
    sizes = [int(s) for s in args.sizes.split(",")]
    stages = [s for s in args.stages.split(",") if s]
    if "evaluate" in stages and "decode" not in stages:
        raise SystemExit("evaluate uses the model the decode stage saves: run decode too")
    results: dict[str, dict[int, tuple[float, float]]] = {s: {} for s in stages}
    for n in sizes:
        store = Path(args.root) / f"n{n}"
        shutil.rmtree(store, ignore_errors=True)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c",
             f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
             "from synthetic_store import write_store; "
             f"write_store({str(store / 'store')!r}, {n}, test={args.test_images}, "
             f"grid_cache={args.store_grid_cache})"],
            env=child_env(), check=True,
        )
        seconds = time.perf_counter() - start
        size = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) / 2**30
        print(f"N={n}: store {size:.2f} GiB written in {seconds:.1f} s "
              f"({size / seconds:.2f} GiB/s)", flush=True)
        for stage in stages:
            if missing_modules(stage):
                print(f"  {stage:<10} skipped: no {', '.join(missing_modules(stage))} "
                      "(imported by the stage's modules; no Java metric runs)", flush=True)
                continue
            rss, seconds = run_child(stage, store / "store", store / "work", args)
            results[stage][n] = rss, seconds
            print(f"  {stage:<10} peak RSS {rss:8.0f} MiB  {seconds:7.1f} s", flush=True)
        if not args.keep:
            shutil.rmtree(store)

    print()
    print("| stage | " + " | ".join(f"N={n:,} RSS MiB / s" for n in sizes) + " | RSS ratio |")
    print("|---|" + "---|" * (len(sizes) + 1))
    ratios = {}
    for stage in [s for s in stages if results[s]]:
        cells = [f"{results[stage][n][0]:.0f} / {results[stage][n][1]:.0f}" for n in sizes]
        ratios[stage] = results[stage][sizes[-1]][0] / results[stage][sizes[0]][0]
        print(f"| {stage} | " + " | ".join(cells) + f" | {ratios[stage]:.2f} |")
    print()
    print(
        "peak RSS ratio largest/smallest: "
        + ", ".join(f"{s} {ratios[s]:.2f}" for s in STAGES if s in ratios)
    )


if __name__ == "__main__":
    main()
