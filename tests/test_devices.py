"""Devices are explicit: the reason a GPU job cannot start, the one warning of device auto on
the CPU, and the GPU slots of a workstation (claimed with lock files, tested with a fake count)."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT

from distinctcap.core import devices
from distinctcap.core.devices import GpuUnavailableError, claim_gpus, resolve_device

needs_no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="checks what happens when CUDA is unusable, which a machine with a working GPU "
    "cannot show",
)


@pytest.fixture
def fresh(monkeypatch):
    """cuda_problem and the fallback warning asked anew (both are once per process)."""
    devices.cuda_problem.cache_clear()
    devices._note_cpu_fallback.cache_clear()
    yield
    devices.cuda_problem.cache_clear()
    devices._note_cpu_fallback.cache_clear()


@needs_no_cuda
def test_device_auto_says_once_at_info_when_it_falls_back_to_the_cpu(fresh, caplog):
    """Issue 48 item 3: the CPU is what `auto` asks for without a GPU, so it is said at INFO."""
    with caplog.at_level(logging.INFO, logger="distinctcap"):
        assert resolve_device("auto") == torch.device("cpu")
        assert resolve_device(None) == torch.device("cpu")
        assert resolve_device() == torch.device("cpu")
        assert resolve_device(torch.device("cpu")) == torch.device("cpu")
        assert resolve_device("auto") == torch.device("cpu")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith("device auto: running on the CPU, CUDA is unusable (")
    assert caplog.records[0].levelno == logging.INFO


@needs_no_cuda
def test_a_command_without_logging_says_nothing_of_the_cpu():
    """Issue 48 item 3: every `distinctcap caption` call warned that CUDA is unusable (the CLI
    sets up no logging, and Python prints a bare warning on stderr), on a setup the README
    calls "no GPU needed". A command that resolves `auto` as caption does prints nothing."""
    code = "from distinctcap.core.devices import resolve_device; print(resolve_device('auto'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("cpu\n", ""), done.stderr


@needs_no_cuda
def test_the_cpu_fallback_reaches_the_console_once_per_snakemake_run(
    fresh, tmp_path, monkeypatch
):
    """Every job of one invocation falls back: the first says so on the console, the others
    only in their rule's log; the next invocation (a newer .snakemake/log file) says it again."""
    import io

    from distinctcap.core import logs

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".snakemake" / "log").mkdir(parents=True)
    monkeypatch.setattr(logs, "_job_log", None)  # restored after the test, as setup sets it

    def job(name):
        console = io.StringIO()
        monkeypatch.setattr(sys, "stderr", console)
        logs.setup(str(tmp_path / f"{name}.log"))
        devices._note_cpu_fallback.cache_clear()  # a new job process
        resolve_device("auto")
        logging.getLogger().handlers.clear()
        return "CUDA is unusable" in console.getvalue(), (tmp_path / f"{name}.log").read_text()

    (tmp_path / ".snakemake/log/2026-01-01T000000.1.snakemake.log").touch()
    said = [job(name) for name in ("a", "b", "c")]
    assert [console for console, _ in said] == [True, False, False]
    assert all("CUDA is unusable" in log for _, log in said)
    (tmp_path / ".snakemake/log/2026-01-02T000000.1.snakemake.log").touch()
    assert job("d")[0]


def test_cpu_is_cpu_and_warns_nothing_outside_a_gpu_job(fresh, caplog):
    with caplog.at_level(logging.WARNING, logger="distinctcap"):
        assert resolve_device("cpu") == torch.device("cpu")
    assert caplog.records == []


@pytest.mark.parametrize(
    ("problem", "driver", "why"),
    [
        ({"warning": "The NVIDIA driver on your system is too old (found version 11040)"},
         "470.82.01", "the NVIDIA driver 470.82.01 is too old"),
        ({}, None, "no NVIDIA driver is loaded"),
    ],
    ids=["driver-too-old", "no-driver"],
)
def test_a_gpu_job_without_usable_cuda_names_the_build_and_the_driver_it_needs(
    fresh, monkeypatch, problem, driver, why
):
    def unavailable():
        if problem.get("warning"):
            import warnings

            warnings.warn(problem["warning"], stacklevel=1)
        return False

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", unavailable)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(devices, "installed_driver", lambda: driver)
    monkeypatch.setattr(devices, "_driver_cuda", lambda: "11.4" if driver else None)
    for device, gpus, said in [("auto", 1, "this job holds 1 GPU(s)"), ("cuda", 0, "'cuda'")]:
        with pytest.raises(GpuUnavailableError) as error:
            resolve_device(device, gpus)
        message = str(error.value)
        assert said in message and why in message
        assert f"torch {torch.__version__} (CUDA 13.0) needs an NVIDIA driver >= 580" in message
        assert "\n" not in message


def test_required_driver_follows_the_cuda_major_version():
    assert devices.required_driver("12.4") == "525.60.13"
    assert devices.required_driver("13.0").startswith("580")
    assert devices.required_driver("") is None


def test_installed_driver_is_read_from_the_kernel_module_line(tmp_path):
    version = tmp_path / "version"
    version.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"
        "GCC version:  gcc version 12.2.0\n"
    )
    assert devices.installed_driver(version) == "580.159.04"
    assert devices.installed_driver(tmp_path / "absent") is None


# ---------------------------------------------------------------------------------------------
# GPU slots

CLAIM = textwrap.dedent(
    """
    import sys
    from distinctcap.core.devices import claim_gpus
    import os
    print(claim_gpus(int(sys.argv[1]), timeout=float(sys.argv[2]), poll=0.05),
          os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
    sys.stdin.readline()  # hold the slots until told to end
    """
)


def claimer(tmp_path, n=1, timeout=5.0):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env |= {
        "PYTHONPATH": str(ROOT / "src"),
        "DISTINCTCAP_GPU_COUNT": "2",
        "DISTINCTCAP_GPU_LOCK_DIR": str(tmp_path),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CLAIM, str(n), str(timeout)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def claimed(proc) -> str:
    return proc.stdout.readline().strip()


def end(proc) -> str:
    out, err = proc.communicate("\n", timeout=30)
    return err


def test_two_jobs_claim_different_gpus_and_a_released_slot_is_reused(tmp_path):
    jobs = [claimer(tmp_path), claimer(tmp_path)]
    slots = {claimed(job): job for job in jobs}
    assert set(slots) == {"[0] 0", "[1] 1"}
    third = claimer(tmp_path, timeout=0.3)  # both slots held: it waits, then gives up
    assert claimed(third) == ""
    assert "no 1 free GPU slot(s) of 2 after 0 s" in end(third)
    end(slots["[0] 0"])  # its process ends: slot 0 is free again
    fourth = claimer(tmp_path)
    assert claimed(fourth) == "[0] 0"
    end(slots["[1] 1"]), end(fourth)


def test_a_two_gpu_job_waits_for_two_free_slots(tmp_path):
    one = claimer(tmp_path)
    assert claimed(one) == "[0] 0"
    both = claimer(tmp_path, n=2, timeout=10)
    end(one)
    assert claimed(both) == "[0, 1] 0,1"
    end(both)


def test_claiming_leaves_a_given_cuda_visible_devices_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # SLURM's choice
    assert claim_gpus(1, count=4, lock_dir=tmp_path) is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert list(tmp_path.iterdir()) == []


def test_a_job_asking_for_more_gpus_than_the_machine_has_stops(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(GpuUnavailableError, match="asks for 3 GPUs but this machine has 2"):
        claim_gpus(3, count=2, lock_dir=tmp_path)
    assert claim_gpus(0, count=2, lock_dir=tmp_path) is None


# ---------------------------------------------------------------------------------------------
# The start of a job (distinctcap.core.jobs.start_job)

JOB = textwrap.dedent(
    """
    import json, sys
    from types import SimpleNamespace
    import torch
    from distinctcap.core.jobs import start_job
    device, gpus, threads, policy = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    job = SimpleNamespace(log=["job.log"], params=SimpleNamespace(device=device),
                          resources={"gpu": gpus}, threads=threads)
    before = torch.get_num_threads()
    got = start_job(job, threads=policy)
    print(json.dumps({"device": repr(got), "before": before, "after": torch.get_num_threads()}))
    """
)


def start_job_in(tmp_path, device: str, gpus: int, threads: int, policy: str):
    """start_job in a fresh process (it sets up logging and torch threads for good), as the
    script of a rule with `params.device`, `resources.gpu` and `threads`; the folder holds
    its job.log, which starts with a stale line."""
    (tmp_path / "job.log").write_text("a line of the previous attempt\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-c", JOB, device, str(gpus), str(threads), policy],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )


@pytest.mark.parametrize(
    ("policy", "threads"), [("all", lambda before: 3), ("unchanged", lambda before: before)]
)
def test_a_job_starts_with_its_log_its_device_and_its_threads(tmp_path, policy, threads):
    import json

    done = start_job_in(tmp_path, "cpu", 0, 3, policy)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["device"] == "device(type='cpu')"
    assert got["after"] == threads(got["before"])
    log = (tmp_path / "job.log").read_text()
    assert "previous attempt" not in log
    assert "INFO distinctcap.core.devices: device: cpu\n" in log


def test_a_gpu_job_without_usable_cuda_stops_at_its_start_naming_why(tmp_path):
    done = start_job_in(tmp_path, "auto", 1, 3, "all")
    assert done.returncode == 1 and done.stdout == ""
    reason = (
        "ERROR distinctcap: this job holds 1 GPU(s) (resource gpu = 1), but CUDA is unusable: "
        "CUDA_VISIBLE_DEVICES='' hides every GPU; "
    )
    assert reason in (tmp_path / "job.log").read_text()
    assert reason in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("policy", "device", "expected"),
    [
        ("all", "cpu", 3),
        ("all", "cuda", 3),
        ("all-on-cuda", "cuda", 3),
        ("all-on-cuda", "cpu", 1),  # CPU numbers must not depend on the machine's cores
    ],
)
def test_thread_policies(torch_threads, policy, device, expected):
    from distinctcap.core.jobs import set_threads

    torch.set_num_threads(2)
    set_threads(policy, 3, torch.device(device))
    assert torch.get_num_threads() == expected
    set_threads("unchanged", 3, torch.device(device))
    assert torch.get_num_threads() == expected


def test_an_unknown_thread_policy_stops(torch_threads):
    from distinctcap.core.jobs import set_threads

    with pytest.raises(ValueError, match="threads = 'some'"):
        set_threads("some", 3, torch.device("cpu"))
