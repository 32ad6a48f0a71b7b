"""The field's distinctiveness columns in the evaluate stage (evaluate.distinctive): CIDErBtw
and DisWordRate by the judge CLIP's similar images and, on the shapes world, the scene
graphs'; hand cases through the stage's functions."""

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from evaluate_world import build

from distinctcap.core.io import read_table
from distinctcap.core.settings import EvalSettings
from distinctcap.data.scene_retrieval import scene_key_matrix
from distinctcap.evaluate import judge
from distinctcap.evaluate.device import device_metrics
from distinctcap.evaluate.distinctive import (
    TOO_FEW,
    SimilarSets,
    distinctive_columns,
    similar_sets,
)
from distinctcap.evaluate.inputs import DecodingInputs, EvalPaths, read_generated
from distinctcap.evaluate.metrics import CocoTools, evaluate_captions
from distinctcap.evaluate.scene_judge import NO_SCENES
from distinctcap.evaluate.stage import evaluate_decoding
from distinctcap.features.pooled import MANIFEST_KEY
from distinctcap.scores.cider import CiderD
from distinctcap.scores.distinctive import SIMILAR_K, cider_btw, dis_word_rate, similar_images

SETTINGS = EvalSettings(oracle_ns=[], curve_ns=[], consensus_neighbours=2, hard_pool=1,
                        self_retrieval_pool=0)  # fmt: skip
COLUMNS = distinctive_columns()

# three images, each its own words; "ball" is said of a and of c, "box" of b and of c
GTS = {1: ["a red ball", "red ball"], 2: ["a blue box", "blue box"], 3: ["a red box", "a ball"]}


@pytest.fixture(scope="module")
def tools():
    with CocoTools() as session:
        yield session


def test_dis_word_rate_and_cider_btw_by_hand(tools):
    """Image 1's neighbour is 2, 2's is 1, 3's is 1. D(1) = {red, ball} - {blue, box}: "a red
    ball" has 2 distinctive words of 3; D(2) = {blue, box}: "a blue box" 2 of 3; D(3) =
    {red, box, ball} - {red, ball} = {box}: "a red box" 1 of 3 ("a" is a stop word). The
    captions of 1 and 2 share only "a" with their neighbour's references, which every image's
    references hold (idf 0): CIDErBtw exactly 0; image 3's shares "a red" with image 1's."""
    samples = {1: ["a red ball"], 2: ["a blue box"], 3: ["a red box"]}
    neighbours = {1: [2], 2: [1], 3: [1]}
    similar = SimilarSets({"": neighbours}, {"_scene": NO_SCENES})
    out = evaluate_captions(GTS, samples, similar=similar, tools=tools)
    assert out["dis_word_rate"] == pytest.approx((2 / 3 + 2 / 3 + 1 / 3) / 3)
    firsts = {i: caps[0] for i, caps in samples.items()}
    want = cider_btw(firsts, GTS, neighbours, scorer=CiderD(GTS.values()))
    assert want.per_image[1] == want.per_image[2] == 0.0 < want.per_image[3]
    assert out["cider_btw"] == pytest.approx(want.per_image[3] / 3, rel=1e-12)
    for column in ("cider_btw_scene", "dis_word_rate_scene"):
        assert math.isnan(out[column]) and out.skipped[column] == NO_SCENES


def test_a_caption_in_its_neighbours_words_has_no_distinctive_word(tools):
    """Image 3's caption in its neighbour's (image 1's) words: DisWordRate 0 instead of 1/3
    (D(3) = {box}), and CIDErBtw rises. D(1) = {} (image 3 says red and ball too), D(2) =
    {blue}: "blue box" 1 of 2."""
    similar = SimilarSets({"": {1: [3], 2: [3], 3: [1]}}, {"_scene": NO_SCENES})
    own = evaluate_captions(GTS, {1: ["red ball"], 2: ["blue box"], 3: ["a red box"]},
                            similar=similar, tools=tools)  # fmt: skip
    copied = evaluate_captions(GTS, {1: ["red ball"], 2: ["blue box"], 3: ["a red ball"]},
                               similar=similar, tools=tools)  # fmt: skip
    assert own["dis_word_rate"] == pytest.approx((0 + 1 / 2 + 1 / 3) / 3)
    assert copied["dis_word_rate"] == pytest.approx((0 + 1 / 2 + 0) / 3)
    assert copied["cider_btw"] > own["cider_btw"]


def test_similar_sets_name_why_a_space_has_none(caplog):
    images = pd.DataFrame({"image_id": [7, 8, 9]})  # no scene column: not the shapes world
    assert similar_sets(None, [7], images).skipped == dict.fromkeys(("", "_scene"), TOO_FEW)
    none = similar_sets(None, [7, 8, 9], images)
    assert none.neighbours == {} and none.skipped == {"": judge.OFF, "_scene": NO_SCENES}
    assert "capped to 2" in caplog.text  # K = 5 among 3 images


def test_scenes_holding_the_same_claims_are_each_others_most_similar():
    circle = {"background": "white", "relations": [],
              "objects": [{"shape": "circle", "colour": "red", "size": "small"}]}  # fmt: skip
    square = {**circle, "objects": [{"shape": "square", "colour": "blue", "size": "large"}]}
    both = {**circle, "objects": [*circle["objects"], *square["objects"]]}
    matrix = scene_key_matrix([json.dumps(circle), square, circle, both])
    assert matrix.shape[0] == 4 and set(np.unique(matrix)) == {0.0, 1.0}
    assert similar_images([10, 11, 12, 13], matrix, k=1) == {10: [12], 11: [13], 12: [10],
                                                             13: [10]}  # fmt: skip


# --- through the stage on the tiny shapes world ------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build(tmp_path_factory.getbasetemp() / "evaluate-world")


def write_judge_features(path, ids, pooled):
    """A judge features file by hand (features.pooled's layout): ids and their vectors."""
    table = pa.table({"image_id": pa.array(ids, pa.int64()),
                      "pooled": pa.array(list(pooled), pa.list_(pa.float32(), pooled.shape[1]))})
    meta = {MANIFEST_KEY: json.dumps({"arch": "by-hand", "pretrained": "none"})}
    pq.write_table(table.replace_schema_metadata(meta), path)  # fmt: skip


def evaluate(world, run, judge_features):
    paths = EvalPaths(world.generated(run, "greedy"), world.images, world.captions,
                      world.vocab, world.features, judge_features=judge_features)  # fmt: skip
    # the torch part without a judge (its columns are not these), as an evaluate_gpu job's
    part = device_metrics(replace(paths, judge_features=None), "test", SETTINGS,
                          DecodingInputs.read(paths, "test"))  # fmt: skip
    return evaluate_decoding(paths, "test", "greedy", SETTINGS, device=part)


def test_the_stage_scores_the_judges_and_the_scenes_similar_images(world, tmp_path):
    """Hand-placed judge embeddings on a circle: image k's similar images are the five
    nearest on it. The stage's columns are the metrics on the PTB tokens with those sets."""
    _, generated = read_generated(world.generated("perfect", "greedy"))
    ids = list(generated)
    angles = 2 * np.pi * np.arange(len(ids)) / len(ids)
    pooled = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    write_judge_features(tmp_path / "judge.parquet", ids[::-1], pooled[::-1])
    evaluations = {run: evaluate(world, run, str(tmp_path / "judge.parquet"))
                   for run in ("perfect", "generic")}  # fmt: skip
    neighbours = similar_images(ids, pooled, SIMILAR_K)
    assert neighbours[ids[0]][:2] in ([ids[1], ids[-1]], [ids[-1], ids[1]])
    captions = read_table(world.captions)
    test = captions[captions.split == "test"].groupby("image_id").text.agg(list)
    with CocoTools() as tools:
        refs, firsts = tools.tokenize_groups({i: test[i] for i in ids},
                                             {i: generated[i][:1] for i in ids})  # fmt: skip
    firsts = {i: caps[0] for i, caps in firsts.items()}
    row = evaluations["perfect"].row
    assert row["cider_btw"] == pytest.approx(cider_btw(firsts, refs, neighbours).corpus)
    assert row["dis_word_rate"] == pytest.approx(dis_word_rate(firsts, refs, neighbours).corpus)
    for run, evaluation in evaluations.items():
        assert not set(COLUMNS) & set(evaluation.skipped), run
        assert all(math.isfinite(evaluation.row[c]) for c in COLUMNS), run
    generic = evaluations["generic"].row  # "a picture of some shapes" for every image
    assert row["dis_word_rate"] > generic["dis_word_rate"]
    assert row["dis_word_rate_scene"] > generic["dis_word_rate_scene"]


def test_without_a_judge_the_judge_pair_is_skipped_and_the_scene_pair_is_not(world):
    evaluation = evaluate(world, "perfect", None)
    for column in ("cider_btw", "dis_word_rate"):
        assert math.isnan(evaluation.row[column]) and evaluation.skipped[column] == judge.OFF
    for column in ("cider_btw_scene", "dis_word_rate_scene"):
        assert column not in evaluation.skipped and math.isfinite(evaluation.row[column])
