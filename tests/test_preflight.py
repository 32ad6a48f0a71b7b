"""The preflight checks (distinctcap.runs.preflight), each fed a failing fact and its message
read, and the whole preflight of the shapes default on this CPU machine."""

import time

import pytest
import yaml
from conftest import ROOT

from distinctcap.core.errors import DistinctcapError
from distinctcap.data.mirror import archive_path
from distinctcap.features import shm
from distinctcap.runs import preflight as pf

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
    from distinctcap.config.check import load

    return load(ROOT / name, ROOT / "workflow/schemas/config.schema.yaml")


def test_the_coco_config_plans_tens_of_gigabytes_and_the_shapes_default_megabytes(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # no resources/coco here: the whole download is planned
    assert 50 * GB < pf.planned_bytes(shipped("config.coco.yaml")) < 100 * GB
    assert pf.planned_bytes(shipped("config.yaml")) < 1 * GB


def test_real_coco_with_too_little_disk_fails_in_one_line_and_logs_the_parts(
    tmp_path, monkeypatch, caplog
):
    """COCO's recorded archive sizes (no server asked), every image, eight runs' models."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pf, "free_bytes", lambda folder: 25.8 * GB)
    with caplog.at_level("INFO", logger=pf.__name__):
        line = pf.disk_problem(shipped("config.coco.yaml"))
    assert line.startswith("resources/coco has 25.8 GB free but the planned stages write about 6")
    assert "\n" not in line and "snakemake --directory" in line
    (logged,) = [r.getMessage() for r in caplog.records if "disk:" in r.getMessage()]
    assert "download 20.4 GB (recorded sizes) + extracted 20.4 GB (recorded sizes)" in logged
    assert "features 20.1 GB (123,287 image(s))" in logged and "runs 3.4 GB (8 x " in logged


@pytest.mark.slow
def test_the_estimate_on_the_mini_coco_mirror_is_within_2x_of_what_the_run_wrote(tmp_path):
    """The mini-COCO from its mirror through one short training run: the estimate (the
    mirror's sizes by HEAD, the images they hold, a trained CLIP, one run) against the bytes
    the run left in the run folder and the download folder; once extracted, nothing more is
    planned for the archives."""
    from conftest import copy_workflow, snakemake
    from minicoco import MiniServer, build_minicoco

    from distinctcap.config.check import load
    from distinctcap.data.coco import SPLIT_ARCHIVES

    (tmp_path / "w").mkdir()
    mini, work = build_minicoco(tmp_path / "mini"), copy_workflow(tmp_path / "w")
    coco = {
        "split": "mrnn",
        "download_dir": str(tmp_path / "coco"),
        "checksums": {n: mini.md5[n] for n in SPLIT_ARCHIVES["mrnn"]},  # sizes: unrecorded
        "backoff": 0.0,
        "mrnn_val_images": 3,
    }
    config = {
        "data": {"source": "coco", "coco": coco},
        "clip": {"train": {"epochs": 2, "batch_size": 8}, "features": {"workers": 0}},
        "captioner": {"width": 32, "enc_layers": 1, "dec_layers": 1, "heads": 2, "ffn": 64},
        "train": {"steps": 2, "warmup_steps": 1, "val_every": 0, "checkpoint_every": 1},
        "runs": {"reference": {"method": "mle", "data": "all"}},
    }
    schema = ROOT / "workflow/schemas/config.schema.yaml"
    before = {p for p in work.rglob("*") if p.is_file()}
    with MiniServer(mini.serve) as server:
        coco["base_url"] = server.url
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        plan = pf.disk_plan(load(work / "config.yaml", schema))
        assert sorted(server.heads) == sorted(f"/{archive_path(n)}" for n in coco["checksums"])
        done = snakemake(work, "results/runs/reference/model.pt")
    assert done.returncode == 0, done.stderr[-3000:]
    written = sum(
        p.stat().st_size
        for folder in (work, tmp_path / "coco")
        for p in folder.rglob("*")
        if p.is_file() and p not in before
    )
    parts, zips = (
        {p.name: p for p in plan},
        [mini.serve / archive_path(n) for n in coco["checksums"]],
    )
    assert (
        parts["download"].bytes == parts["extracted"].bytes == sum(z.stat().st_size for z in zips)
    )
    planned = sum(part.bytes for part in plan)
    assert written / 2 < planned < 2 * written, (pf.disk_line(plan), written)
    assert "server sizes" in (work / "logs/preflight.log").read_text()
    after = {p.name: p for p in pf.disk_plan(load(work / "config.yaml", schema))}
    assert after["download"].bytes == after["extracted"].bytes == 0
    assert after["extracted"].how == "extracted sizes"


def test_a_small_dev_shm_lowers_the_workers_naming_the_setting():
    batch = 256 * 3 * 224 * 224
    line = shm.check_shm(7, batch, 4, 64e6)  # a container's 64 MB default
    assert "/dev/shm has 0.06 GB free, 7 loader workers need about 2.16 GB" in line
    assert "runs with 0 (set clip.features.workers: 0" in line
    assert shm.shm_workers(7, batch, 4, 1 * GB) == 3
    assert shm.check_shm(7, batch, 4, 8 * GB) is None


def test_the_loader_runs_fewer_workers_when_dev_shm_is_small(monkeypatch, caplog):
    monkeypatch.setattr(shm, "shm_free", lambda: 1 * GB)
    assert shm.workers_fitting_shm(7, 256 * 3 * 224 * 224) == 3
    assert "feature extraction runs with 3" in caplog.text
    assert shm.workers_fitting_shm(2, 256 * 3 * 224 * 224) == 2


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
