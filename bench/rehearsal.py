"""Full-shape rehearsal of config.coco.yaml: every stage of the real pipeline on a synthetic COCO
with each training run's steps scaled down, and per stage its measured rate and the wall time
the full schedule would take at COCO's size.

    PYTHONPATH=src python bench/rehearsal.py [--images 123287] [--steps 200] [--device cuda]
        [--work rehearsal] [--out rehearsal.json] [--cores N] [--gpus 4] [--budget SECONDS]
        [--target FILE ...] [--small-models] [--runs RUN ...]

`--small-models` (issue 55) swaps the models for CPU-sized ones of the same output shapes: the
trainer CLIP a ViT-B-32 with one narrow layer a tower (the 7x7 + CLS grid of width 768, pooled
512, context 77), the judge a ViT-L-14 made the same way (pooled 768), each an open_clip
local-dir with its tag's preprocessing and settings (`clip.tag`), and a one-layer captioner of
width 64 (SMALL_CAPTIONER), 30 steps a run by default: every table, store and cache then has
COCO's real size on disk and in memory, so the data's sizes are measured, not the models'; the
synthetic COCO keeps COCO's 4,000 val and 1,000 test images at every size (synthcoco.split_counts
`cocos_val`), so decoding and evaluation do COCO's work at every size and only training data
grows.
`bench/scale_table.py` turns such runs at several sizes into docs/performance.md's "COCO's
shape on a CPU". Every job's log ends with its `usage:` line (distinctcap.core.usage), which
the JSON's `usage` holds per job; `disk` holds preflight's disk estimate beside what the run
left on disk; `data` the odd files synthcoco wrote beside the data stage's counts.
`--runs` builds only those runs (only_runs) and the runs they start from.

1. A synthetic COCO of `--images` images (distinctcap.data.synthcoco: real JPEGs at COCO's
   sizes, captions and splits in COCO's formats), served on 127.0.0.1 by the mirror server the
   download tests use (distinctcap.data.mirror); reused when `--work` already holds it.
2. A randomly initialised ViT-B-32 saved where open_clip finds the `openai` tag offline (the
   hub cache's snapshot of the tag's hf_hub repo), so `clip.pretrained: openai` resolves as on a
   real install.
3. Snakemake on the real Snakefile with `--configfile config.coco.yaml <overlay>`: the overlay
   points data.coco at the mirror (its md5s as checksums), sets the device, and gives every
   run `steps: --steps` (epochs off, patience off) with val_every scaled so that each run
   validates as often as its full schedule does.
4. From the per-job benchmark files Snakemake writes (distinctcap.report.times.read_benchmarks)
   and each run's summary.json (steps, train_seconds): per stage the rate and the
   extrapolated wall seconds at COCO's size. Scaling per stage (SCALING): training by steps
   (setup and validations once, train_seconds x full steps / steps); data and entropy stages
   by images; decode and evaluation by test images; the rest as measured. A job's start
   (Python with torch imported, measured once) is not scaled; whatever else is fixed in a job
   is, so small sizes overestimate; validations read min(val_captions, the split's) captions,
   so small sizes underestimate them. At COCO's size (on a GPU) nothing is scaled but steps.
5. The total on one device (jobs one after another) and on `--gpus` devices (jobs side by side
   as the DAG allows: list scheduling, longest chain first, as run_priorities orders them).

Prints one line per stage and writes the same as JSON (`--out`). `--target` limits the DAG to
files' jobs (e.g. results/runs/teacher_neg/model.pt: data, features, entropy, one run);
`--budget` stops Snakemake in time for the rehearsal to end within that many seconds and reports
the jobs that finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
COCO_CONFIG = REPO / "config.coco.yaml"
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
COCO_TRAIN_CAPTIONS = 591_753  # captions_train2017.json's annotations
COCO_TEST_IMAGES = 1_000  # mrnn: val2017 after UNKT's 4,000 val images
SCALING = {  # rule -> what its work grows with
    "prepare_data": "images",
    "extract_features": "images",
    "extract_captioner_features": "images",
    "retrieval_entropy": "images",  # its captions x images products are ~1e13 FLOP at COCO's
    "neighbours": "images",  # size (seconds on a GPU): at small sizes their cost is linear
    "split_entropy": "images",
    "entropy_report": "images",
    "train_run": "steps",
    "decode": "test images",
    "evaluate_gpu": "test images",
    "evaluate": "test images",
}
GPU_RULES = ("extract_features", "retrieval_entropy", "train_run", "decode", "evaluate_gpu")
TAG, ARCH = "openai", "ViT-B-32"
# what a job logs when it reuses a killed run's work (features.extract's shards, data.coco's
# extracted archives): its usage line then counts that last run, not the stage's whole cost
RESUMED = re.compile(r"[1-9][0-9]* reused, [0-9]+ to compute|not downloading it again")
REPORT_S = 15  # of --budget kept for the report after Snakemake (a job start is measured)


# ------------------------------------------------------------------------------ the inputs


def make_mirror(work: Path, n_images: int, workers: int, cocos_val: bool = False) -> dict:
    """The synthetic COCO under work/mirror (reused when its stamp says the same splits);
    `cocos_val`: COCO's 4,000 val and 1,000 test images at every size (synthcoco.split_counts)."""
    from distinctcap.data.synthcoco import split_counts, write_synthetic_coco

    mirror, stamp = work / "mirror", work / "mirror" / "stamp.json"
    counts = split_counts(n_images, cocos_val).__dict__
    if stamp.is_file() and json.loads(stamp.read_text())["counts"] == counts:
        return json.loads(stamp.read_text())
    shutil.rmtree(mirror, ignore_errors=True)
    start = time.perf_counter()
    md5, counts = write_synthetic_coco(mirror, n_images, ("mrnn",), workers, cocos_val)
    seconds = time.perf_counter() - start
    made = {
        "images": n_images,
        "md5": md5,
        "counts": counts.__dict__,
        "seconds": seconds,
        "workers": workers,
        "zip_bytes": {p.name: p.stat().st_size for p in mirror.rglob("*.zip")},
    }
    stamp.write_text(json.dumps(made))
    return made


def mirror_server(mirror: Path):
    """The mirror's server on the port its first run used (`port.json`), so that a resumed
    rehearsal gives prepare_data the same `data.coco.base_url`: a new port is a changed param,
    and Snakemake would redo the data stage and every stage after it. A port taken since then:
    a new one, with a warning."""
    from distinctcap.data.mirror import MirrorServer

    recorded = mirror / "port.json"
    port = json.loads(recorded.read_text())["port"] if recorded.is_file() else 0
    try:
        server = MirrorServer(mirror, port)
    except OSError as error:
        print(f"rehearsal: the mirror's port {port} is taken ({error}); the data stage reruns")
        server = MirrorServer(mirror)
    recorded.write_text(json.dumps({"port": int(server.url.rsplit(":", 1)[1])}))
    return server


def make_random_clip(hub: Path, arch: str = ARCH, tag: str = TAG, half: bool = False) -> Path:
    """A random `arch` (QuickGELU where `tag` uses it) as the `tag` weights in hub cache `hub`;
    `half`: stored in float16 (the judge's ViT-L-14: 0.9 GB instead of 1.7)."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    from distinctcap.core.hub import snapshot_folder

    cfg = open_clip.get_pretrained_cfg(arch, tag)
    weights = snapshot_folder(hub, cfg["hf_hub"].rstrip("/")) / "open_clip_model.safetensors"
    if not weights.is_file():
        torch.manual_seed(0)
        model = open_clip.create_model(arch, force_quick_gelu=bool(cfg.get("quick_gelu")))
        if half:
            model = model.half()
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    return weights


SMALL_VISION = {"layers": 1, "mlp_ratio": 1.0}  # the width and patch, hence the grid, kept
SMALL_TEXT = {"width": 64, "heads": 1, "layers": 1, "mlp_ratio": 1.0}  # projected to embed_dim
SMALL_CAPTIONER = {"width": 64, "enc_layers": 1, "dec_layers": 1, "heads": 2, "ffn": 128}


def small_clip_cfg(arch: str, quick_gelu: bool) -> dict:
    """open_clip's config of `arch` with one narrow layer per tower: the same image size,
    patch, vision width (the grid's), embedding size and context, so every output has the
    arch's shape (ViT-B-32: a 7x7 grid + CLS of width 768, pooled 512, context 77)."""
    import open_clip

    cfg = open_clip.get_model_config(arch)
    cfg["vision_cfg"].update(SMALL_VISION)
    cfg["text_cfg"].update(SMALL_TEXT)
    return {**cfg, "quick_gelu": quick_gelu}


def make_small_clip(folder: Path, arch: str = ARCH, tag: str = TAG) -> str:
    """A random small_clip_cfg(`arch`) as an open_clip local-dir (open_clip_config.json with
    the tag's preprocessing, and its weights); the `clip.pretrained` value that loads it."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    from distinctcap.core.logs import quiet_open_clip

    tag_cfg = open_clip.get_pretrained_cfg(arch, tag)
    folder.mkdir(parents=True, exist_ok=True)
    weights, config = folder / "open_clip_model.safetensors", folder / "open_clip_config.json"
    if not weights.is_file():
        cfg = small_clip_cfg(arch, bool(tag_cfg.get("quick_gelu")))
        preprocess = {k: tag_cfg[k] for k in ("mean", "std", "interpolation", "resize_mode")
                      if k in tag_cfg}  # fmt: skip
        config.write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": preprocess}, indent=1))
        torch.manual_seed(0)
        with quiet_open_clip(weights_follow=True):
            model = open_clip.create_model(f"local-dir:{folder}", load_weights=False)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    return f"local-dir:{folder}"


def small_models(work: Path, config: dict) -> dict:
    """The overlay's part for --small-models: the trainer CLIP and the judge as small local
    dirs of their archs with their tags' settings, and SMALL_CAPTIONER."""
    clip = config["clip"]
    models = work / "small-models"
    part = {
        "clip": {
            "pretrained": make_small_clip(models / clip["arch"], clip["arch"], clip["pretrained"]),
            "tag": clip["pretrained"],
        },
        "captioner": SMALL_CAPTIONER,
    }
    judge = config["evaluate"].get("judge")
    if judge and judge.get("pretrained", "train") != "train":
        local = make_small_clip(models / judge["arch"], judge["arch"], judge["pretrained"])
        part["evaluate"] = {"judge": {**judge, "pretrained": local, "tag": judge["pretrained"]}}
    return part


def make_random_clips(hub: Path, config: dict) -> list[Path]:
    """The trainer CLIP's stub and, where config.coco.yaml sets a judge CLIP by tag
    (evaluate.judge), the judge's: every weights file its preflight checks."""
    made = [make_random_clip(hub)]
    judge = config["evaluate"].get("judge")
    if judge and judge.get("pretrained", "train") != "train":
        made.append(make_random_clip(hub, judge["arch"], judge["pretrained"], half=True))
    return made


def load_coco() -> dict:
    """config.coco.yaml, validated (its defaults filled in)."""
    from distinctcap.config.check import load

    return load(COCO_CONFIG, SCHEMA)


def full_steps(config: dict) -> dict[str, int]:
    """Each run's optimiser steps in config.coco.yaml's schedule at COCO's size."""
    from distinctcap.config.rungraph import effective_run_config

    fraction = config["entropy"]["fraction"]
    captions = {
        "all": COCO_TRAIN_CAPTIONS,
        "D-": COCO_TRAIN_CAPTIONS * fraction,
        "D+": COCO_TRAIN_CAPTIONS * (1 - fraction),
    }
    steps = {}
    for name in config["runs"]:
        run = effective_run_config(config, name)
        train = run["train"]
        per_epoch = math.ceil(captions[run.get("data", "all")] / train["batch_size"])
        steps[name] = train["epochs"] * per_epoch if train.get("epochs") else train["steps"]
    return steps


def overlay(config: dict, url: str, mirror: dict, steps: int, device: str, work: Path) -> dict:
    """config.coco.yaml's changes for the rehearsal (see the module doc, 3)."""
    runs = {}
    for name, full in full_steps(config).items():
        every = config["runs"][name].get("train", {}).get("val_every", config["train"]["val_every"])
        val_every = max(1, round(every * steps / full)) if every else 0
        runs[name] = {
            "train": {
                "steps": steps,
                "epochs": None,
                "patience": 0,
                "val_every": val_every,
                "warmup_steps": min(steps // 10, 100),
            }
        }
    return {
        "device": device,
        "data": {
            "coco": {
                "download_dir": str(work / "resources/coco"),
                "base_url": url,
                "checksums": mirror["md5"],
                "keep_zips": False,
                "mrnn_val_images": mirror["counts"]["mrnn_val_images"],
            }
        },
        "runs": runs,
    }


# ------------------------------------------------------------------------------ the run


def run_snakemake(
    run_dir: Path,
    overlay_file: Path,
    cores: int,
    hub: Path,
    targets: list[str],
    budget: float | None,
    gpu: bool = False,
) -> tuple[int, float]:
    """Snakemake on the real Snakefile (with the local-gpu profile on a GPU: GPU jobs take
    turns on the card); (return code, seconds). On `budget` it is stopped."""
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(hub),
        "HF_HUB_OFFLINE": "1",
        "MPLBACKEND": "Agg",
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    snakemake = Path(sys.executable).parent / "snakemake"
    command = [
        str(snakemake) if snakemake.exists() else "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(run_dir),
        "--cores",
        str(cores),
        "--configfile",
        str(COCO_CONFIG),
        str(overlay_file),
        "--rerun-incomplete",
        *(["--workflow-profile", str(REPO / "workflow/profiles/local-gpu")] if gpu else []),
        *targets,
    ]
    unlock_after_a_kill(command, run_dir, env)
    log = (run_dir / "snakemake.log").open("w")
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        rc = process.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 15)
        rc = process.wait()
    return rc, time.perf_counter() - start


def resumed(log_file: Path) -> bool:
    """Whether the job's last run (its log after the previous `usage:` line: the logs
    append) reused a killed run's work (`RESUMED`)."""
    from distinctcap.core.usage import MARK

    runs = log_file.read_text(encoding="utf-8", errors="replace").split(MARK)
    return bool(RESUMED.search(runs[-2] if len(runs) > 1 else runs[-1]))


def usages(logs: Path) -> list[dict]:
    """Each job's `usage:` line (report.times.read_usages) and whether it was `resumed`."""
    from distinctcap.report.times import read_usages

    rows = read_usages(logs).to_dict("records")
    return [{**row, "resumed": resumed(logs / f"{row['log']}.log")} for row in rows]


def unlock_after_a_kill(command: list[str], run_dir: Path, env: dict) -> None:
    """A rehearsal killed mid-run (a session's end) leaves Snakemake's lock, and the next one
    would stop on it: WORK is the rehearsal's own, so its lock is lifted with one line."""
    locks = run_dir / ".snakemake" / "locks"
    if locks.is_dir() and any(locks.iterdir()):
        print(f"rehearsal: {run_dir} is locked by a run that was killed: snakemake --unlock")
        subprocess.run([*command, "--unlock"], cwd=REPO, env=env, capture_output=True, check=True)


# ------------------------------------------------------------------------------ the numbers


def data_report(run_dir: Path, n_images: int) -> dict:
    """The data stage's counts (results/data/counts.json: kept, skipped by reason, the
    decoded images' kinds) beside the odd files synthcoco wrote (ODD_FILES)."""
    from distinctcap.data.synthcoco import odd_counts

    counts = run_dir / "results/data/counts.json"
    return {
        "odd_files_written": odd_counts(n_images),
        "counts": json.loads(counts.read_text()) if counts.is_file() else None,
    }


def rehearsal_config(overlay_file: Path) -> dict:
    from distinctcap.config.check import load_schema, validate
    from distinctcap.core.configfile import read_configs

    return validate(read_configs([COCO_CONFIG, overlay_file]), load_schema(SCHEMA))


def planned_disk(overlay_file: Path) -> list[dict]:
    """preflight's disk estimate (runs.preflight.disk_plan) of the rehearsal's config, taken
    as rule preflight takes it: before the download, from the mirror's sizes."""
    from distinctcap.runs.preflight import disk_plan

    parts = disk_plan(rehearsal_config(overlay_file))
    return [{"part": p.name, "bytes": p.bytes, "how": p.how} for p in parts]


def first_plan(run_dir: Path, make) -> list[dict]:
    """preflight's disk plan as the rehearsal's first run made it (`make()`, kept in
    disk_plan.json): a resumed run's preflight plans only what is left, 0 bytes to download
    once the archives were extracted, which is not the estimate the disk is compared with."""
    kept = run_dir / "disk_plan.json"
    if not kept.is_file():
        kept.write_text(json.dumps(make()))
    return json.loads(kept.read_text())


def plan_at(plan: list[dict], overlay_file: Path, images: int) -> list[dict]:
    """`plan` with its per-image parts (features, runs) estimated for `images` images instead
    of the count preflight infers from the archives' bytes (exact for COCO's JPEGs, low for
    synthcoco's smaller ones)."""
    from distinctcap.runs.preflight import features_part, runs_part

    config = rehearsal_config(overlay_file)
    at = {"features": features_part(config, images), "runs": runs_part(config, images)}
    return [
        {"part": p["part"], "bytes": at[p["part"]].bytes, "how": at[p["part"]].how}
        if p["part"] in at
        else p
        for p in plan
    ]


def kept_images(run_dir: Path) -> int | None:
    """The images the data stage kept (results/data/counts.json), once it ran."""
    counts = run_dir / "results/data/counts.json"
    return json.loads(counts.read_text())["images"] if counts.is_file() else None


def du(*paths: Path) -> int:
    """Bytes the files under `paths` take on disk (allocated blocks, as du counts)."""
    total = 0
    for root in paths:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_blocks * 512
    return total


def disk_used(plan: list[dict], work: Path, run_dir: Path) -> list[dict]:
    """Each part of preflight's estimate beside what is on disk after the run: the download
    (the largest zip, deleted once extracted: the mirror's file, as its stamp recorded it, so
    the mirror may be removed once the data stage has run), its extraction, the features
    (shards, the grid cache and the judge's), the runs."""
    stamp = json.loads((work / "mirror/stamp.json").read_text())  # the mirror may be gone
    results = run_dir / "results"
    found = {
        "download": max(stamp.get("zip_bytes", {}).values(), default=None),
        "extracted": du(work / "resources/coco"),
        "features": du(results / "features", results / "judge"),
        "runs": du(results / "runs"),
    }
    return [{**p, "used_bytes": found.get(p["part"])} for p in plan]


def job_startup() -> float:
    """Seconds a job spends before its work: a Python with torch and the package imported
    (measured once, subtracted before scaling and added back unscaled)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import torch, distinctcap.core.jobs"],
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    return time.perf_counter() - start


def measured_startup(run_dir: Path, again: bool) -> float:
    """job_startup() measured after a run, kept beside it for --no-run reports of that run."""
    kept = run_dir / "job_startup.json"
    if again or not kept.is_file():
        kept.write_text(json.dumps(job_startup()))
    return json.loads(kept.read_text())


def stage_rows(
    run_dir: Path, n_images: int, test_images: int, steps_full: dict, startup: float
) -> list[dict]:
    """One row per finished job: rule, job, wall_s, its scaling, rate and extrapolated_s."""
    from distinctcap.report.times import read_benchmarks

    jobs = read_benchmarks(run_dir / "benchmarks")
    rows = []
    for job in jobs.itertuples(index=False):
        scaling = SCALING.get(job.rule, "fixed")
        row = {"rule": job.rule, "job": job.job, "wall_s": job.wall_s, "scaling": scaling}
        if scaling == "steps":
            row.update(train_row(run_dir, job.job.split("/", 1)[1], job.wall_s, steps_full))
        else:
            row.update(scaled_row(scaling, job.wall_s, n_images, test_images, startup))
        rows.append(row)
    return rows


def train_row(run_dir: Path, run: str, wall: float, steps_full: dict) -> dict:
    summary = json.loads((run_dir / "results/runs" / run / "summary.json").read_text())
    steps, seconds = summary["steps"], summary["train_seconds"]
    per_step = seconds / max(steps, 1)
    return {
        "run": run,
        "steps": steps,
        "full_steps": steps_full[run],
        "rate": steps / seconds if seconds else float("nan"),
        "unit": "steps/s",
        "extrapolated_s": (wall - seconds) + per_step * steps_full[run],
    }


def scaled_row(scaling: str, wall: float, n_images: int, test_images: int, startup: float) -> dict:
    """The rate of the job's work (its wall less `startup`) and that work scaled to COCO."""
    from distinctcap.data.synthcoco import COCO_IMAGES

    work = max(wall - startup, 1e-3)
    if scaling == "images":
        factor, rate, unit = COCO_IMAGES / n_images, n_images / work, "images/s"
    elif scaling == "test images":
        factor, rate, unit = COCO_TEST_IMAGES / test_images, test_images / work, "test images/s"
    else:
        return {"rate": float("nan"), "unit": "", "extrapolated_s": wall}
    return {"rate": rate, "unit": unit, "extrapolated_s": min(wall, startup) + work * factor}


def schedule(rows: list[dict], config: dict, devices: int) -> float:
    """Wall seconds on `devices` devices side by side: the stages before training one after
    another, then each run's chain (train_run, decode, evaluate_gpu, evaluate: counted on its
    device, conservatively) list-scheduled in the DAG's order (a run after its init, teacher
    or reference), the longest remaining chain first, as run_priorities orders them."""
    from distinctcap.config.rungraph import effective_run_config, run_dependencies

    per_run, upstream = {}, 0.0
    for row in rows:
        if row["rule"] in ("train_run", "decode", "evaluate_gpu", "evaluate", "run_card"):
            run = row["job"].split("/", 1)[1]
            per_run[run] = per_run.get(run, 0.0) + row["extrapolated_s"]
        else:
            upstream += row["extrapolated_s"]
    deps = {
        n: [d for d in run_dependencies(effective_run_config(config, n)) if d in per_run]
        for n in per_run
    }
    return upstream + list_schedule(per_run, deps, devices)


def list_schedule(durations: dict[str, float], deps: dict[str, list[str]], devices: int) -> float:
    """Makespan of jobs with dependencies (a DAG) on `devices` identical devices: greedy, the
    ready job with the longest chain of jobs waiting on it first."""
    chain: dict[str, float] = {}

    def tail(name: str) -> float:  # the job plus its longest chain of waiting jobs
        if name not in chain:
            waiting = [m for m in durations if name in deps[m]]
            chain[name] = durations[name] + max((tail(m) for m in waiting), default=0.0)
        return chain[name]

    free, finish, pending = [0.0] * devices, {}, set(durations)
    while pending:
        name = max((n for n in pending if all(d in finish for d in deps[n])), key=tail)
        slot = min(range(devices), key=free.__getitem__)
        start = max([free[slot], *(finish[d] for d in deps[name])])
        finish[name] = free[slot] = start + durations[name]
        pending.remove(name)
    return max(finish.values(), default=0.0)


def card() -> str:
    """nvidia-smi's name of GPU 0 (no torch import), else the CPU."""
    try:
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        names = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.split("\n")
        if names[0].strip():
            return names[0].strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return f"CPU only ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"


def totals(rows: list[dict], config: dict, devices: int) -> dict:
    """Extrapolated wall seconds of the whole schedule: one device (every job after the
    other) and `devices` side by side."""
    return {
        "one_device_s": sum(r["extrapolated_s"] for r in rows),
        "devices": devices,
        "devices_s": schedule(rows, config, devices),
    }


def no_nan(value):
    """`value` with every NaN as None (strict JSON)."""
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_nan(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def print_rows(result: dict) -> None:
    print(
        f"rehearsal: {result['images']} images, {result['steps']} steps per run, "
        f"{result['device']} ({result['card']}), snakemake rc {result['snakemake_rc']}"
    )
    for row in result["stages"]:
        rate = f"{row['rate']:.3g} {row['unit']}" if row["unit"] and row["rate"] else "-"
        print(
            f"  {row['job']:<32} {row['wall_s']:9.1f} s  {rate:<22} -> "
            f"{row['extrapolated_s'] / 3600:8.2f} h ({row['scaling']})"
        )
    total = result["totals"]
    print(
        f"rehearsal: total on one device {total['one_device_s'] / 3600:.2f} h, on "
        f"{total['devices']} side by side {total['devices_s'] / 3600:.2f} h"
    )


def main() -> None:
    from distinctcap.data.synthcoco import COCO_IMAGES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=COCO_IMAGES)
    parser.add_argument("--steps", type=int, help="optimiser steps of each run (200; 30 small)")
    parser.add_argument(
        "--small-models",
        action="store_true",
        help="CLIPs of the archs' output shapes with one narrow layer a tower and a small "
        "captioner: the data's sizes on a CPU (docs/performance.md, COCO's shape on a CPU)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--work", type=Path, default=Path("rehearsal"))
    parser.add_argument("--out", type=Path, help="the JSON (default: WORK/rehearsal.json)")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="JPEG encoders")
    parser.add_argument("--gpus", type=int, default=4, help="devices of the side-by-side total")
    parser.add_argument("--budget", type=float, help="seconds the whole rehearsal may take")
    parser.add_argument("--target", action="append", default=[], help="a file to make")
    parser.add_argument("--no-run", action="store_true", help="report WORK's finished jobs only")
    parser.add_argument(
        "--runs", nargs="+", help="build only these runs and those they start from (only_runs)"
    )
    parser.add_argument(
        "--feature-batch",
        type=int,
        help="clip.features.batch_size of the feature and judge jobs (a size whose batches are "
        "full: their memory is then the data's, not the batch's filling up)",
    )
    args = parser.parse_args()

    started, work = time.perf_counter(), args.work.resolve()
    run_dir, hub = work / "run", work / "hf" / "hub"
    run_dir.mkdir(parents=True, exist_ok=True)
    mirror = make_mirror(work, args.images, args.workers, cocos_val=args.small_models)
    print(
        f"rehearsal: synthetic COCO of {args.images} images in {mirror['seconds']:.1f} s "
        f"({args.images / mirror['seconds']:.0f} images/s, {mirror['workers']} workers)"
    )
    config = load_coco()
    steps = args.steps or (30 if args.small_models else 200)
    models = small_models(work, config) if args.small_models else make_random_clips(hub, config)
    rc, seconds, plan = None, None, None  # --no-run: the run's own are not known
    if not args.no_run:
        with mirror_server(work / "mirror") as server:
            overlay_file = run_dir / "rehearsal.yaml"
            extra = overlay(config, server.url, mirror, steps, args.device, work)
            if args.small_models:
                extra.update(models)
            if args.runs:
                extra["only_runs"] = args.runs
            if args.feature_batch:
                features = extra.setdefault("clip", {}).setdefault("features", {})
                features["batch_size"] = args.feature_batch
            overlay_file.write_text(yaml.safe_dump(extra))
            plan = first_plan(run_dir, lambda: planned_disk(overlay_file))
            rc, seconds = run_snakemake(
                run_dir,
                overlay_file,
                args.cores,
                hub,
                args.target,
                args.budget and args.budget - (time.perf_counter() - started) - REPORT_S,
                gpu=args.device.startswith("cuda"),
            )
        (run_dir / "snakemake_rc.json").write_text(json.dumps([rc, seconds]))
    elif (run_dir / "snakemake_rc.json").is_file():  # --no-run: the last run's
        rc, seconds = json.loads((run_dir / "snakemake_rc.json").read_text())
    counts, startup = mirror["counts"], measured_startup(run_dir, again=not args.no_run)
    rows = stage_rows(
        run_dir,
        args.images,
        counts["val2017"] - counts["mrnn_val_images"],
        full_steps(config),
        startup,
    )
    kept_plan = run_dir / "disk_plan.json"
    plan = plan or (json.loads(kept_plan.read_text()) if kept_plan.is_file() else [])
    kept = kept_images(run_dir)
    result = {
        "images": args.images,
        "steps": steps,
        "small_models": args.small_models,
        "device": args.device,
        "card": card(),
        "machine": f"{platform.node()}, {os.cpu_count()} cores",
        "snakemake_rc": rc,
        "snakemake_s": seconds,
        "job_startup_s": startup,
        "generate_s": mirror["seconds"],
        "generate_workers": mirror["workers"],
        "targets": args.target,
        "stages": rows,
        "totals": totals(rows, config, args.gpus),
        "usage": usages(run_dir / "logs"),
        "data": data_report(run_dir, args.images),
        "disk": disk_used(plan, work, run_dir),
        "kept_images": kept,
        "disk_at_kept_images": disk_used(
            plan_at(plan, run_dir / "rehearsal.yaml", kept) if kept and plan else [], work, run_dir
        ),
    }
    out = args.out or work / "rehearsal.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(no_nan(result), indent=1, allow_nan=False))
    print_rows(result)
    if rc:
        print(f"rehearsal: snakemake stopped (rc {rc}); log: {run_dir / 'snakemake.log'}")
    sys.exit(1 if rc else 0)


if __name__ == "__main__":
    main()
