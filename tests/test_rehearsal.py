"""Issue 30's COCO rehearsal: the synthetic COCO (distinctcap.data.synthcoco) is read by the real
COCO source in both split styles after a download from the mirror server, the rehearsal's
overlay is a valid config, its schedule arithmetic, bench/gpu_check.sh's JSON lines, and (slow)
bench/rehearsal.py through one training run."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distinctcap.config.check import validate
from distinctcap.config.rungraph import effective_run_config
from distinctcap.core.configfile import merge_configs
from distinctcap.core.schema import load_schema
from distinctcap.data import coco
from distinctcap.data.mirror import MirrorServer, archive_path
from distinctcap.data.quality import check_tables
from distinctcap.data.synthcoco import (
    COCO_IMAGES,
    LONG_SIDE,
    split_counts,
    write_synthetic_coco,
)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import rehearsal  # noqa: E402  (bench/ is scripts, not a package)

N = 40


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthcoco")
    md5, counts = write_synthetic_coco(out, N, ("mrnn", "karpathy"), workers=0)
    return out, md5, counts


def test_split_counts_at_cocos_size_are_cocos():
    counts = split_counts(COCO_IMAGES)
    assert (counts.train2017, counts.val2017, counts.mrnn_val_images) == (118_287, 5_000, 4_000)
    karpathy = (
        counts.train2014 + counts.karpathy_restval,
        counts.karpathy_val,
        counts.karpathy_test,
    )
    assert karpathy == (113_287, 5_000, 5_000)


@pytest.mark.parametrize("split", ["mrnn", "karpathy"])
def test_the_real_coco_source_downloads_and_reads_the_synthetic_coco(synthetic, split, tmp_path):
    out, md5, counts = synthetic
    with MirrorServer(out) as server:
        cfg = {
            "split": split,
            "download_dir": str(tmp_path),
            "base_url": server.url,
            "checksums": {n: md5[n] for n in coco.SPLIT_ARCHIVES[split]},
            "backoff": 0.0,
            "mrnn_val_images": counts.mrnn_val_images,
        }
        images, captions, root = coco.prepare_tables(cfg)
    images, captions, quarantine = check_tables(images, captions, root, "fail")
    assert quarantine.empty and len(images) == N and len(captions) == 5 * N
    assert set(images[["width", "height"]].max(axis=1)) == {LONG_SIDE}
    test = counts.val2017 - counts.mrnn_val_images
    expected = (
        {"train": counts.train2017, "val": counts.mrnn_val_images, "test": test}
        if split == "mrnn"
        else {
            "train": counts.train2014 + counts.karpathy_restval,
            "val": counts.karpathy_val,
            "test": counts.karpathy_test,
        }
    )
    assert images.split.value_counts().to_dict() == expected
    assert captions.text.str.fullmatch(r"[a-z0-9 ]+").all()  # normalised: no case, no stops


def test_the_overlay_gives_every_run_the_rehearsal_steps():
    """config.coco.yaml with the overlay merged (as Snakemake merges --configfile files) is
    valid, and every run trains `steps` steps with its full schedule's validation count."""
    config = rehearsal.load_coco()
    mirror = {"md5": {"train2017.zip": "0" * 32}, "counts": {"mrnn_val_images": 3}}
    extra = rehearsal.overlay(config, "http://127.0.0.1:1", mirror, 20, "cpu", Path("/w"))
    merged = validate(
        merge_configs(yaml.safe_load((REPO / "config.coco.yaml").read_text()), extra),
        load_schema(REPO / "workflow/schemas/config.schema.yaml"),
    )
    full = rehearsal.full_steps(config)
    assert full["reference"] == 15 * -(-rehearsal.COCO_TRAIN_CAPTIONS // 50)
    assert full["specificity"] == 190_000
    for name in config["runs"]:
        train = effective_run_config(merged, name)["train"]
        assert (train["steps"], train["epochs"], train["patience"]) == (20, None, 0)
    reference = effective_run_config(merged, "reference")["train"]["val_every"]
    assert reference == round(2000 * 20 / full["reference"]) or reference == 1


def test_the_rehearsals_preflight_passes_with_5_gb_free(synthetic, tmp_path, monkeypatch, caplog):
    """The rehearsal's config (config.coco.yaml, its overlay, the synthetic COCO's mirror)
    plans what its 40 images need, sized by HEAD requests to the mirror: its preflight passes
    where the disk has 5 GB free (faked), and the log states the estimate's parts."""
    import open_clip
    from hub_cache import point_hub_at

    from distinctcap.core.hub import snapshot_folder
    from distinctcap.runs import preflight as pf

    out, md5, counts = synthetic
    point_hub_at(monkeypatch, tmp_path / "hub")  # the tag's weights: a stub is found offline
    judge = rehearsal.load_coco()["evaluate"]["judge"]
    for arch, tag in ((rehearsal.ARCH, rehearsal.TAG), (judge["arch"], judge["pretrained"])):
        repo = open_clip.get_pretrained_cfg(arch, tag)["hf_hub"].rstrip("/")
        (snapshot_folder(tmp_path / "hub", repo) / "open_clip_model.safetensors").write_bytes(b"0")
    monkeypatch.setattr(pf, "free_bytes", lambda folder: 5e9)
    with MirrorServer(out) as server, caplog.at_level("INFO", logger=pf.__name__):
        mirror = {"md5": md5, "counts": counts.__dict__}
        extra = rehearsal.overlay(rehearsal.load_coco(), server.url, mirror, 1, "cpu", tmp_path)
        config = validate(
            merge_configs(yaml.safe_load((REPO / "config.coco.yaml").read_text()), extra),
            load_schema(REPO / "workflow/schemas/config.schema.yaml"),
        )
        pf.run_preflight(config, str(tmp_path / "preflight.txt"))
    assert (tmp_path / "preflight.txt").read_text() == "ok\n"
    assert sorted(server.heads) == sorted(
        f"/{archive_path(n)}" for n in coco.SPLIT_ARCHIVES["mrnn"]
    )
    assert "download " in caplog.text and "(server sizes, one zip at a time)" in caplog.text


def test_list_schedule_runs_independent_chains_side_by_side():
    durations = {"reference": 10.0, "cl": 5.0, "smile": 4.0, "teacher_pos": 8.0}
    deps = {"reference": [], "cl": ["reference"], "smile": ["reference"], "teacher_pos": []}
    assert rehearsal.list_schedule(durations, deps, 1) == 27.0
    assert rehearsal.list_schedule(durations, deps, 2) == 15.0  # reference -> cl on one
    assert rehearsal.list_schedule(durations, deps, 4) == 15.0  # the critical path


def gpu_check(tmp_path, *args, python=sys.executable) -> tuple[subprocess.CompletedProcess, list]:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": str(python),
           "WHEELS": str(tmp_path / "no-wheels")}  # fmt: skip
    done = subprocess.run(
        ["bash", str(REPO / "bench/gpu_check.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    jsonl = tmp_path / "gpu_check.jsonl"
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    return done, lines


def test_gpu_check_without_a_gpu_says_why_in_one_json_line(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi found: gpu_check.sh takes its GPU path, not the no-GPU exit")
    done, lines = gpu_check(tmp_path)
    assert done.returncode == 1 and "no usable GPU" in done.stderr
    assert [line["part"] for line in lines] == ["gpu"] and "no usable GPU" in lines[0]["tail"]


def test_gpu_check_cpu_mode_runs_every_default_part_to_a_number(tmp_path):
    """Each default part (a features, b steps, c scale) runs CPU-sized under its limit, exits
    0 and prints at least one number; its log comes back under OUT; the imports line lists
    nothing missing (issue 42: --cpu once passed with every part failing)."""
    done, lines = gpu_check(tmp_path, "--cpu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert [line["part"] for line in lines] == ["imports", "a", "b", "c"]
    assert lines[0]["missing"] == {}
    for line in lines[1:]:
        assert line["rc"] == 0 and line["numbers"] >= 1 and "--device cpu" in line["command"]
        assert (tmp_path / f"part-{line['part']}.log").is_file()


def test_gpu_check_fails_when_a_part_fails(tmp_path):
    """A part that exits non-zero makes the whole check exit 1, after the other parts ran."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n[ "$1" = bench/bench_steps.py ] && exit 3\n'
                      f'exec {sys.executable} "$@"\n')  # fmt: skip
    python.chmod(0o755)
    done, lines = gpu_check(tmp_path, "--cpu", "--parts", "b", python=python)
    assert done.returncode == 1 and "FAILED: b" in done.stderr
    assert [(line["part"], line["rc"]) for line in lines] == [("imports", 0), ("b", 3)]


def test_gpu_check_names_a_missing_module_and_skips_its_part(tmp_path):
    """On a node without open_clip (no wheels carried) part b is skipped, named in one line."""
    blocker = tmp_path / "site" / "open_clip.py"
    blocker.parent.mkdir()
    blocker.write_text("raise ModuleNotFoundError('No module named open_clip', name='open_clip')")
    python = tmp_path / "python"
    path = f"PYTHONPATH={blocker.parent}:$PYTHONPATH"
    python.write_text(f'#!/bin/sh\n{path} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    done, lines = gpu_check(tmp_path, "--cpu", "--parts", "b", python=python)
    assert done.returncode == 1
    assert lines[0] == {**lines[0], "part": "imports", "rc": 1, "missing": {"b": ["open_clip"]}}
    assert lines[1]["skipped"] == "missing modules: open_clip"


@pytest.mark.slow
def test_rehearsal_runs_the_pipeline_through_one_training_run(tmp_path):
    """bench/rehearsal.py at 8 images: mirror, download, random ViT-B-32 features, entropy,
    D-/D+, teacher_neg for 1 step; a rate and an extrapolation per stage in its JSON."""
    out = tmp_path / "r.json"
    target = "results/runs/teacher_neg/summary.json"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench/rehearsal.py"),
            "--images",
            "8",
            "--steps",
            "1",
            "--work",
            str(tmp_path / "w"),
            "--out",
            str(out),
            "--workers",
            "0",
            "--target",
            target,
        ],
        check=True,
        timeout=1200,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    result = json.loads(out.read_text())
    rules = {row["rule"] for row in result["stages"]}
    assert {
        "prepare_data",
        "extract_features",
        "retrieval_entropy",
        "split_entropy",
        "train_run",
    } <= rules
    train = next(row for row in result["stages"] if row["rule"] == "train_run")
    assert train["steps"] == 1 and train["full_steps"] == 88_770
    assert all(row["extrapolated_s"] > 0 for row in result["stages"])
    assert result["totals"]["one_device_s"] >= result["totals"]["devices_s"] > 0


def test_the_docs_coco_table_is_the_scripts_output():
    """docs/performance.md's "COCO on one GPU" table is bench/coco_table.py's rendering of the
    rehearsal JSON it names (regenerate: coco_table.py LABEL=FILE ... --write), never typed."""
    import coco_table

    inputs = coco_table.DOCS_INPUTS
    results = {label: json.loads(path.read_text()) for label, path in inputs.items()}
    doc = (REPO / "docs/performance.md").read_text()
    block = doc.split(coco_table.BEGIN + "\n")[1].split(coco_table.END)[0]
    assert block == coco_table.table(results, rehearsal.load_coco())
    assert block.count("\n| train_run/") == len(rehearsal.load_coco()["runs"])


def test_a_resumed_job_is_not_given_a_rate_in_the_coco_table():
    """The first 123,287-image run's data stage resumed a killed run's extraction: its rate
    would be that last run's, so the table says so instead; the second run's (the docs' column)
    ran whole and keeps its rate."""
    import coco_table

    def rows(path: Path) -> list[str]:
        result = json.loads(path.read_text())
        assert result["small_models"] and result["images"] == 123_287
        return coco_table.table({"full": result}, rehearsal.load_coco()).splitlines()

    first = rows(REPO / "docs/rehearsal/scale/first-full-123287.json")
    assert "| prepare_data | images | resumed: its last run only | - |" in first
    assert "| neighbours | images | 200 images/s | 0.17 |" in first
    assert "| train_run/reference | steps | small models | - |" in first
    second = rows(coco_table.DOCS_INPUTS[next(reversed(coco_table.DOCS_INPUTS))])
    assert "| prepare_data | images | 204 images/s | 0.17 |" in second


def test_the_docs_scale_table_is_the_scripts_output():
    """docs/performance.md's "COCO's shape on a CPU" tables are bench/scale_table.py's rendering
    of the rehearsal JSONs it names (regenerate: scale_table.py FILE ... --write --block NAME),
    never typed."""
    import scale_table

    doc = (REPO / "docs/performance.md").read_text()
    for name, paths in scale_table.DOCS_BLOCKS.items():
        begin, end = scale_table.markers(name)
        block = doc.split(begin + "\n")[1].split(end)[0]
        assert block == scale_table.tables([json.loads(p.read_text()) for p in paths]), name


def test_the_docs_job_peaks_table_is_the_scripts_output():
    """docs/performance.md's per-job peaks (the split, the entropy report, every training run)
    are bench/job_peaks.py's rendering of the JSON it wrote, with every job measured at both
    sizes (regenerate: job_peaks.py SMALL LARGE --out FILE --from-json --write)."""
    import job_peaks
    import scale_table

    doc = (REPO / "docs/performance.md").read_text()
    begin, end = scale_table.markers(job_peaks.BLOCK)
    block = doc.split(begin + "\n")[1].split(end)[0]
    result = json.loads((REPO / "docs/rehearsal/scale/job-peaks.json").read_text())
    assert block == job_peaks.table(result)
    assert all(not size["skipped"] for size in result["sizes"]), result


def test_a_resumed_jobs_numbers_are_marked_and_not_judged(tmp_path):
    """A job that reused a killed run's shards logs it; the table marks its cells and judges no
    goal on them (the 123,287-image run's features were computed over two sessions)."""
    import scale_table

    from distinctcap.core.usage import MARK

    usage = MARK + '{"wall_s": 1}\n'
    logs = {"first": "image shards: 0 reused, 9 to compute\n" + usage,
            "again": usage + "image shards: 121 reused, 0 to compute\n" + usage,
            "fresh": "image shards: 3 reused, 0 to compute\n" + usage
                     + "image shards: 0 reused, 9 to compute\n" + usage}  # fmt: skip
    for name, text in logs.items():
        (tmp_path / f"{name}.log").write_text(text)
    assert {n: rehearsal.resumed(tmp_path / f"{n}.log") for n in logs} == {
        "first": False, "again": True, "fresh": False}  # fmt: skip

    def result(images: int, was_resumed: bool) -> dict:
        job = {"log": "features/extract_features", "wall_s": 10.0, "cpu_s": 9.0,
               "peak_rss_mb": 100.0, "children_peak_rss_mb": 0.0, "written_mb": 5.0,
               "resumed": was_resumed}  # fmt: skip
        return {"images": images, "usage": [job]}

    table = scale_table.stage_table([result(10, False), result(40, True)])
    assert "| extract_features (1) | 10 / 10† |" in table
    assert "resumed†: not judged" in table and scale_table.RESUMED_NOTE in table
    assert "one size" in scale_table.stage_table([result(40, False)])
    three = scale_table.stage_table([result(10, False), result(40, False), result(80, False)])
    assert "| goal, 40 against 10 | goal, 80 against 10 |" in three
    assert "x4.0, RSS x1.00 met | CPU x1.0 of images x8.0, RSS x1.00 met |" in three


def test_quadratic_stages_are_judged_against_the_train_images_squared():
    """The retrieval entropy (every train caption over every train image) and the neighbours
    (every train image against every other) do work in N²: 4x the train images may take 16x
    the CPU, not 4x; the linear stages are judged on all the images."""
    import scale_table

    small, large = ({"cpu_s": cpu, "peak_rss_mb": 100.0, "resumed": False} for cpu in (1, 15))
    assert scale_table.GOALS["retrieval_entropy"] == scale_table.GOALS["neighbours"] == "quadratic"
    ratios = {"images": 2.0, "train images": 4.0}
    said = scale_table.verdict("quadratic", small, large, ratios)
    assert said == "CPU x15.0 of train images² x16.0, RSS x1.00 met"
    assert scale_table.verdict("linear", small, large, ratios) == (
        "CPU x15.0 of images x2.0, RSS x1.00 MISSED"
    )


def test_the_train_images_are_those_each_rehearsal_kept():
    """The rehearsal keeps COCO's 5,000 val and test images at every size, so its train split
    grows faster than its images; the train images of each committed run (synthcoco's layout
    less its truncated files) add up, with the val and test ones, to the images the data stage
    counted, and a run that kept other images is refused."""
    import scale_table

    paths = {p for block in scale_table.DOCS_BLOCKS.values() for p in block}
    train = {}
    for path in sorted(paths):
        result = json.loads(path.read_text())
        train[result["images"]] = scale_table.work_sizes(result)["train images"]
        assert result["kept_images"] == result["data"]["counts"]["images"]
    assert train[10_000] == 4_995 and train[123_287] == 118_171
    with pytest.raises(ValueError, match="kept 9,989 images, not the 9,990"):
        scale_table.work_sizes({"images": 10_000, "kept_images": 9_989})


def test_a_killed_rehearsals_lock_is_lifted_before_it_resumes(tmp_path, capsys):
    """A session's end kills a long rehearsal; Snakemake's lock stays, and the resumed run would
    stop on LockException. The rehearsal unlocks its own WORK first, saying so."""
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text(str(tmp_path / "results/data/images.parquet") + "\n")
    snakemake = Path(sys.executable).with_name("snakemake")
    command = [str(snakemake), "--snakefile", str(REPO / "Snakefile"), "--directory",
               str(tmp_path), "--cores", "1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    rehearsal.unlock_after_a_kill(command, tmp_path, env)
    assert not locks.is_dir() or not any(locks.iterdir())
    assert "locked by a run that was killed" in capsys.readouterr().out


def test_a_resumed_rehearsal_serves_its_mirror_on_the_same_port(tmp_path):
    """The port is part of data.coco.base_url, a param of prepare_data: a new one on resume
    made Snakemake redo the data stage and everything after it (seen at 123,287 images)."""
    with rehearsal.mirror_server(tmp_path) as first:
        url = first.url
    with rehearsal.mirror_server(tmp_path) as second:
        assert second.url == url
        with rehearsal.mirror_server(tmp_path) as third:  # the port is taken: another one
            assert third.url != url
    assert json.loads((tmp_path / "port.json").read_text())["port"] == int(third.url.split(":")[-1])


def test_a_resumed_rehearsal_keeps_its_first_disk_plan(tmp_path):
    """Resumed after its archives were extracted, preflight plans 0 bytes to download: the
    disk is compared with the first run's plan (the 123,287-image run's table showed 0 GB)."""
    first = [{"part": "download", "bytes": 9_890_000_000, "how": "the mirror's sizes"}]
    assert rehearsal.first_plan(tmp_path, lambda: first) == first
    again = [{"part": "download", "bytes": 0, "how": "extracted sizes"}]
    assert rehearsal.first_plan(tmp_path, lambda: again) == first
