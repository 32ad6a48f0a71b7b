"""The file sources (issue 33): any Karpathy-format split file (data.source karpathy) and a
folder of images with a captions file (data.source folder), each built here from a small
shapes world, read, checked, and run through the whole DAG of a shrunk config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHIPPED_CLIP, copy_workflow, snakemake, tiny_config

from distinctcap.config.check import load_schema, validate
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_json, read_table
from distinctcap.data import folder, quality, shapes
from distinctcap.data.prepare import prepare
from distinctcap.runs.cli import main
from distinctcap.scores.result import KEYS

WORLD = {"n_train": 100, "n_val": 16, "n_test": 16, "image_size": 32, "seed": 3}
RESTVAL = 10  # the last training images are listed as restval, which joins train


def shapes_world(out):
    images, captions = shapes.generate(shapes.ShapesConfig(**WORLD), out)
    return images, captions


def build_karpathy(out) -> dict:
    """dataset_tiny.json over images/ (filepath + filename), restval among the train images;
    the last image has no filepath (Flickr's entries give only a filename)."""
    images, captions = shapes_world(out)
    entries = []
    for k, img in enumerate(images.itertuples()):
        split = "restval" if img.split == "train" and k >= WORLD["n_train"] - RESTVAL else img.split
        folder, name = img.file.split("/")
        mine = captions[captions.image_id == img.image_id]
        entries.append({
            "filepath": folder, "filename": name, "imgid": img.image_id, "split": split,
            "sentences": [{"raw": t.upper() + ".", "sentid": int(c), "tokens": t.split()}
                          for c, t in zip(mine.caption_id, mine.text, strict=True)],
        })  # fmt: skip
    last = entries[-1]
    shutil.copy(out / last["filepath"] / last["filename"], out / last["filename"])
    del last["filepath"]
    (out / "dataset_tiny.json").write_text(json.dumps({"images": entries, "dataset": "tiny"}))
    return {"source": "karpathy", "karpathy": {"file": str(out / "dataset_tiny.json"),
                                               "images": str(out)}}  # fmt: skip


BAD_ROWS = {  # what each planted row is set aside for
    "duplicate row": 1,
    "not a JSON line": 1,
    "no caption field": 1,
    "empty caption": 1,
    "caption is not valid UTF-8": 1,
    "missing file": 1,
    "unreadable image": 1,
    "outside the images folder": 4,
}


def outside_paths(out) -> dict[str, str]:
    """Image paths that lead out of the images folder `out`, each to a file that exists once
    `plant_outside` ran: a real PNG beside the folder (through `..`, by absolute path, through
    a symlink inside the folder) and /etc/passwd. name -> path as a source row gives it."""
    return {"dotdot": "../outside.png", "absolute": str(out.parent / "outside.png"),
            "passwd": "/etc/passwd", "symlink": "images/link.png"}  # fmt: skip


def plant_outside(out) -> dict[str, str]:
    """The files behind `outside_paths(out)`, which it returns."""
    beside = out.parent / "outside.png"
    shutil.copy(next((out / "images").glob("*.png")), beside)
    (out / "images" / "link.png").unlink(missing_ok=True)  # a second build of the same folder
    (out / "images" / "link.png").symlink_to(beside)
    return outside_paths(out)


def build_folder(out) -> dict:
    """captions.jsonl without splits (drawn by the seeded ratio) over images/, plus one bad
    row of each kind in BAD_ROWS."""
    images, captions = shapes_world(out)
    file_of = images.set_index("image_id").file
    lines = [json.dumps({"image": file_of[i], "caption": t})
             for i, t in zip(captions.image_id, captions.text, strict=True)]  # fmt: skip
    (out / "images" / "broken.png").write_bytes(b"\x89PNG\r\n not an image")
    lines += [json.dumps({"image": path, "caption": "a red circle"})
              for path in plant_outside(out).values()]  # fmt: skip
    lines += [
        lines[0],
        "{not json",
        json.dumps({"image": file_of[0]}),
        json.dumps({"image": file_of[1], "caption": "  "}),
        json.dumps({"image": "images/gone.png", "caption": "a red circle"}),
        json.dumps({"image": "images/broken.png", "caption": "a blue square"}),
    ]
    text = "\n".join(lines).encode() + b'\n{"image": "' + file_of[2].encode() + b'", '
    text += b'"caption": "caf\xe9 au lait"}\n'
    (out / "captions.jsonl").write_bytes(text)
    captions_file = str(out / "captions.jsonl")
    return {"source": "folder", "folder": {"images": str(out), "captions": captions_file}}


BUILD = {"karpathy": build_karpathy, "folder": build_folder}


def prepared(tmp_path, source, on_bad_input="skip"):
    data = validate({"data": BUILD[source](tmp_path / "in"), "runs": {"r": {"method": "mle"}}},
                    load_schema())["data"]  # fmt: skip
    out = tmp_path / "data"
    outputs = {n: out / f"{n}.parquet" for n in ("images", "captions", "quarantine")}
    prepare(data, on_bad_input, {**outputs, "vocab": out / "vocab.json"})
    tables = {n: read_table(p) for n, p in outputs.items()}
    return tables, read_json(out / "counts.json")


@pytest.fixture
def tmp_in(tmp_path):
    (tmp_path / "in").mkdir()
    return tmp_path


def test_karpathy_file_gives_the_tables_of_its_images_and_sentences(tmp_in):
    tables, counts = prepared(tmp_in, "karpathy")
    images, captions = tables["images"], tables["captions"]
    assert images.split.value_counts().to_dict() == {"train": 100, "val": 16, "test": 16}
    assert len(tables["quarantine"]) == 0 and counts["skipped"] == 0
    assert counts["checked_image_kinds"] == {"RGB": len(images)}  # the data report's kinds
    assert captions.text.str.match(r"^[a-z0-9 ]+$").all()  # normalised: "A RED CIRCLE." -> ...
    last = images.set_index("image_id").file[WORLD["n_train"] + 31]
    assert last.endswith("/in/0000131.png")  # a filename without filepath


def test_folder_sets_aside_each_bad_row_with_its_reason_and_counts_it(tmp_in):
    tables, counts = prepared(tmp_in, "folder")
    q, images = tables["quarantine"], tables["images"]
    reasons = " | ".join(q.reason)
    for reason in BAD_ROWS:
        assert reason in reasons, reason
    images_set_aside = q[q.kind == "image"]
    assert sorted(images_set_aside.file) == ["images/broken.png", "images/gone.png"]
    # every row of the file is either a caption in the tables or a quarantined row
    rows = (tmp_in / "in" / "captions.jsonl").read_bytes().count(b"\n")
    assert len(tables["captions"]) + (q.kind == "caption").sum() == rows
    assert counts["skipped"] == len(q) and sum(counts["skipped_by_reason"].values()) == len(q)
    assert counts["skipped_by_reason"]["caption: empty caption"] == 1
    assert counts["skipped_by_reason"]["caption: outside the images folder"] == 4
    sizes = images.split.value_counts()  # 134 files drawn 10 % val, 10 % test; 132 usable
    assert sizes.sum() == 132 and 11 <= sizes.val <= 13 and 11 <= sizes.test <= 13


def test_folder_rows_naming_a_path_out_of_the_folder_are_set_aside_before_any_file_opens(tmp_in):
    tables, _ = prepared(tmp_in, "folder")
    q = tables["quarantine"]
    outside = q[q.reason == "outside the images folder"]
    assert sorted(outside.file) == sorted(outside_paths(tmp_in / "in").values())
    assert (outside.kind == "caption").all()
    root = (tmp_in / "in").resolve()
    assert all(Path(f).resolve().is_relative_to(root) for f in tables["images"].file)


def test_karpathy_entries_out_of_the_images_folder_are_quarantined_with_their_captions(tmp_in):
    """Karpathy's filepath/filename through `..`, an absolute filename, a symlink out: each image
    set aside as outside the images folder (never opened), its sentences with it."""
    spec = build_karpathy(tmp_in / "in")
    planted = plant_outside(tmp_in / "in")
    data = json.loads(Path(spec["karpathy"]["file"]).read_text())
    escapes = {0: ("..", "outside.png"), 1: (None, planted["absolute"]), 2: ("/etc", "passwd"),
               3: ("images", "link.png")}  # fmt: skip
    for k, (filepath, name) in escapes.items():
        entry = data["images"][k]
        entry.pop("filepath")
        entry |= {"filename": name, **({"filepath": filepath} if filepath else {})}
    Path(spec["karpathy"]["file"]).write_text(json.dumps(data))
    data_cfg = validate({"data": spec, "runs": {"r": {"method": "mle"}}}, load_schema())["data"]
    out = tmp_in / "data"
    outputs = {n: out / f"{n}.parquet" for n in ("images", "captions", "quarantine")}
    prepare(data_cfg, "skip", {**outputs, "vocab": out / "vocab.json"})
    q = read_table(outputs["quarantine"])
    ids = [str(data["images"][k]["imgid"]) for k in escapes]
    images_out = q[q.kind == "image"]
    assert sorted(images_out.id) == sorted(ids)
    assert (images_out.reason == "outside the images folder").all()
    captions_out = q[q.kind == "caption"]
    assert captions_out.reason.str.contains("is missing or quarantined").all()
    assert len(captions_out) == sum(len(data["images"][k]["sentences"]) for k in escapes)
    with pytest.raises(DistinctcapError, match="outside the images folder"):
        prepare(data_cfg, "fail", {**outputs, "vocab": out / "vocab.json"})


def test_folder_paths_that_name_one_file_are_one_image(tmp_in):
    images, _ = shapes_world(tmp_in / "in")
    name = images.file[0]
    rows = [{"image": path, "caption": f"caption {k}"}
            for k, path in enumerate([name, f"./{name}", f"images/../{name}"])]  # fmt: skip
    (tmp_in / "in" / "captions.jsonl").write_text("\n".join(map(json.dumps, rows)))
    cfg = {"images": str(tmp_in / "in"), "captions": str(tmp_in / "in" / "captions.jsonl")}
    images, captions, bad = folder.read_folder(cfg)
    assert list(images.file) == [name] and len(captions) == 3 and not bad


def test_outside_follows_dotdot_and_symlinks_on_both_sides(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.png").write_bytes(b"")
    (root / "inner.png").symlink_to(root / "sub" / "a.png")
    (tmp_path / "via").symlink_to(root)  # a symlinked images folder is the folder
    for inside in ("sub/a.png", "sub/../sub/a.png", "inner.png", "missing.png",
                   str(root / "sub" / "a.png")):  # fmt: skip
        assert not quality.outside(root, inside) and not quality.outside(tmp_path / "via", inside)
    for escape in ("../root2/a.png", "sub/../../x.png", "/etc/passwd", "a\x00b.png"):
        assert quality.outside(root, escape), escape


def test_folder_split_is_seeded(tmp_in):
    first, _ = prepared(tmp_in, "folder")
    again, _ = prepared(tmp_in, "folder")
    pd.testing.assert_frame_equal(first["images"], again["images"])


def test_folder_under_fail_stops_at_the_first_bad_row(tmp_in):
    with pytest.raises(DistinctcapError, match=r"bad caption row \d+ .*duplicate row"):
        prepared(tmp_in, "folder", on_bad_input="fail")


@pytest.mark.parametrize("source, key", [("karpathy", "file"), ("folder", "images")])
def test_a_file_source_names_its_missing_key(source, key):
    with pytest.raises(DistinctcapError, match=rf"data\.{source}\.{key} is required"):
        validate({"data": {"source": source}, "runs": {"r": {"method": "mle"}}}, load_schema())


def shrunk(data: dict) -> dict:
    """tests/tiny_config.yaml on `data` with the shipped shapes CLIP as a weights file: one MLE
    run and its SMILE fine-tune, few steps."""
    config = tiny_config()
    config["data"] = data
    config["clip"] = {**config["clip"], "pretrained": str(SHIPPED_CLIP)}  # no CLIP training
    config["train"] = {**config["train"], "steps": 6, "val_every": 3, "checkpoint_every": 3}
    config["runs"] = {"reference": {"method": "mle", "data": "all"},
                      "smile": {"method": "smile", "init": "reference"}}  # fmt: skip
    config["decoding"] = {"greedy": {"kind": "greedy"}, "sample3": {"kind": "sample", "n": 3}}
    config["evaluate"] = {"oracle_ns": [3], "curve_ns": [1, 3], "self_retrieval_pool": 8}
    return config


@pytest.fixture(scope="module")
def file_dag(tmp_path_factory):
    """source -> the experiment folder of the shrunk config's whole DAG on that source, run
    once per module."""
    done = {}

    def run(source: str):
        if source not in done:
            workdir = copy_workflow(tmp_path_factory.mktemp(f"dag-{source}"))
            (workdir / "in").mkdir()
            config = shrunk(BUILD[source](workdir / "in"))
            result = snakemake(workdir, config=config, timeout=1500)
            assert result.returncode == 0, result.stderr[-4000:]
            done[source] = workdir
        return done[source]

    return run


@pytest.mark.parametrize("source", ["karpathy", "folder"])
def test_the_whole_dag_runs_on_a_file_source(source, file_dag):
    workdir = file_dag(source)
    summary = pd.read_csv(workdir / "results/metrics/summary.csv")
    assert set(summary.run) == {"reference", "smile"} and summary.cider.notna().all()
    quarantine = read_table(workdir / "results/data/quarantine.parquet")
    assert quarantine.empty == (source == "karpathy")
    tables = (workdir / "results/report/tables.md").read_text()
    assert ("Not comparable with own-data runs" in tables) == (source == "folder")


# ---------------------------------------------------------------------------------------------
# distinctcap evaluate


def results_entries(generated: pd.DataFrame) -> list[dict]:
    """A generated table as a results file: each image's samples in order."""
    rows = generated.sort_values(["image_id", "sample"])
    return [{"image_id": int(i), "caption": t} for i, t in zip(rows.image_id, rows.text,
                                                               strict=True)]  # fmt: skip


def test_evaluate_scores_a_results_file_as_the_evaluate_rule_and_reports_bad_entries(
    file_dag, tmp_path, capsys
):
    """The run's own sampled captions, exported, score the evaluate rule's numbers; the same
    file with bad entries scores the same numbers and names each bad entry."""
    workdir = file_dag("folder")
    results = workdir / "results"
    generated = read_table(results / "generated/reference/test-sample3.parquet")
    entries = results_entries(generated)
    images = read_table(results / "data/images.parquet")
    quarantined = read_table(results / "data/quarantine.parquet")
    broken = int(quarantined[quarantined.kind == "image"].id.iloc[0])
    train_image = int(images[images.split == "train"].image_id.iloc[0])
    bad = [*entries, {"image_id": 99999, "caption": "a red circle"},
           {"image_id": entries[0]["image_id"], "caption": "  "},
           {"image_id": broken, "caption": "a blue square"},
           {"image_id": train_image, "caption": "a red circle"}, {"caption": "no id"}]  # fmt: skip
    (tmp_path / "ours.json").write_text(json.dumps(entries))
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    out = tmp_path / "scores.csv"
    code = main(["evaluate", str(tmp_path / "ours.json"), "--versus", str(tmp_path / "bad.json"),
                 "--data", str(results / "data"), "--configfile", str(workdir / "config.yaml"),
                 "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr()
    assert code == 1  # entries were set aside
    expected = {99999: "unknown image id", entries[0]["image_id"]: "empty caption",
                broken: "missing image", train_image: "unknown image id: a train image",
                f"entry {len(bad) - 1}": "not an object"}  # fmt: skip
    for item, reason in expected.items():
        assert f"bad: image {item}: {reason}" in printed.err, (item, printed.err)
    assert "set aside 5 entries" in printed.err and "CIDEr" in printed.out
    assert "+0.000 [+0.000, +0.000]" in printed.out  # the same captions on both sides

    rule = read_table(results / "metrics/reference/test-sample3.parquet").iloc[0]
    scores = pd.read_csv(out)
    assert list(scores.columns) == list(pd.read_csv(results / "metrics/summary.csv").columns)
    assert list(scores.run) == ["ours", "bad"]
    keys = {*KEYS, "seed"}  # the summary's row keys; self_* needs the captioner
    own = [c for c in scores.columns if c not in keys and not c.startswith("self_")]
    for _, row in scores.iterrows():
        assert row[own].astype(float).tolist() == pytest.approx(
            rule[own].astype(float).tolist(), rel=1e-9, nan_ok=True
        )
