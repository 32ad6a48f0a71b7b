"""A new user captions a folder of their own PNG/JPEG images with a run folder: one command
(`python -m distinctcap caption`, the `distinctcap` console script) or three lines of Python.
The run folder is built as rule run_card builds one (distinctcap.core.runcard), around a seeded
untrained captioner and CLIP, so no training is needed; the pipeline test captions with a
trained one."""

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, tiny_captioner
from PIL import Image, ImageDraw

from distinctcap.core.errors import DistinctcapError

pytestmark = pytest.mark.usefixtures("one_thread")
ARCH = "shapes-rn-tiny"


def save_clip(path, seed):
    import open_clip
    import torch

    from distinctcap.train.clip import save_weights

    torch.manual_seed(seed)
    save_weights(open_clip.create_model(ARCH), path)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """results/runs/smile of a results folder, as the pipeline leaves it."""
    import torch

    from distinctcap.clip.load import load_clip
    from distinctcap.core.io import write_json
    from distinctcap.core.runcard import write_run_card
    from distinctcap.data.tokenizer import CaptionTokenizer
    from distinctcap.features.extract import grid_token_count, manifest

    results = tmp_path_factory.mktemp("results")
    clip_path = results / "clip" / f"{ARCH}.pt"
    clip_path.parent.mkdir()
    save_clip(clip_path, seed=0)
    clip = load_clip(ARCH, str(clip_path))
    tokenizer = CaptionTokenizer.fit(["a red circle on a grey background", "a blue square"])
    tokenizer.save(results / "vocab.json")
    write_json({"manifest": manifest(clip, torch.float32)}, results / "index.json")
    blank = torch.zeros(1, 3, 64, 64)
    from distinctcap.features.extract import pooled_and_grid

    with torch.inference_mode():
        pooled, grid = pooled_and_grid(clip.model.visual, blank)
    assert grid.shape[1] == grid_token_count(clip)
    run = results / "runs" / "smile"
    run.mkdir(parents=True)
    tiny_captioner(tokenizer.vocab_size, grid.shape[-1], pooled.shape[-1]).save(run / "model.pt")
    decoding = {"greedy": {"kind": "greedy"}, "beam3": {"kind": "beam", "k": 3}}
    write_run_card(
        run, "smile", {"method": "smile", "init": "reference"}, decoding,
        results / "vocab.json", results / "index.json", str(clip_path),
    )
    return run


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A user's folder: PNG and JPEG of several sizes and modes, and three bad files."""
    folder = tmp_path_factory.mktemp("photos")
    for i, (size, mode, suffix) in enumerate(
        [((64, 64), "RGB", "png"), ((120, 90), "RGB", "jpg"), ((50, 70), "L", "PNG")]
    ):
        image = Image.new(mode, size, "grey" if mode == "RGB" else 128)
        ImageDraw.Draw(image).ellipse((5, 5, 30, 30), fill="red" if mode == "RGB" else 255)
        image.save(folder / f"good{i}.{suffix}")
    (folder / "empty.png").write_bytes(b"")
    (folder / "text.jpg").write_text("not an image")
    (folder / "cut.png").write_bytes((folder / "good0.png").read_bytes()[:60])
    (folder / "notes.txt").write_text("a folder's other files are not images and are left out")
    return folder


def cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "distinctcap", *map(str, args)],
        capture_output=True, text=True, env=env, timeout=600,
    )


def test_one_command_captions_a_folder_and_reports_each_bad_file(run_dir, photos, tmp_path):
    out, page = tmp_path / "captions.jsonl", tmp_path / "vis.html"
    done = cli("caption", run_dir, photos, "--out", out, "--html", page, "--device", "cpu")
    assert done.returncode == 1, done.stderr  # some files were bad; the rest were captioned
    lines = [line.split("\t") for line in done.stdout.splitlines()]
    captioned = {file: caption for file, caption, _ in lines}
    assert sorted(os.path.basename(f) for f in captioned) == ["good0.png", "good1.jpg", "good2.PNG"]
    assert all(captioned.values())
    assert all(sure.startswith("(mean token logprob -") for *_, sure in lines)
    assert all(sure.endswith("not calibrated)") for *_, sure in lines)  # the card predates it
    assert "run smile is not calibrated" in done.stderr
    assert "empty.png: not captioned: empty file (0 bytes)" in done.stderr
    assert "text.jpg: not captioned: unreadable image" in done.stderr
    assert "cut.png: not captioned: unreadable image" in done.stderr
    assert ("distinctcap: captioning 6 files with run smile (greedy) on cpu\n"
            in done.stderr.split("not captioned")[0])  # up front: how many, with what
    assert re.search(r"distinctcap: captioned 3 images in \d+\.\d s, 3 failed \(above: files "
                     r"that could not be read\)\n$", done.stderr), done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [os.path.basename(r["file"]) for r in rows] == sorted(
        p.name for p in photos.iterdir() if p.suffix.lower() != ".txt"
    )
    assert {r["file"]: r["caption"] for r in rows if "caption" in r} == captioned
    assert all(r["outside"] is None for r in rows if "caption" in r)
    text = page.read_text()
    assert text.count("<figure>") == 6 and "empty file" in text and "mean token logprob" in text
    assert str(photos) not in text  # names relative to the current folder, not absolute
    assert "overflow-wrap:anywhere" in text
    pictures = re.findall(r'<img src="([^"]+)"', text)  # embedded: the page can be shared
    assert len(pictures) == 3 and all(p.startswith("data:image/jpeg;base64,") for p in pictures)
    with Image.open(io.BytesIO(base64.b64decode(pictures[1].split(",")[1]))) as thumbnail:
        assert max(thumbnail.size) <= 256


def test_three_lines_of_python_give_the_commands_captions(run_dir, photos):
    from distinctcap import load_run

    run = load_run(run_dir, device="cpu")
    results = run.caption([photos / "good0.png", photos / "good1.jpg"])
    assert [os.path.basename(r["file"]) for r in results] == ["good0.png", "good1.jpg"]
    assert all(isinstance(r["caption"], str) and r["logprob"] < 0 for r in results)
    again = run.caption(photos / "good0.png")  # one path is fine too; greedy is deterministic
    assert again[0]["caption"] == results[0]["caption"]
    beam = run.caption([photos / "good0.png"], decoding="beam3")[0]
    assert beam["logprob"] >= results[0]["logprob"] - 1e-4  # beam finds no worse a caption
    with pytest.raises(DistinctcapError, match="choose one of beam3, greedy"):
        run.caption([photos / "good0.png"], decoding="beam7")


def test_the_api_takes_pil_images_and_names_a_wrong_type(run_dir, photos):
    from distinctcap import load_run

    run = load_run(run_dir, device="cpu")
    with Image.open(photos / "good0.png") as image:
        from_pil = run.caption(image)
        mixed = run.caption([image.convert("L"), photos / "good0.png"])
    assert from_pil[0]["file"] == "<PIL image 0>" and mixed[1]["file"].endswith("good0.png")
    assert from_pil[0]["caption"] == mixed[1]["caption"]  # the same pixels, the same caption
    for wrong in (42, [photos / "good0.png", b"bytes"]):
        with pytest.raises(DistinctcapError, match="cannot caption a (int|bytes): give image"):
            run.caption(wrong)


def test_the_console_script_is_the_module_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"distinctcap": "distinctcap.runs.cli:main"}
    done = cli("--help")
    assert done.returncode == 0 and "trains image captioners" in done.stdout
    from distinctcap.runs.cli import EXAMPLES, parser

    assert set(EXAMPLES) == set(parser()._subparsers._group_actions[0].choices)
    assert all(f"  {example}\n" in done.stdout + "\n" for example in EXAMPLES.values())


def test_a_run_whose_clip_is_missing_or_different_stops_naming_it(run_dir, tmp_path):
    from distinctcap import load_run

    moved = tmp_path / "moved"
    shutil.copytree(run_dir.parents[1], moved)  # the whole results folder moves: still fine
    assert load_run(moved / "runs" / "smile", device="cpu").name == "smile"
    clip = moved / "clip" / f"{ARCH}.pt"
    clip.unlink()
    with pytest.raises(DistinctcapError, match=f"CLIP {ARCH} at .*{ARCH}.pt, which is missing"):
        load_run(moved / "runs" / "smile", device="cpu")
    save_clip(clip, seed=1)  # another CLIP of the same architecture
    with pytest.raises(DistinctcapError, match="with weights sha256 .* but .* has"):
        load_run(moved / "runs" / "smile", device="cpu")
    done = cli("caption", moved / "runs" / "smile", clip)
    assert done.returncode == 2 and "meaningless captions" in done.stderr


def test_a_folder_without_a_card_says_what_it_is(tmp_path):
    done = cli("caption", tmp_path, tmp_path)
    assert done.returncode == 2 and "is not a finished run folder" in done.stderr


def test_runs_and_compare_list_the_results_folder(run_dir):
    results = run_dir.parents[1]
    listed = cli("runs", "--results", results)
    assert listed.returncode == 0, listed.stderr
    assert "| smile | smile |" in listed.stdout and "| - | - |" in listed.stdout  # no metrics yet
    missing = cli("compare", "--results", results)
    assert missing.returncode == 2 and "summary.csv does not exist" in missing.stderr


def test_compare_orders_reference_teachers_methods(tmp_path):
    from distinctcap.core.io import write_json
    from distinctcap.report.summary import SUMMARY_BASE, SUMMARY_TAIL, compare_table

    blocks = {
        "smile": {"method": "smile"},
        "teacher_neg": {"method": "mle", "data": "D-"},
        "reference": {"method": "mle", "data": "all"},
    }
    for name, block in blocks.items():  # the run cards' part that compare reads
        write_json({"name": name, "method": block["method"], "run": block},
                   tmp_path / "runs" / name / "run.json")
    rows = [
        {"run": run, "split": "test", "decoding": decoding, "cider": cider}
        for run, cider in (("smile", 1.4), ("teacher_neg", 0.6), ("reference", 1.0))
        for decoding in ("greedy", "sample5")
    ]
    (tmp_path / "metrics").mkdir()
    pd.DataFrame(rows).reindex(columns=[*SUMMARY_BASE, *SUMMARY_TAIL]).to_csv(
        tmp_path / "metrics" / "summary.csv", index=False
    )
    table = compare_table(tmp_path)
    names = [line.split(" | ")[0].strip("| ") for line in table.splitlines()[2:]]
    assert names == ["reference (MLE)", "teacher_neg (MLE on D-)", "smile"]
    assert "Div-2 (5 samples)" in table


def test_importing_the_package_and_the_command_loads_no_torch():
    code = (
        "import sys, distinctcap, distinctcap.runs.cli, distinctcap.core.runcard; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'open_clip'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.stdout.strip() == "[]"


class _RunsCode:
    """What a malicious model.pt holds: unpickling it calls open()."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _broken_copies(run_dir, tmp_path):
    """The probe's run folders: model.pt malicious, truncated, missing."""
    import torch

    folders = {}
    for kind in ("malicious", "truncated", "missing"):
        results = tmp_path / kind
        shutil.copytree(run_dir.parents[1], results)
        model = results / "runs" / "smile" / "model.pt"
        if kind == "malicious":
            torch.save({"kind": _RunsCode(tmp_path / "code-ran")}, model)
        elif kind == "truncated":
            model.write_bytes(model.read_bytes()[:1000])
        else:
            model.unlink()
        folders[kind] = results / "runs" / "smile"
    return folders


def test_a_broken_model_stops_caption_with_one_line_before_it_is_read(
    run_dir, photos, tmp_path, capsys
):
    from distinctcap.runs.cli import main  # the command, in this process (cli() starts one)

    for kind, folder in _broken_copies(run_dir, tmp_path).items():
        assert main(["caption", str(folder), str(photos / "good0.png"), "--device", "cpu"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"distinctcap: {folder / 'model.pt'} "), line
        assert ("is missing" if kind == "missing" else "was not loaded") in line
        assert "weights_only=False" not in line
    assert not (tmp_path / "code-ran").exists()
    (folder / "vocab.json").unlink()
    assert main(["caption", str(folder), str(photos / "good0.png"), "--device", "cpu"]) == 2
    assert f"{folder / 'vocab.json'} is missing" in capsys.readouterr().err


def test_a_malicious_model_with_a_matching_card_is_refused_naming_it(run_dir, tmp_path):
    """Someone sends a whole folder: the card's checksum matches the file, which holds code."""
    from distinctcap import load_run
    from distinctcap.core.io import file_sha256, read_json, write_json

    folder = _broken_copies(run_dir, tmp_path)["malicious"]
    card = read_json(folder / "run.json")
    write_json({**card, "model_sha256": file_sha256([folder / "model.pt"])}, folder / "run.json")
    with pytest.raises(DistinctcapError, match="holds more than weights, so it was not loaded"):
        load_run(folder, device="cpu")
    assert not (tmp_path / "code-ran").exists()


def test_the_clip_is_checked_before_it_is_deserialised(run_dir, tmp_path):
    """A file at the CLIP's path that is not the CLIP (here: code) is never unpickled."""
    import torch

    from distinctcap import load_run

    moved = tmp_path / "moved"
    shutil.copytree(run_dir.parents[1], moved)
    torch.save({"state_dict": _RunsCode(tmp_path / "code-ran")}, moved / "clip" / f"{ARCH}.pt")
    with pytest.raises(DistinctcapError, match="with weights sha256 .* but .* has"):
        load_run(moved / "runs" / "smile", device="cpu")
    assert not (tmp_path / "code-ran").exists()


def test_runs_marks_a_run_whose_model_is_gone_and_shows_none_of_its_numbers(run_dir, tmp_path):
    from distinctcap.report.summary import run_table

    results = tmp_path / "results"
    shutil.copytree(run_dir.parents[1], results)
    (results / "metrics").mkdir()
    summary = pd.DataFrame([{"run": "smile", "split": "test", "decoding": "greedy",
                             "cider": 1.234, "r_at_1": 0.5}])
    summary.to_csv(results / "metrics" / "summary.csv", index=False)
    assert "| 1.234 | 0.500 |" in run_table(results)
    (results / "runs" / "smile" / "model.pt").unlink()
    listed = run_table(results)
    assert "(stale: model.pt missing) | - | - |" in listed and "1.234" not in listed


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory):
    """A run folder on the shipped shapes CLIP, calibrated as rule run_card calibrates one on
    a small shapes world (its captioner untrained: the flag reads the CLIP's features)."""
    import torch

    from distinctcap import load_run
    from distinctcap.clip.load import load_clip
    from distinctcap.core.io import write_json
    from distinctcap.core.runcard import write_run_card
    from distinctcap.data import shapes
    from distinctcap.data.tokenizer import CaptionTokenizer
    from distinctcap.features.extract import manifest, pooled_and_grid
    from distinctcap.runs.calibrate import familiarity

    results = tmp_path_factory.mktemp("shapes")
    images, captions = shapes.generate(shapes.ShapesConfig(n_train=120, n_val=40, n_test=2),
                                       results / "data")
    clip_path = ROOT / "assets" / "clip" / f"{ARCH}.pt"
    clip = load_clip(ARCH, str(clip_path))
    tokenizer = CaptionTokenizer.fit(captions.text.tolist())
    tokenizer.save(results / "vocab.json")
    write_json({"manifest": manifest(clip, torch.float32)}, results / "index.json")
    with torch.inference_mode():
        pooled, grid = pooled_and_grid(clip.model.visual, torch.zeros(1, 3, 64, 64))
    run = results / "runs" / "reference"
    run.mkdir(parents=True)
    tiny_captioner(tokenizer.vocab_size, grid.shape[-1], pooled.shape[-1]).save(run / "model.pt")
    card = (run, "reference", {"method": "mle"}, {}, results / "vocab.json",
            results / "index.json", str(clip_path))
    write_run_card(*card)
    files = {split: [results / "data" / f for f in images[images.split == split].file]
             for split in ("train", "val", "test")}
    grids = [load_run(run, device="cpu").features(files[s])[1] for s in ("train", "val")]
    write_run_card(*card, familiarity=familiarity(*grids, held_out="val"))
    return run, files["test"]


def test_caption_flags_a_noise_image_and_not_a_shapes_image(shapes_run, tmp_path, capsys):
    import numpy as np

    from distinctcap.runs.cli import main  # the command, in this process (cli() starts one)

    run, (shapes_image, _) = shapes_run
    noise = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)).save(noise)
    out, page = tmp_path / "c.jsonl", tmp_path / "c.html"
    args = ["caption", run, shapes_image, noise, "--out", out, "--html", page, "--device", "cpu"]
    assert main(list(map(str, args))) == 0
    done = capsys.readouterr()
    flags = {os.path.basename(r["file"]): r["outside"]
             for r in map(json.loads, out.read_text().splitlines())}
    assert flags == {shapes_image.name: False, "noise.png": True}
    said = dict(line.split("\t", 1) for line in done.out.splitlines())
    assert "FAR FROM THE TRAINING IMAGES" in said[str(noise)]
    assert "like the training images" in said[str(shapes_image)]
    assert "1 image(s) are far from run reference's training images" in done.err
    assert page.read_text().count("class='outside'") == 1


def test_a_misspelt_run_folder_says_it_does_not_exist_and_the_name_meant(run_dir):
    """Issue 48 item 6: `runs/smil` said "it has no run.json" of a folder that is not there."""
    done = cli("caption", run_dir.parent / "smil", run_dir)
    assert done.returncode == 2
    assert done.stderr == (f"distinctcap: {run_dir.parent / 'smil'} does not exist; did you "
                           f"mean {run_dir}?\n")
    elsewhere = cli("caption", run_dir.parent / "zzz", run_dir).stderr
    assert f"does not exist; the run folders in {run_dir.parent} are smile" in elsewhere


def test_captioning_many_images_shows_progress_lines_off_a_terminal(
    run_dir, photos, monkeypatch, capsys
):
    """Issue 48 item 5: 2,400 images took minutes with nothing said between start and end."""
    from distinctcap.core import logs
    from distinctcap.runs.cli import main

    monkeypatch.setattr(logs, "PROGRESS_SECONDS", 0.0)  # a line at every update
    monkeypatch.setattr(logs, "QUICK_SECONDS", 0.0)
    assert main(["caption", str(run_dir), str(photos / "good0.png"), str(photos / "good1.jpg"),
                 "--device", "cpu"]) == 0  # fmt: skip
    said = capsys.readouterr().err.splitlines()
    assert "distinctcap: CLIP features: 2/2 images (" in "\n".join(said), said
    assert any(line.startswith("distinctcap: decode (greedy): 2/2 images (") for line in said)
    assert said[-1].startswith("distinctcap: captioned 2 images in ") and said[-1].endswith(
        " s, 0 failed")


@pytest.fixture(scope="module")
def world_run(tmp_path_factory):
    """A run folder in the evaluation world (tests/evaluate_world.py: a prepared shapes world,
    its CLIP features), where `results/runs/<run>` sits beside `results/data`."""
    from evaluate_world import build

    from distinctcap.core.runcard import write_run_card

    world = build(tmp_path_factory.getbasetemp() / "evaluate-world")
    run = world.root / "runs" / "caption-world"
    if not (run / "run.json").is_file():
        run.mkdir(parents=True, exist_ok=True)
        shutil.copy(world.model, run / "model.pt")
        write_run_card(run, "caption-world", {"method": "mle"}, {"greedy": {"kind": "greedy"}},
                       world.vocab, world.features, str(world.root / "clip.pt"))  # fmt: skip
    return world, run


def test_caption_out_gives_image_ids_and_evaluate_scores_it_as_it_is(world_run, tmp_path):
    """Issue 48 item 2: `caption --out` wrote `file` but no `image_id`, so its file could not
    be scored; now the lines of the experiment's images carry their id and split, and
    `distinctcap evaluate` reads the file as it is (the test split's lines)."""
    from distinctcap.core.io import read_table

    world, run = world_run
    images = read_table(world.images, "images")
    folder = Path(images.file.iloc[0]).parent
    outsider = tmp_path / "mine.png"
    Image.new("RGB", (40, 40), "blue").save(outsider)
    out = tmp_path / "captions.jsonl"
    done = cli("caption", run, folder, outsider, "--out", out, "--device", "cpu")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    ids = {Path(f).resolve(): (i, s) for f, i, s in zip(images.file, images.image_id,
                                                         images.split, strict=True)}  # fmt: skip
    for line in lines[:-1]:
        assert (line["image_id"], line["split"]) == ids[Path(line["file"]).resolve()], line
    assert len(lines) == len(images) + 1 and "image_id" not in lines[-1]  # not the data's
    config = tmp_path / "config.yaml"
    config.write_text("runs: {r: {method: mle}}\nevaluate: {oracle_ns: [1], curve_ns: [1], "
                      "self_retrieval_pool: 8, spice: false}\n")
    scored = cli("evaluate", out, "--data", world.root / "data", "--configfile", config,
                 "--out", tmp_path / "scores.csv")  # fmt: skip
    test = int((images.split == "test").sum())
    assert "CIDEr" in scored.stdout, scored.stderr[-3000:]
    assert f"| captions | {test} | 1 |" in scored.stdout, scored.stdout  # the test images
    assert pd.read_csv(tmp_path / "scores.csv").cider.notna().all()
    assert "set aside 1 entries (1 not an object with image_id and caption)" in scored.stderr


def test_a_caption_file_reads_as_results_entries_of_one_split():
    from distinctcap.evaluate.captionfile import parse_results, results_entries

    lines = [
        {"file": "a.png", "image_id": 1, "split": "test", "caption": "a red circle"},
        {"file": "b.png", "image_id": 2, "split": "train", "caption": "a blue square"},
        {"file": "c.png", "image_id": 3, "split": "test", "caption": "x", "samples": ["x", "y"]},
        {"file": "d.png", "image_id": 4, "split": "test", "error": "unreadable image"},
        {"file": "mine.png", "caption": "a dog"},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    assert results_entries(parse_results(text), "test") == [
        {"image_id": 1, "caption": "a red circle"}, {"image_id": 3, "caption": "x"},
        {"image_id": 3, "caption": "y"}, {"image_id": 4}, {"caption": "a dog"}]  # fmt: skip
    coco = [{"image_id": 1, "caption": "a red circle"}]
    assert results_entries(parse_results(json.dumps(coco)), "test") == coco  # as it is
    assert results_entries(parse_results(json.dumps(lines[0])), "test") == coco  # one line
    assert parse_results('{"image_id": 1}') == {"image_id": 1}  # refused by the reader
    with pytest.raises(ValueError, match="Expecting"):
        parse_results("[{not json")


def test_a_ctrl_c_is_one_line_that_says_how_to_resume(tmp_path):
    """Issue 48 item 3: Ctrl-C printed the traceback of wherever it landed. Interrupted while
    `caption` loads torch (once libtorch is mapped, inside the command), the command says one
    line and exits 130."""
    import signal
    import time

    command = [sys.executable, "-m", "distinctcap", "caption", str(tmp_path / "run"), "x.png"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    maps = f"/proc/{proc.pid}/maps"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if "libtorch" in open(maps).read():
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    said = err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("distinctcap caption: stopped by SIGINT; "), err
    assert said[0].endswith("run the same command again to finish it"), err
