"""Which torch device a stage runs on: `resolve_device` turns a `device:` setting (config
`device`, `caption --device`) into a torch.device, and `job_device` does so once at the start of
every job that may use a GPU (through distinctcap.core.jobs.start_job); the stage functions take
that torch.device and never resolve it again. It imports only torch and the project's error
type, so any module can use it without an import cycle.

Devices are explicit:
- a job whose rule holds GPUs (snakemake resource `gpu` > 0, set by the GPU profiles) or whose
  config says `device: cuda` stops at its start, before it writes anything, when CUDA is
  unusable; the one-line reason names the torch build and the NVIDIA driver it needs;
- `device: auto` on a machine where CUDA is unusable runs on the CPU and says so in one INFO
  line (on the console once per Snakemake invocation, in every job's log; a command that sets
  up no logging, such as `distinctcap caption`, says nothing): the CPU is what `auto` asks
  for where there is no GPU, so it is no warning;
- on a workstation with several GPUs each GPU job claims free cards (`claim_gpus`: one lock
  file per card, held while the job's process lives) and sees only those through
  CUDA_VISIBLE_DEVICES, unless that is set already (SLURM sets it for the job's GPUs).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
import tempfile
import time
import warnings
from pathlib import Path

import torch

from distinctcap.core import logs
from distinctcap.core.cores import DRIVER_FILE
from distinctcap.core.errors import DistinctcapError

log = logging.getLogger(__name__)

# The oldest NVIDIA Linux driver that runs each CUDA major version (NVIDIA's CUDA toolkit
# release notes, "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version
# Compatibility"). The pinned torch==2.14.1 wheel is built with CUDA 13.0: driver >= 580.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
GPUS_DIR = Path("/proc/driver/nvidia/gpus")  # one folder per card, readable without CUDA
LOCK_NAME = "distinctcap-gpu-{}.lock"
# A stage function's default device: a job passes the one it resolved at its start
# (distinctcap.core.jobs.start_job); a library call or a test that names none runs on the CPU.
CPU = torch.device("cpu")


class GpuUnavailableError(DistinctcapError):
    """A job needs a GPU and CUDA cannot give it one."""


# ---------------------------------------------------------------------------------------------
# What the torch build needs and what the machine has


def torch_build() -> str:
    """e.g. 'torch 2.14.1+cu130 (CUDA 13.0)'."""
    cuda = torch.version.cuda
    return f"torch {torch.__version__} " + (f"(CUDA {cuda})" if cuda else "(a CPU-only build)")


def required_driver(cuda: str | None = None) -> str | None:
    """The minimum NVIDIA driver of the CUDA version torch was built with (None: CPU build)."""
    cuda = cuda if cuda is not None else torch.version.cuda
    if not cuda:
        return None
    return MIN_DRIVER.get(int(cuda.split(".")[0]))


def installed_driver(path: Path = DRIVER_FILE) -> str | None:
    """The loaded NVIDIA kernel driver's version (e.g. '535.104.05'), None when none is."""
    try:
        text = path.read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
    return found.group(1) if found else None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def _driver_cuda() -> str | None:
    """The CUDA version the driver supports (cudaDriverGetVersion), None when unknown / none."""
    try:
        value = int(torch._C._cuda_getDriverVersion())
    except Exception:  # noqa: BLE001 - private API, absent in CPU builds
        return None
    return f"{value // 1000}.{value % 1000 // 10}" if value > 0 else None


@functools.cache
def cuda_problem() -> str | None:
    """None when CUDA is usable; else why not, one clause. Asked once per process (torch's own
    warning about the driver is caught here and folded into the reason)."""
    if not torch.version.cuda:
        return f"{torch_build()} cannot use a GPU; install the CUDA build of requirements.txt"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = torch.cuda.is_available()
    if usable:
        return None
    said = " ".join(str(w.message) for w in caught)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    driver = installed_driver()
    need = required_driver()
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    if driver is None and _driver_cuda() is None:
        return "no NVIDIA driver is loaded (no GPU, or its driver is not installed)"
    if "too old" in said.lower() or (driver and need and _version(driver) < _version(need)):
        supports = _driver_cuda()
        return f"the NVIDIA driver {driver or '?'} is too old" + (
            f" (it supports CUDA {supports})" if supports else ""
        )
    first = said.strip().splitlines()[0][:200] if said.strip() else "no GPU is visible"
    return f"CUDA does not start with NVIDIA driver {driver or '?'}: {first}"


def gpu_requirement() -> str:
    """'torch 2.14.1+cu130 (CUDA 13.0) needs an NVIDIA driver >= 580.65.06 (Linux)'."""
    need = required_driver()
    return torch_build() + (f" needs an NVIDIA driver >= {need} (Linux)" if need else "")


def require_cuda(why: str) -> None:
    """Raise GpuUnavailableError (one line: why a GPU is needed, why CUDA is unusable, the
    torch build and the driver it needs) unless CUDA is usable."""
    problem = cuda_problem()
    if problem is not None:
        raise GpuUnavailableError(
            f"{why}, but CUDA is unusable: {problem}; {gpu_requirement()} "
            "(docs/gpus-and-slurm.md). Nothing was written."
        )


@functools.cache
def _note_cpu_fallback() -> None:
    """Once per Snakemake invocation on the console (every job's log file has it), at INFO."""
    extra = {} if logs.first_this_run("cpu-fallback") else logs.FILE_ONLY
    log.info(
        "device auto: running on the CPU, CUDA is unusable (%s)", cuda_problem(), extra=extra
    )


# ---------------------------------------------------------------------------------------------
# The device


def resolve_device(device: str | torch.device | None = "auto", gpus: int = 0) -> torch.device:
    """The torch device of a `device` setting in a job holding `gpus` GPUs (its snakemake
    resource `gpu`; 0 outside snakemake).

    - `auto` (or None): the GPU when CUDA is usable; a job holding GPUs stops when it is not
      (GpuUnavailableError); a job holding none runs on the CPU with one INFO line.
    - `cuda`, `cuda:N`: stops when CUDA is unusable or card N is not visible.
    - `cpu`: the CPU, also in a job holding GPUs (said in one warning line)."""
    if device is None or (isinstance(device, str) and device == "auto"):
        if gpus > 0:
            require_cuda(f"this job holds {gpus} GPU(s) (resource gpu = {gpus})")
            return torch.device("cuda")
        if cuda_problem() is None:
            return torch.device("cuda")
        _note_cpu_fallback()
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        require_cuda(f"device = {str(device)!r}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise GpuUnavailableError(
                f"device = {str(device)!r} but only {torch.cuda.device_count()} GPU(s) are "
                f"visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
            )
    elif gpus > 0:
        log.warning("device = %r: this job holds %d GPU(s) but runs on the CPU", str(device), gpus)
    return dev


def describe(device: torch.device) -> str:
    """'cuda:0 (NVIDIA H100 80GB HBM3)' or 'cpu'."""
    if device.type != "cuda":
        return str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def job_device(device: str | None = "auto", gpus: int | str | None = 0) -> torch.device:
    """The start of a job script, before anything is written: claim the job's `gpus` cards
    (`claim_gpus`), resolve its device (a job that needs a GPU stops here when CUDA is
    unusable) and log one line `device: cuda:0 (<name>)` or `device: cpu`."""
    gpus = int(gpus or 0)
    claim_gpus(gpus)
    dev = resolve_device(device, gpus)
    log.info("device: %s", describe(dev))
    return dev


# ---------------------------------------------------------------------------------------------
# GPU slots of a workstation

_held: list[int] = []  # file descriptors of the claimed slots' locks, kept open for life


def gpu_count() -> int:
    """The machine's NVIDIA GPUs, read without starting CUDA (so CUDA_VISIBLE_DEVICES can still
    be set); DISTINCTCAP_GPU_COUNT overrides (tests)."""
    if os.environ.get("DISTINCTCAP_GPU_COUNT"):
        return int(os.environ["DISTINCTCAP_GPU_COUNT"])
    try:
        return sum(1 for _ in GPUS_DIR.iterdir())
    except OSError:
        return 0


def _lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on `path`, or None when another process holds it.
    Opened read-only, so a lock file another user created (0644) can be locked too."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def claim_gpus(
    n: int,
    count: int | None = None,
    lock_dir: str | Path | None = None,
    timeout: float = 300.0,
    poll: float = 2.0,
) -> list[int] | None:
    """Claim `n` free GPU slots of this machine and make them the only cards CUDA shows this
    process and its children (CUDA_VISIBLE_DEVICES); must run before CUDA starts.

    Slot i is free when no process holds an flock on `<lock_dir>/distinctcap-gpu-<i>.lock`
    (lock_dir: DISTINCTCAP_GPU_LOCK_DIR, else the temp folder, shared by every pipeline on the
    machine). The lock is held until the process ends, however it ends, so a finished or killed
    job's slot is free again at once. Snakemake's `gpu` resource keeps the jobs' GPUs within
    the machine's, so a free slot is normally there; if not (a job of another pipeline), this
    waits up to `timeout` seconds. Returns the slots, or None when there is nothing to do:
    n = 0, CUDA_VISIBLE_DEVICES already set (SLURM, the user), or no GPU (resolve_device then
    tells why)."""
    if n <= 0:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        log.info("GPUs given by CUDA_VISIBLE_DEVICES=%s", visible)
        return None
    count = gpu_count() if count is None else count
    if count == 0:
        return None
    if n > count:
        raise GpuUnavailableError(
            f"this job asks for {n} GPUs but this machine has {count}; lower the rule's gpu "
            "resource in the profile"
        )
    folder = Path(lock_dir or os.environ.get("DISTINCTCAP_GPU_LOCK_DIR") or tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        got: list[tuple[int, int]] = []
        for i in range(count):
            fd = _lock(folder / LOCK_NAME.format(i))
            if fd is not None:
                got.append((i, fd))
                if len(got) == n:
                    break
        if len(got) == n:
            _held.extend(fd for _, fd in got)
            slots = [i for i, _ in got]
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slots))
            log.info("GPU slot(s) %s of %d claimed (CUDA_VISIBLE_DEVICES)", slots, count)
            return slots
        for _, fd in got:  # all or nothing: two waiting jobs never hold half each
            os.close(fd)
        if time.monotonic() >= deadline:
            raise GpuUnavailableError(
                f"no {n} free GPU slot(s) of {count} after {timeout:.0f} s: other processes "
                f"hold {folder / LOCK_NAME.format('*')}; is the profile's `resources: gpu` "
                "larger than the machine's GPUs?"
            )
        if not waited:
            log.warning("waiting for %d free GPU slot(s) of %d (%s)", n, count, folder)
            waited = True
        time.sleep(poll)
