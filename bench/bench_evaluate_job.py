"""One evaluate job before and after issue 46 (models and features read once per job).

The world is tests/evaluate_world.py's (the shapes world, the tiny CLIP's features, a
random-init captioner) plus a judge CLIP's pooled features (shapes-rn-judge, random init, as
tests/test_judge.py) and one run's generated captions for 3 decodings (greedy, beam3,
sample20) x 2 splits (test, val): the shapes default's evaluations of one run. Both codes run
`evaluate_stage` on the same inputs in this one process, the torch part computed in the job
(no evaluate_gpu job), one COCO tools session each:

    old   evaluate/stage.py as of --old-ref (every decoding loads the CLIPs, the captioner and
          the features again), loaded from git as a module
    new   distinctcap.evaluate.stage (one evaluate.loaded.JobLoads for the job)

after one unmeasured run of each (imports, first allocations). Prints wall and CPU seconds
(this process and its finished children: the Java tools) of each of --repeats rounds, the
ratios new / old of the medians, and checks that both wrote the same metrics rows and
per-image tables. Run: PYTHONPATH=src python bench/bench_evaluate_job.py [--workdir DIR].
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import open_clip
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from evaluate_world import build  # noqa: E402

from distinctcap.clip.load import load_clip  # noqa: E402
from distinctcap.core.io import read_table, write_table  # noqa: E402
from distinctcap.core.settings import EvalSettings, metric_block  # noqa: E402
from distinctcap.evaluate import stage as new_stage  # noqa: E402
from distinctcap.features.extract import FeatureSettings  # noqa: E402
from distinctcap.features.pooled import extract_pooled  # noqa: E402
from distinctcap.train.clip import save_weights  # noqa: E402

OLD_REF = "f1be225"  # main before issue 46's evaluate change
SPLITS, DECODINGS, SAMPLES = ("test", "val"), ("greedy", "beam3", "sample20"), 20
SETTINGS = EvalSettings(oracle_ns=[2, 4, 20], curve_ns=[1, 2, 4, 20], best_of=2,
                        consensus_neighbours=2, hard_pool=1, self_retrieval_pool=6)  # fmt: skip


def old_stage(ref: str):
    """evaluate/stage.py at `ref` as a module (its imports resolve to today's package)."""
    blob = f"{ref}:src/distinctcap/evaluate/stage.py"
    git = ["git", "-C", str(ROOT), "show", blob]
    source = subprocess.run(git, check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("distinctcap.evaluate._old_stage", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    exec(compile(source, f"{ref}:evaluate/stage.py", "exec"), module.__dict__)
    return module


def write_generated(world, root: Path) -> list[str]:
    """One run's captions of every (split, decoding): each image's references in turn."""
    captions = read_table(world.captions)
    paths = []
    for split in SPLITS:
        refs = captions[captions.split == split].sort_values("caption_id")
        groups = refs.groupby("image_id").text.agg(list)
        for dec in DECODINGS:
            n = SAMPLES if dec.startswith("sample") else 1
            rows = [("job", int(i), s, texts[(s + (dec == "beam3")) % len(texts)], 0.0)
                    for i, texts in groups.items() for s in range(n)]  # fmt: skip
            table = pd.DataFrame(rows, columns=["run", "image_id", "sample", "text", "logprob"])
            path = root / "generated" / f"{split}-{dec}.parquet"
            write_table(table, path, "generated")
            paths.append(str(path))
    return paths


def judge_features(world, root: Path) -> str:
    path = root / "judge.parquet"
    if not path.is_file():
        torch.manual_seed(0)
        model, _, _ = open_clip.create_model_and_transforms("shapes-rn-judge")
        save_weights(model, root / "judge.pt")
        clip = load_clip("shapes-rn-judge", str(root / "judge.pt"))
        extract_pooled(read_table(world.images), clip, path, FeatureSettings(workers=0))
    return str(path)


def cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run_job(stage, inputs: dict, out: Path) -> tuple[float, float]:
    keys = [f"{s}-{d}" for s in SPLITS for d in DECODINGS]
    outputs = {
        "metrics": [str(out / f"{k}.parquet") for k in keys],
        "curve": [str(out / f"{k}.csv") for k in keys],
        "per_image": [str(out / f"{k}-per_image.parquet") for k in keys],
        "work": str(out / "work.json"),
    }
    block = {**metric_block(vars(SETTINGS)), "device": "cpu"}
    evaluations = [(s, d) for s in SPLITS for d in DECODINGS]
    wall, cpu = time.perf_counter(), cpu_seconds()
    stage.evaluate_stage(inputs, outputs, evaluations, block, cache_dir=str(out / "cache"))
    return time.perf_counter() - wall, cpu_seconds() - cpu


def same_outputs(a: Path, b: Path) -> None:
    for path in sorted(a.glob("*.parquet")):
        pd.testing.assert_frame_equal(read_table(path), read_table(b / path.name), check_exact=True)
    assert (a / "work.json").read_text() == (b / "work.json").read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_evaluate_job"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--old-ref", default=OLD_REF)
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = build(args.workdir / "world")
    inputs = {name: getattr(world, name) for name in ("images", "captions", "vocab", "features",
                                                       "model")}  # fmt: skip
    inputs |= {"generated": write_generated(world, args.workdir),
               "judge_features": judge_features(world, args.workdir)}  # fmt: skip
    codes = {"old": old_stage(args.old_ref), "new": new_stage}
    times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    for name, code in codes.items():  # warm-up: imports, first allocations
        run_job(code, inputs, args.workdir / f"warm-{name}")
    for r in range(args.repeats):
        for name, code in codes.items():
            times[name].append(run_job(code, inputs, args.workdir / f"{name}-{r}"))
            print(f"round {r} {name}: {times[name][-1][0]:.2f} s wall, "
                  f"{times[name][-1][1]:.2f} s CPU", flush=True)  # fmt: skip
    same_outputs(args.workdir / "old-0", args.workdir / "new-0")
    med = {n: np.array([[statistics.median(c) for c in zip(*t, strict=True)]])[0]
           for n, t in times.items()}  # fmt: skip
    print(f"median old: {med['old'][0]:.2f} s wall, {med['old'][1]:.2f} s CPU; "
          f"new: {med['new'][0]:.2f} s wall, {med['new'][1]:.2f} s CPU")
    print(f"ratio new/old: wall {med['new'][0] / med['old'][0]:.3f}, "
          f"CPU {med['new'][1] / med['old'][1]:.3f} (identical outputs)")


if __name__ == "__main__":
    main()
