"""The preflight job (rule preflight, first in the DAG, on the GPU rules' partition): what would
stop a run hours later is checked on the node itself before anything is downloaded or trained.
It reads the facts of the stages it checks (the COCO download plan, java for the COCO metrics,
the CLIP weights, the runs over seeds, the feature loader's /dev/shm), so it sits in runs/, the
top layer (ARCHITECTURE.md, Layers).

Each check is a function of the facts it reads (a driver string, a compute capability, sizes
in bytes), so each is tested on a CPU with a failing fact; it returns None or one line naming
the fix. `gather_and_check` reads the facts of this node and runs every check that applies:
the GPU checks and java only where the job holds a GPU (the GPU profiles give it one) and the
config does not say `device: cpu`, so elsewhere it imports no torch and takes a fraction of a
second (java is then checked on the submitting machine, Snakefile onstart).

The disk check compares free space with `disk_plan`: what this config will still write, in
parts stated in the job's log (download, extraction, features, CLIP, runs), each sized from
what is known: the archives on disk, their recorded sizes or a HEAD request to the (mirror)
server, the images they hold, the captioner's parameters.

Light at import (no torch): the GPU facts are read inside `gpu_lines`.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.settings import JudgeSettings
from distinctcap.features import shm

log = logging.getLogger(__name__)

GB, MB = 1e9, 1e6
# Estimates of what the stages write (the archives' sizes and COCO's image count: data.coco):
CAPTIONS_PER_IMAGE = 5
GRID = {"shapes": (4, 512, 64), "pretrained": (50, 768, 512)}  # grid tokens, width, pooled dim
TEXT_BYTES = 512 * 2  # float16 text embedding per caption
CLIP_BPE_VOCAB = 49_408  # the captioner's vocabulary: the CLIP BPE tokens its captions use
TRAINED_CLIP_BYTES = 18.5 * MB  # a shapes CLIP's weights (assets/clip/shapes-rn-tiny.pt)
CHECKPOINT_COPIES = 4  # a run's resume checkpoint: model, AdamW's two moments, the best model


# ---------------------------------------------------------------------------------------------
# The checks: facts in, None or one line naming the fix out


def version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def check_driver(torch_version: str, cuda: str | None, driver: str | None, need: str | None):
    """torch's CUDA build against the node's NVIDIA driver (`need`: the build's minimum)."""
    if cuda is None:
        return (
            f"torch {torch_version} is a CPU-only build: install the CUDA build pinned in "
            "requirements.txt on this node's environment"
        )
    if driver is None:
        return (
            f"no NVIDIA driver is loaded on this node (torch {torch_version} needs >= {need}): "
            "submit to a GPU partition (slurm_partition of the GPU rules) or set device: cpu"
        )
    if need and version(driver) < version(need):
        return (
            f"NVIDIA driver {driver} is older than {need}, which torch {torch_version} (CUDA "
            f"{cuda}) needs: ask for nodes with a newer driver (a constraint in the profile's "
            "slurm_extra) or install a torch built for an older CUDA"
        )
    return None


def check_capability(capability: tuple[int, int], arch_list: Iterable[str], gpu: str):
    """The GPU's compute capability against the build's kernels (torch.cuda.get_arch_list):
    an sm_XY of the same major and no newer minor runs, and compute_XY (PTX) at or below it."""
    major, minor = capability
    arches = list(arch_list)
    for arch in arches:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit():
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return None
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return None
    return (
        f"the GPU {gpu} (compute capability {major}.{minor}) has no kernels in this torch build "
        f"({' '.join(arches) or 'none'}): pick a newer GPU model (gpu_model in the profile) "
        "or install a torch built for it"
    )


def check_java(needed: bool, problem: str | None):
    """`java -version` on this node (`problem`: why it fails), when evaluation will need it."""
    if not needed or problem is None:
        return None
    return f"java on this node: {problem}"


def check_disk(free: float, need: float, where: str):
    if free >= need:
        return None
    return (
        f"{where} has {free / GB:.1f} GB free but the planned stages write about "
        f"{need / GB:.1f} GB: free space there or run in a folder on a larger disk "
        "(snakemake --directory)"
    )


# ---------------------------------------------------------------------------------------------
# Estimates from the config


@dataclass(frozen=True)
class DiskPart:
    """One part of the disk estimate: bytes, and what they were estimated from."""

    name: str
    bytes: float
    how: str = ""


def n_images(data: dict) -> int:
    shapes = data.get("shapes", {})
    return sum(int(shapes.get(k, 0)) for k in ("n_train", "n_val", "n_test"))


def coco_parts(block: dict) -> tuple[list[DiskPart], int]:
    """The zips still to download (all kept, or the largest at a time when `keep_zips` is
    false), their extraction (JPEGs are stored: as many bytes) and the images kept."""
    from distinctcap.data.coco import CocoConfig, plan_fetch, planned_images

    config = CocoConfig.from_dict(block)
    plans = plan_fetch(config)
    pending = [p.to_download for p in plans]
    download = sum(pending) if config.keep_zips else max(pending, default=0)
    extracted = sum(p.size or 0 for p in plans if p.to_extract)
    sources = sorted({p.source for p in plans}) or ["data.coco.root"]
    how = " and ".join(sources) + (" sizes" if plans else "")
    parts = [
        DiskPart("download", download, how if config.keep_zips else how + ", one zip at a time"),
        DiskPart("extracted", extracted, how),
    ]
    return parts, planned_images(config, plans)


def features_part(config: dict, images: int) -> DiskPart:
    """Grid (float16), pooled (float32) and text features; training maps one more copy of the
    grid and the pooled (features.read.cached)."""
    kind = "shapes" if config["clip"]["pretrained"] == "train" else "pretrained"
    tokens, width, pooled = GRID[kind]
    copies = 2 if config.get("runs") else 1
    per_image = (tokens * width * 2 + pooled * 4) * copies + CAPTIONS_PER_IMAGE * TEXT_BYTES
    total = images * per_image
    return DiskPart("features", total, f"{images:,} image(s)")


def clip_parts(config: dict) -> list[DiskPart]:
    """A trained CLIP's weights, and its resume checkpoint (weights and AdamW's moments) when
    one is written before the last epoch."""
    clip = config["clip"]
    if clip["pretrained"] != "train":
        return []
    every, epochs = clip["train"]["checkpoint_every"], clip["train"]["epochs"]
    copies = 1 + (3 if 0 < every < epochs else 0)
    return [DiskPart("clip", copies * TRAINED_CLIP_BYTES, f"{copies} x weights")]


def captioner_params(captioner: dict, vocab: int, visual: int, pooled: int) -> int:
    """The native captioner's parameters (captioner.model.Captioner), from its config."""
    w, ffn = captioner["width"], captioner["ffn"]
    attention, mlp = 4 * w * w + 4 * w, 2 * w * ffn + ffn + w
    encoder, decoder = attention + mlp + 4 * w, 2 * attention + mlp + 6 * w
    tables = visual + pooled + captioner["max_grid"] + vocab + captioner["max_len"]
    blocks = captioner["enc_layers"] * encoder + captioner["dec_layers"] * decoder
    return blocks + tables * w + 7 * w


def model_bytes(config: dict, images: int) -> tuple[float, float, str]:
    """A run's kept files (model.pt, and hf/ for transformers runs) and its resume checkpoint,
    with how they were sized: the native captioner's parameters at float32, its vocabulary at
    most the captions' words; a pre-trained captioner's weight files."""
    captioner = config.get("captioner", {})
    if captioner.get("kind") == "transformers":
        weights = captioner_weights_bytes(captioner["pretrained"])
        return 2 * weights, CHECKPOINT_COPIES * weights, "model.pt + hf/ of its weights"
    source = config["data"].get(config["data"].get("source"), {})
    words = images * CAPTIONS_PER_IMAGE * source.get("max_words", 20)
    _, visual, pooled = GRID["shapes" if config["clip"]["pretrained"] == "train" else "pretrained"]
    params = captioner_params(captioner, min(CLIP_BPE_VOCAB, 4 + words), visual, pooled)
    return 4 * params, CHECKPOINT_COPIES * 4 * params, f"{params / 1e6:.1f} M parameters"


def runs_part(config: dict, images: int) -> DiskPart:
    """Every trained model's files, and one resume checkpoint (removed when its run ends)."""
    from distinctcap.config.rungraph import seed_runs

    models = len(seed_runs(config)) if config.get("runs") else 0
    if not models:
        return DiskPart("runs", 0, "no runs")
    kept, checkpoint, how = model_bytes(config, images)
    return DiskPart(
        "runs",
        models * kept + checkpoint,
        f"{models} x {human(kept)} + a checkpoint of {human(checkpoint)}; {how}",
    )


def disk_plan(config: dict) -> list[DiskPart]:
    """What the planned stages write under the run folder and the COCO download folder."""
    data = config.get("data", {})
    if data.get("source") == "coco":
        parts, images = coco_parts(data.get("coco", {}))
    else:
        images = n_images(data)
        size = int(data.get("shapes", {}).get("image_size", 64))
        parts = [DiskPart("data", images * size * size * 3, f"{images:,} image(s)")]
    return [*parts, features_part(config, images), *clip_parts(config), runs_part(config, images)]


def planned_bytes(config: dict) -> float:
    return sum(part.bytes for part in disk_plan(config))


def human(size: float) -> str:
    for unit, scale in (("GB", GB), ("MB", MB), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} B"


def disk_line(parts: list[DiskPart]) -> str:
    """The estimate in one line, e.g. 'download 1.2 MB (server sizes) + ... = 20.3 MB'."""
    terms = [f"{p.name} {human(p.bytes)} ({p.how})" if p.how else p.name for p in parts]
    return " + ".join(terms) + f" = {human(sum(p.bytes for p in parts))}"


def download_folder(config: dict) -> str:
    """Where the disk check looks: the COCO download folder (when data is downloaded) or ."""
    coco = config["data"].get("coco", {})
    if config["data"].get("source") == "coco" and not coco.get("root"):
        return coco.get("download_dir", "resources/coco")
    return "."


def existing_parent(path: str) -> Path:
    here = Path(path).resolve()
    while not here.exists():
        here = here.parent
    return here


# ---------------------------------------------------------------------------------------------
# Reading this node's facts


def needs_gpu(config: dict, gpus: int) -> bool:
    """The job holds a GPU the config will use (`device: cpu` runs GPU jobs on the CPU)."""
    return gpus > 0 and str(config.get("device", "auto")) != "cpu"


def gpu_lines() -> list[str | None]:
    """The driver and capability checks on this node's facts (imports torch)."""
    import torch

    from distinctcap.core.devices import installed_driver, required_driver

    lines = [
        check_driver(torch.__version__, torch.version.cuda, installed_driver(), required_driver())
    ]
    if lines[0] is None and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            name = torch.cuda.get_device_name(i)
            cap = torch.cuda.get_device_capability(i)
            lines.append(check_capability(cap, torch.cuda.get_arch_list(), name))
    return lines


def java_problem() -> str | None:
    from distinctcap.evaluate.metrics.java import check_java as start_java

    try:
        start_java()
    except DistinctcapError as error:
        return str(error)
    return None


def shm_line(config: dict, cpus: int) -> str | None:
    """The feature loader's workers (clip.features.workers, auto: the job's CPUs less one on a
    GPU) against /dev/shm, for CLIP's 224 px images (the shapes world's are 64 px)."""
    features = config["clip"].get("features", {})
    workers = features.get("workers", "auto")
    workers = max(0, cpus - 1) if workers == "auto" else int(workers)
    size = 64 if config["clip"]["pretrained"] == "train" else 224
    batch = int(features.get("batch_size", 256)) * 3 * size * size
    return shm.check_shm(workers, batch, shm.LOADER_PREFETCH, shm.shm_free())


def clip_blocks(config: dict) -> list[tuple[str, dict]]:
    """(config key, block) of each CLIP the config reads: the trainer's (`clip`) and the judge
    (`evaluate.judge`, when one is set, as its JudgeSettings' fields); each block has arch,
    pretrained and maybe tag."""
    judge = JudgeSettings.from_config(config)
    return [("clip", config["clip"]), *([("evaluate.judge", asdict(judge))] if judge else [])]


def weights_lines(config: dict) -> list[str | None]:
    """The CLIP tags or files (the trainer's and the judge's) and the pre-trained captioner,
    without downloading."""
    lines: list[str | None] = []
    for key, clip in clip_blocks(config):
        if clip["pretrained"] != "train":
            lines.append(_weights_problem(partial(_clip_weights, clip), key))
    captioner = config.get("captioner", {})
    if captioner.get("kind") == "transformers":
        lines.append(_weights_problem(lambda: captioner_weights(captioner["pretrained"])))
    return lines


def _weights_problem(find: Callable[[], object], key: str = "clip") -> str | None:
    """None when `find()` finds its weights, else its error; a CLIP other than `clip` says
    which (distinctcap.clip.weights names the keys of the `clip` section)."""
    try:
        find()
    except DistinctcapError as error:
        return str(error) if key == "clip" else f"{key}: {error}"
    return None


def _clip_weights(clip: dict) -> None:
    import open_clip

    from distinctcap.clip.weights import resolve_weights, tag_file

    if open_clip.get_pretrained_cfg(clip["arch"], clip["pretrained"]):
        tag_file(clip["arch"], clip["pretrained"], download=False)
    else:  # a file or local-dir: resolving it reads nothing from the network
        resolve_weights(clip["arch"], clip["pretrained"], clip.get("tag"))


def captioner_weights(source: str) -> None:
    """A save_pretrained folder, or a hub id whose cached snapshot holds weights (read by
    huggingface_hub alone: transformers takes seconds to import)."""
    from distinctcap.core.hub import hub_cache

    if Path(source).expanduser().is_dir():
        return
    if not weight_files(captioner_folder(source)):
        raise DistinctcapError(
            f"captioner.pretrained = {source!r}: no weights of it in the hub cache {hub_cache()}: "
            "run `distinctcap fetch` where the network is reachable, or give a save_pretrained "
            "folder"
        )


def captioner_folder(source: str) -> Path | None:
    """The save_pretrained folder `source`, or its cached hub snapshot (None: not cached)."""
    from huggingface_hub import snapshot_download

    if Path(source).expanduser().is_dir():
        return Path(source).expanduser()
    try:
        return Path(snapshot_download(source, local_files_only=True))
    except (OSError, ValueError):
        return None


def weight_files(folder: Path | None) -> list[Path]:
    if folder is None:
        return []
    return [*folder.glob("*.safetensors"), *folder.glob("*.bin")]


def captioner_weights_bytes(source: str) -> float:
    """The pre-trained captioner's weight files (0 where none are found: weights_lines says)."""
    return float(sum(f.stat().st_size for f in weight_files(captioner_folder(source))))


def free_bytes(folder: str) -> float:
    """Free bytes on the disk that holds `folder` (or its nearest existing parent)."""
    return shutil.disk_usage(existing_parent(folder)).free


def disk_problem(config: dict) -> str | None:
    """The estimate's parts in the log, then free space against their sum."""
    folder, parts = download_folder(config), disk_plan(config)
    log.info("preflight: disk: %s", disk_line(parts))
    return check_disk(free_bytes(folder), sum(p.bytes for p in parts), folder)


def gather_and_check(config: dict, gpus: int = 0, cpus: int = 1) -> tuple[list[str], list[str]]:
    """(failures, warnings) of every check that applies to this config on this node."""
    failures: list[str | None] = []
    if needs_gpu(config, gpus):
        failures += gpu_lines()
        failures.append(check_java(bool(config.get("runs")), java_problem()))
    failures.append(disk_problem(config))
    failures += weights_lines(config)
    warnings = [shm_line(config, cpus)] if needs_gpu(config, gpus) else []
    return [f for f in failures if f], [w for w in warnings if w]


def run_preflight(config: dict, report: str, gpus: int = 0, cpus: int = 1) -> None:
    """Write `report` (one line per finding, 'ok' when none) or stop with every failure."""
    from distinctcap.core.io import atomic_path

    failures, warnings = gather_and_check(config, gpus, cpus)
    for line in warnings:
        log.warning("preflight: %s", line)
    for line in failures:
        log.error("preflight: %s", line)
    if failures:
        raise DistinctcapError(
            f"preflight: {len(failures)} check(s) failed, nothing else ran: " + " | ".join(failures)
        )
    with atomic_path(report) as tmp:
        Path(tmp).write_text("".join(f"warning: {w}\n" for w in warnings) or "ok\n")
