"""The data stage: shapes world, tokeniser, quarantine of bad input, the rule itself."""

import json

import pandas as pd
import pytest
from conftest import snakemake, tiny_config
from PIL import Image

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_table
from distinctcap.data import shapes
from distinctcap.data.prepare import prepare, tokenize
from distinctcap.data.quality import check_tables
from distinctcap.data.tokenizer import BOS, EOS, PAD, CaptionTokenizer

SMALL = shapes.ShapesConfig(n_train=30, n_val=5, n_test=5)


def test_generator_is_deterministic_from_the_seed(tmp_path):
    images_a, captions_a = shapes.generate(SMALL, tmp_path / "a")
    images_b, captions_b = shapes.generate(SMALL, tmp_path / "b")
    pd.testing.assert_frame_equal(captions_a, captions_b)
    pd.testing.assert_frame_equal(images_a, images_b)
    for file in images_a.file:
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    _, captions_c = shapes.generate(shapes.ShapesConfig(n_train=30, n_val=5, n_test=5, seed=1),
                                    tmp_path / "c")
    assert not captions_a.text.equals(captions_c.text)


def test_scenes_and_captions_cover_the_world(tmp_path):
    images, captions = shapes.generate(shapes.ShapesConfig(n_train=300, n_val=5, n_test=5),
                                       tmp_path)
    scenes = [json.loads(s) for s in images.scene]
    objects = [o for s in scenes for o in s["objects"]]
    assert {len(s["objects"]) for s in scenes} == {1, 2, 3}
    assert {o["shape"] for o in objects} == set(shapes.SHAPES)
    assert {o["colour"] for o in objects} == set(shapes.COLOURS)
    assert {s["background"] for s in scenes} == set(shapes.BACKGROUNDS)
    assert (captions.groupby("image_id").size() == 5).all()
    assert set(captions.level) == {0, 1, 2, 3}
    generic = captions[captions.level == 0].text
    assert generic.nunique() <= len(shapes.GENERIC)  # shared by many images
    assert captions[captions.level == 3].text.nunique() > 0.9 * len(images)
    assert not captions.text.str.contains(r"\ba [aeiou]").any()


def test_specific_caption_matches_its_scene():
    scene = {"background": "grey", "objects": [
        {"shape": "circle", "colour": "red", "size": "small", "row": 1, "col": 0},
        {"shape": "square", "colour": "blue", "size": "large", "row": 1, "col": 2}]}
    scene["relations"] = shapes.relations(scene["objects"])
    assert scene["relations"] == [[0, "left of", 1], [1, "right of", 0]]
    import numpy as np

    text = shapes.caption(scene, "specific", np.random.default_rng(0))
    assert "red" in text and "blue" in text and "grey" in text
    assert ("left of" in text) or ("right of" in text)


def test_tokenizer_round_trip_and_clip_ids():
    texts = ["a small red circle left of a large blue square", "an image with shapes"]
    tok = CaptionTokenizer.fit(texts)
    for text in texts:
        ids = tok.encode(text)
        assert min(ids) > 3
        assert tok.decode([BOS, *ids, EOS, PAD]) == text
    from open_clip.tokenizer import SimpleTokenizer

    assert tok.to_clip(tok.encode(texts[0])) == SimpleTokenizer().encode(texts[0])
    assert tok.to_clip([PAD, BOS, EOS]) == [0, 49406, 49407]
    assert tok.encode("a purple star") == [tok.encode("a")[0], 3, 3]  # unseen -> unk


def test_tokenizer_save_load(tmp_path):
    tok = CaptionTokenizer.fit(["a red star"])
    tok.save(tmp_path / "vocab.json")
    assert CaptionTokenizer.load(tmp_path / "vocab.json").clip_ids == tok.clip_ids


def test_tokenize_fits_on_train_only():
    captions = pd.DataFrame({"text": ["a red star", "a blue box"], "split": ["train", "test"]})
    captions, tok = tokenize(captions)
    assert 3 in captions.tokens[1]  # "blue box" unseen in train


@pytest.fixture
def bad_world(tmp_path):
    images, captions = shapes.generate(SMALL, tmp_path)
    (tmp_path / images.file[0]).write_bytes((tmp_path / images.file[0]).read_bytes()[:60])
    (tmp_path / images.file[1]).unlink()
    Image.new("RGB", (4, 4)).save(tmp_path / images.file[2])  # fine, small but valid
    images = pd.concat([images, images.iloc[[3]]], ignore_index=True)  # duplicate image id
    captions["text"] = captions.text.astype(object)  # raw bytes can come from a json loader
    captions.loc[10, "text"] = "   "
    captions.loc[11, "text"] = b"caf\xe9 shapes"  # latin-1, not UTF-8
    captions.loc[12, "caption_id"] = captions.loc[13, "caption_id"]  # duplicate caption id
    return images, captions, tmp_path


def test_bad_input_is_quarantined_with_reasons(bad_world):
    images, captions, root = bad_world
    clean_images, clean_captions, quarantine = check_tables(images, captions, root, "skip")
    reasons = dict(zip(quarantine.id + ":" + quarantine.kind, quarantine.reason, strict=True))
    assert reasons["0:image"].startswith("unreadable image")
    assert reasons["1:image"] == "missing file"
    assert reasons["3:image"] == "duplicate image_id"
    assert reasons[f"{captions.caption_id[10]}:caption"] == "empty caption"
    assert reasons[f"{captions.caption_id[11]}:caption"] == "caption is not valid UTF-8"
    assert reasons[f"{captions.caption_id[13]}:caption"] == "duplicate caption_id"
    assert "its image 0 is missing or quarantined" in reasons["0:caption"]
    assert set(clean_images.image_id) == set(range(40)) - {0, 1}
    kept = len(clean_captions) + (quarantine.kind == "caption").sum()
    assert kept == len(captions)  # nothing lost: every caption is kept or listed


def test_bad_input_fails_naming_the_first_item(bad_world):
    images, captions, root = bad_world
    with pytest.raises(DistinctcapError, match=r"bad image 3 .*duplicate image_id"):
        check_tables(images, captions, root, "fail")


def test_prepare_writes_checked_tables(tmp_path):
    outputs = {k: tmp_path / f"{k}.parquet" for k in ("images", "captions", "quarantine")}
    outputs["vocab"] = tmp_path / "vocab.json"
    counts = prepare({"source": "shapes", "shapes": {"n_train": 20, "n_val": 4, "n_test": 4}},
                     "skip", outputs)
    assert counts == {"images": 28, "captions": 140, "skipped": 0, "vocab": counts["vocab"],
                      "checked_image_kinds": {"RGB": 28}}  # fmt: skip
    captions = read_table(outputs["captions"], "captions")
    tok = CaptionTokenizer.load(outputs["vocab"])
    assert [tok.decode(t) for t in captions.tokens[:5]] == captions.text[:5].tolist()
    images = read_table(outputs["images"], "images")
    assert Image.open(images.file[0]).size == (64, 64)


def test_data_rule_runs_once_and_reruns_on_a_data_edit(workdir):
    config = tiny_config()
    result = snakemake(workdir, "prepare_data", config=config)
    assert result.returncode == 0, result.stderr
    assert "skipped" not in (workdir / "logs/data/prepare_data.log").read_text()
    again = snakemake(workdir, "prepare_data", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    config["data"]["shapes"]["seed"] = 1
    edited = snakemake(workdir, "prepare_data", "-n", config=config)
    assert "prepare_data" in edited.stdout and "params" in edited.stdout.lower()
