"""The judge CLIP (evaluate.judge): its config checks, its training fingerprint against the
shipped weights' recipe, its pooled features, its metrics on a random-init shapes-rn-judge
checked by hand from the cosines, and fetch / preflight naming its weights. No DAG."""

import dataclasses
import json
import math

import numpy as np
import open_clip
import pandas as pd
import pytest
import torch
from conftest import ROOT
from evaluate_world import build
from PIL import Image

from distinctcap.clip.load import load_clip
from distinctcap.config.check import load_schema, validate
from distinctcap.core.configfile import merge_configs, read_configs
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_table, write_table
from distinctcap.core.settings import EvalSettings, JudgeSettings
from distinctcap.evaluate import judge
from distinctcap.evaluate.device import PER_IMAGE, clip_metrics, device_metrics, encode_texts
from distinctcap.evaluate.inputs import DecodingInputs, EvalPaths
from distinctcap.evaluate.metrics import CLIPSCORE_PREFIX
from distinctcap.evaluate.stage import metric_columns
from distinctcap.features.extract import FeatureSettings
from distinctcap.features.pooled import extract_pooled, read_pooled
from distinctcap.runs import preflight as pf
from distinctcap.train.clip import TrainSettings, TrainSplit, save_weights, train_fingerprint

SCHEMA = load_schema()
RUNS = {"runs": {"reference": {"method": "mle"}}}
ARCH = "shapes-rn-judge"
SETTINGS = EvalSettings(retrieval_ks=[1, 2])


def config(**evaluate) -> dict:
    return validate({**RUNS, "evaluate": evaluate}, SCHEMA)


# --- config ------------------------------------------------------------------------------------


def test_no_judge_configured_skips_every_judge_column_with_the_reason():
    assert JudgeSettings.from_config(config()) is None
    assert JudgeSettings.from_config(config(judge=None)) is None
    out, per_caption = judge.judge_metrics(None, [3, 4], ["a", "b"], [["a"], ["b"]], SETTINGS,
                                           clip_metrics)  # fmt: skip
    names = ["judge_r_at_1", "judge_r_at_2", "judge_mean_rank", "judge_clipscore",
             "judge_refclipscore"]  # fmt: skip
    assert list(out.values) == names and all(math.isnan(v) for v in out.values.values())
    assert out.skipped == dict.fromkeys(names, "no judge CLIP configured (evaluate.judge)")
    assert per_caption["judge_rank"].isna().all() and np.isnan(per_caption["judge_clipscore"]).all()


def test_judge_columns_follow_refclipscore_and_per_image_holds_the_judges():
    columns = metric_columns(SETTINGS)
    at = columns.index("refclipscore")
    assert columns[at + 1 : at + 6] == judge.judge_columns(SETTINGS.retrieval_ks)
    assert PER_IMAGE[3:5] == ("judge_rank", "judge_clipscore")


def test_a_judge_fills_its_defaults_and_a_judge_equal_to_the_trainers_clip_is_refused():
    block = config(judge={"arch": ARCH})["evaluate"]["judge"]
    assert JudgeSettings(**block) == JudgeSettings(ARCH, "train", None, 1, block["train"])
    assert block["train"] == validate(RUNS, SCHEMA)["clip"]["train"]  # clip.train's defaults
    with pytest.raises(DistinctcapError) as error:  # shapes-rn-tiny, trained, the same seed 0
        config(judge={"arch": "shapes-rn-tiny", "seed": 0})
    assert str(error.value).startswith("evaluate.judge: the judge is the trainer's CLIP")
    assert "seed 0" in str(error.value)
    config(judge={"arch": "shapes-rn-tiny", "seed": 1})  # another seed: another CLIP
    tag = {"arch": "ViT-B-32", "pretrained": "openai"}
    with pytest.raises(DistinctcapError, match="^evaluate.judge: the judge is the trainer's"):
        validate({**RUNS, "clip": tag, "evaluate": {"judge": {**tag, "seed": 7}}}, SCHEMA)
    with pytest.raises(DistinctcapError, match="evaluate.judge.train.epoch"):
        config(judge={"arch": ARCH, "train": {"epoch": 3}})
    with pytest.raises(DistinctcapError, match="evaluate.judge: 'arch' is a required"):
        config(judge={"seed": 3})


def test_the_judges_training_fingerprint_is_the_shipped_judge_weights_recipe():
    """The default judge trains with the fingerprint of the weights shipped in assets/clip/:
    train_clip on config.yaml with seed 1, clip.arch shapes-rn-judge, clip.train.epochs 100."""
    default = read_configs([ROOT / "config.yaml"])
    ours = JudgeSettings.from_config(validate(default, SCHEMA))
    recipe = merge_configs(default, {"seed": 1, "clip": {"arch": ARCH, "train": {"epochs": 100}},
                                     "evaluate": {"judge": None}})  # fmt: skip
    recipe = validate(recipe, SCHEMA)
    split = TrainSplit(
        torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).view(2, 3, 4, 4),
        torch.arange(10).view(2, 5),
        pd.Series([1, 2]),
        np.arange(2),
        np.array([0, 1, 2]),
    )
    cpu = torch.device("cpu")
    judged = train_fingerprint(ours.arch, TrainSettings(**ours.train), ours.seed, cpu, split)
    shipped = train_fingerprint(
        recipe["clip"]["arch"], TrainSettings(**recipe["clip"]["train"]), recipe["seed"], cpu,
        split,
    )
    assert judged == shipped
    assert (judged["arch"], judged["seed"], judged["settings"]["epochs"]) == (ARCH, 1, 100)


# --- features and metrics on a random-init shapes-rn-judge -------------------------------------


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("judge")
    torch.manual_seed(0)
    model, _, _ = open_clip.create_model_and_transforms(ARCH)
    save_weights(model, folder / "judge.pt")
    return load_clip(ARCH, str(folder / "judge.pt"))


def test_shapes_rn_judge_is_shapes_rn_tiny_at_vision_width_12():
    tiny, ours = open_clip.get_model_config("shapes-rn-tiny"), open_clip.get_model_config(ARCH)
    assert ours["vision_cfg"].pop("width") == 12 and tiny["vision_cfg"].pop("width") == 16
    assert ours == tiny


def test_pooled_features_are_the_judges_normalised_embeddings_of_val_and_test(clip, tmp_path):
    rng = np.random.default_rng(0)
    files = []
    for k in range(5):
        files.append(str(tmp_path / f"{k}.png"))
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(files[-1])
    images = pd.DataFrame({"image_id": [14, 10, 12, 11, 13], "file": files,
                           "split": ["test", "train", "val", "train", "test"]})  # fmt: skip
    out = tmp_path / "judge" / "features.parquet"
    extract_pooled(images, clip, out, FeatureSettings(batch_size=2, workers=0))
    pooled, info = read_pooled(out, [14, 12, 13])
    assert info["arch"] == ARCH and info["pretrained"] == clip.pretrained
    with pytest.raises(DistinctcapError, match=r"no image features for image ids \[10\]"):
        read_pooled(out, [10])  # a training image: not embedded
    pixels = torch.stack([clip.preprocess(Image.open(files[k])) for k in (0, 2, 4)])
    with torch.inference_mode():
        want = clip.model.encode_image(pixels, normalize=True).numpy()
    np.testing.assert_allclose(pooled, want, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1.0, rtol=1e-5)


TEXTS = ["a red circle", "a blue square above a green triangle", "two yellow stars"]
REFS = [["a red circle", "a circle"], ["a blue square", "shapes"], ["stars", "a star"]]


def test_a_caption_whose_embedding_is_its_images_ranks_first(clip):
    pooled = encode_texts(clip, TEXTS)  # image i "is" caption i
    out, per_caption = judge.judge_scores(clip, TEXTS, REFS, pooled, SETTINGS, clip_metrics)
    assert per_caption["judge_rank"].tolist() == [1, 1, 1]
    assert out["judge_r_at_1"] == 1.0 and out["judge_mean_rank"] == 1.0


def test_judge_ranks_clipscore_and_refclipscore_by_hand_from_the_cosines(clip):
    """Hessel et al. 2021: CLIP-S = 2.5 max(cos(c, v), 0) (eq. 1); RefCLIP-S = the harmonic
    mean of CLIP-S and max(max_r cos(c, r), 0) over the references r (eq. 2)."""
    rng = np.random.default_rng(1)
    pooled = rng.normal(size=(3, clip.model.text_projection.shape[1])).astype(np.float32)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    out, per_caption = judge.judge_scores(clip, TEXTS, REFS, pooled, SETTINGS, clip_metrics)
    plain = encode_texts(clip, TEXTS)
    cos = plain @ pooled.T
    ranks = [1 + int((cos[i] > cos[i, i]).sum()) for i in range(3)]
    assert per_caption["judge_rank"].tolist() == ranks
    assert out["judge_mean_rank"] == pytest.approx(np.mean(ranks))
    assert out["judge_r_at_2"] == pytest.approx(np.mean([r <= 2 for r in ranks]))
    prefixed = encode_texts(clip, [CLIPSCORE_PREFIX + t for t in TEXTS])
    clip_s = [2.5 * max(float(prefixed[i] @ pooled[i]), 0.0) for i in range(3)]
    np.testing.assert_allclose(per_caption["judge_clipscore"], clip_s, rtol=1e-5)
    assert out["judge_clipscore"] == pytest.approx(np.mean(clip_s), rel=1e-5)
    refclip = []
    for i in range(3):
        refs = encode_texts(clip, [CLIPSCORE_PREFIX + r for r in REFS[i]])
        text_side = max(float((refs @ prefixed[i]).max()), 0.0)
        a = clip_s[i]
        refclip.append(0.0 if a + text_side == 0 else 2 * a * text_side / (a + text_side))
    assert out["judge_refclipscore"] == pytest.approx(np.mean(refclip), rel=1e-5)
    # caption 0 is its own first reference: max_r cos = 1, so RefCLIP-S = 2 CLIP-S / (CLIP-S + 1)
    assert refclip[0] == pytest.approx(2 * clip_s[0] / (clip_s[0] + 1), rel=1e-5)


def test_device_metrics_read_the_judge_features_into_the_row_and_the_per_image_table(
    clip, tmp_path_factory, tmp_path
):
    """The evaluation's torch part with a judge: its columns filled, its per-image values
    the row's (R@1 the share of rank 1, mean rank and CLIPScore the means), and the table
    written and read back through the per_image contract."""
    world = build(tmp_path_factory.getbasetemp() / "evaluate-world")
    features = tmp_path / "judge.parquet"
    extract_pooled(read_table(world.images), clip, features, FeatureSettings(workers=0))
    paths = EvalPaths(world.generated("perfect", "greedy"), world.images, world.captions,
                      world.vocab, world.features, judge_features=str(features))  # fmt: skip
    settings = dataclasses.replace(SETTINGS, self_retrieval_pool=0)
    part = device_metrics(paths, "test", settings, DecodingInputs.read(paths, "test"))
    row, table = part.result.values, part.per_image
    assert not any(name.startswith("judge_") for name in part.result.skipped)
    assert (table.judge_rank == 1).mean() == row["judge_r_at_1"]
    assert table.judge_rank.mean() == row["judge_mean_rank"]
    assert np.mean(table.judge_clipscore.to_numpy()) == row["judge_clipscore"]
    write_table(table[list(PER_IMAGE)], tmp_path / "per_image.parquet", "per_image")
    back = read_table(tmp_path / "per_image.parquet", "per_image")
    assert back.judge_rank.tolist() == table.judge_rank.tolist()
    without = device_metrics(dataclasses.replace(paths, judge_features=None), "test", settings)
    assert without.result.skipped["judge_mean_rank"] == judge.OFF
    assert without.result.values["r_at_1"] == row["r_at_1"]  # the trainer CLIP's unchanged
    write_table(without.per_image[list(PER_IMAGE)], tmp_path / "none.parquet", "per_image")
    assert read_table(tmp_path / "none.parquet", "per_image").judge_rank.isna().all()


# --- fetch and preflight -------------------------------------------------------------------------


def test_fetch_and_preflight_name_the_coco_judges_weights(tmp_path):
    from hub_cache import point_hub_at

    from distinctcap.runs.fetch import run_fetch

    coco = validate(read_configs([ROOT / "config.yaml", ROOT / "config.coco.yaml"]), SCHEMA)
    assert coco["evaluate"]["judge"] | {"train": None} == {
        "arch": "ViT-L-14", "pretrained": "openai", "seed": 1, "train": None
    }
    judge = {**coco["evaluate"]["judge"], "tag": None}  # as JudgeSettings reads it
    blocks = [("clip", coco["clip"]), ("evaluate.judge", judge)]
    assert pf.clip_blocks(coco) == blocks
    config = {"data": {"source": "shapes"}, "clip": {"arch": "ViT-B-32", "pretrained": "train"},
              "captioner": {}, "evaluate": {"judge": coco["evaluate"]["judge"]}}  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        point_hub_at(mp, tmp_path, offline=True)  # an empty hub cache: the judge is missing
        (line,) = pf.weights_lines(config)
        lines: list[str] = []
        code = run_fetch(config, offline=True, say=lines.append)
    assert line.startswith("evaluate.judge: clip.pretrained = 'openai'") and str(tmp_path) in line
    assert code == 1 and lines[0].startswith("missing  judge CLIP ViT-L-14 openai: ")
    assert lines[1] == "1 of 1 missing (above)"
    assert pf.weights_lines({**config, "evaluate": {"judge": None}}) == []


def test_distinctcap_evaluate_scores_a_results_file_by_the_judges_too(clip, tmp_path, capsys):
    """`distinctcap evaluate` on an experiment whose judge_features ran: the judge CLIP's and
    the scene judge's R@1 beside the trainer CLIP's in its headline; without the judge's
    features, the judge CLIP's column is left out (as in a config without a judge)."""
    import yaml
    from evaluate_world import config as world_config

    from distinctcap.runs.cli import main

    world = build(tmp_path / "world")
    (world.root / "config.yaml").write_text(yaml.safe_dump(world_config()))
    test = read_table(world.images).query("split == 'test'").image_id.astype(int).tolist()
    results = tmp_path / "mine.json"
    results.write_text(json.dumps([{"image_id": i, "caption": "a red circle"} for i in test]))
    command = ["evaluate", str(results), "--data", str(world.root / "data"),
               "--configfile", str(world.root / "config.yaml")]  # fmt: skip
    assert main(command) == 0
    without = capsys.readouterr().out.splitlines()[0]
    assert "scene R@1 ↑" in without and "judge R@1 ↑" not in without
    extract_pooled(read_table(world.images), clip, world.root / "judge" / "features.parquet",
                   FeatureSettings(workers=0))  # fmt: skip
    assert main(command) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "| R@1 ↑ | judge R@1 ↑ | scene R@1 ↑ |" in header
