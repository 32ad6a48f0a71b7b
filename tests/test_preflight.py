"""The preflight checks (distinctcap.core.preflight), each fed a failing fact and its message
read, and the whole preflight of the shapes default on this CPU machine."""

import time

import pytest
from conftest import ROOT

from distinctcap.core import preflight as pf
from distinctcap.core.errors import DistinctcapError

GB = 1e9


def test_a_driver_older_than_the_build_needs_names_both_and_the_fix():
    line = pf.check_driver("2.14.1+cu130", "13.0", "550.54.14", "580.65.06")
    assert "NVIDIA driver 550.54.14 is older than 580.65.06" in line
    assert "torch 2.14.1+cu130 (CUDA 13.0)" in line and "newer driver" in line
    assert pf.check_driver("2.14.1+cu130", "13.0", "580.65.06", "580.65.06") is None
    assert "no NVIDIA driver" in pf.check_driver("2.14.1+cu130", "13.0", None, "580.65.06")
    assert "CPU-only build" in pf.check_driver("2.14.1+cpu", None, None, None)


def test_a_gpu_without_kernels_in_the_build_names_its_capability_and_the_fix():
    arches = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    line = pf.check_capability((6, 0), arches, "Tesla P100")
    assert "Tesla P100 (compute capability 6.0) has no kernels" in line
    assert "sm_75" in line and "gpu_model" in line
    assert pf.check_capability((8, 9), arches, "L40S") is None  # sm_86 runs on 8.9
    assert pf.check_capability((9, 0), arches, "H100") is None
    assert pf.check_capability((12, 1), ["sm_80", "compute_90"], "new") is None  # PTX


def test_java_missing_on_the_evaluating_node_stops_only_when_evaluation_needs_it():
    said = "need `java` on PATH; install Java 17"
    assert pf.check_java(True, said) == f"java on this node: {said}"
    assert pf.check_java(False, said) is None and pf.check_java(True, None) is None


def test_too_little_disk_names_the_folder_the_sizes_and_the_fix():
    line = pf.check_disk(10 * GB, 65 * GB, "resources/coco")
    assert line.startswith("resources/coco has 10.0 GB free but the planned stages write about")
    assert "65.0 GB" in line and "snakemake --directory" in line
    assert pf.check_disk(70 * GB, 65 * GB, ".") is None


def shipped(name: str) -> dict:
    from distinctcap.core.config import load

    return load(ROOT / name, ROOT / "workflow/schemas/config.schema.yaml")


def test_the_coco_config_plans_tens_of_gigabytes_and_the_shapes_default_megabytes():
    assert 50 * GB < pf.planned_bytes(shipped("config.coco.yaml")) < 100 * GB
    assert pf.planned_bytes(shipped("config.yaml")) < 1 * GB


def test_a_small_dev_shm_lowers_the_workers_naming_the_setting():
    batch = 256 * 3 * 224 * 224
    line = pf.check_shm(7, batch, 4, 64e6)  # a container's 64 MB default
    assert "/dev/shm has 0.06 GB free, 7 loader workers need about 2.16 GB" in line
    assert "runs with 0 (set clip.features.workers: 0" in line
    assert pf.shm_workers(7, batch, 4, 1 * GB) == 3
    assert pf.check_shm(7, batch, 4, 8 * GB) is None


def test_the_loader_runs_fewer_workers_when_dev_shm_is_small(monkeypatch, caplog):
    monkeypatch.setattr(pf, "shm_free", lambda: 1 * GB)
    assert pf.workers_fitting_shm(7, 256 * 3 * 224 * 224) == 3
    assert "feature extraction runs with 3" in caplog.text
    assert pf.workers_fitting_shm(2, 256 * 3 * 224 * 224) == 2


def test_weights_missing_from_the_hub_cache_are_named_without_downloading(tmp_path):
    from hub_cache import point_hub_at

    config = {"clip": {"arch": "ViT-B-32", "pretrained": "openai"}, "captioner": {}}
    with pytest.MonkeyPatch.context() as mp:
        point_hub_at(mp, tmp_path, offline=False)  # downloads on: still only the cache is read
        (line,) = pf.weights_lines(config)
        config = {**config, "captioner": {"kind": "transformers", "pretrained": "org/blip"}}
        lines = pf.weights_lines(config)
    assert "clip.pretrained = 'openai'" in line and str(tmp_path) in line
    assert "captioner.pretrained = 'org/blip'" in lines[1] and "distinctcap fetch" in lines[1]


def test_the_shapes_default_passes_quickly_on_a_cpu_and_failures_stop_in_one_error(tmp_path):
    config = shipped("config.yaml")
    start = time.perf_counter()
    pf.run_preflight(config, str(tmp_path / "preflight.txt"))
    assert time.perf_counter() - start < 10  # no torch, no open_clip: well under 1 s idle
    assert (tmp_path / "preflight.txt").read_text() == "ok\n"
    config["clip"] = {**config["clip"], "arch": "ViT-B-32", "pretrained": str(tmp_path / "x.pt")}
    with pytest.raises(DistinctcapError, match="preflight: 1 check.*x.pt': no such file"):
        pf.run_preflight(config, str(tmp_path / "again.txt"))
    assert not (tmp_path / "again.txt").exists()
