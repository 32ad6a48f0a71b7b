"""Scene-graph precision/recall of captions on the shapes world."""

import json

import pytest

from distinctcap.data import shapes
from distinctcap.data.scene import parse, scene_f1, score_caption

SCENE = {"background": "grey", "objects": [
    {"shape": "circle", "colour": "red", "size": "small", "row": 1, "col": 0},
    {"shape": "square", "colour": "blue", "size": "large", "row": 1, "col": 2}]}
SCENE["relations"] = shapes.relations(SCENE["objects"])


def test_parse_objects_relations_background():
    claims = parse("on a grey background a tiny red disc to the left of a big blue box")
    assert claims.objects == [{"size": "small", "colour": "red", "shape": "circle"},
                              {"size": "large", "colour": "blue", "shape": "square"}]
    assert claims.relations == [(0, "left of", 1)]
    assert claims.background == "grey"


def test_fully_specific_true_caption_is_perfect():
    counts = score_caption("a small red circle left of a large blue square on a grey background",
                           SCENE)
    # 2 objects x 3 facts + 1 relation + background claimed, all correct; the scene has
    # 6 object facts + 2 relations (both directions) + background, all covered.
    assert counts == {"claims": 8, "correct": 8, "facts": 9, "covered": 9}


def test_wrong_details_cost_precision_generic_costs_recall():
    wrong = score_caption("a large green circle right of a blue square", SCENE)
    assert wrong["claims"] == 6 and wrong["correct"] == 3  # circle, square, blue square
    generic = score_caption("a picture of some shapes", SCENE)
    assert generic == {"claims": 0, "correct": 0, "facts": 9, "covered": 1 - 1}


def test_generated_world_captions_are_all_correct(tmp_path):
    images, captions = shapes.generate(shapes.ShapesConfig(n_train=50, n_val=1, n_test=1),
                                       tmp_path)
    scenes = dict(zip(images.image_id, images.scene, strict=True))
    result = scene_f1(captions.text.tolist(), [scenes[i] for i in captions.image_id])
    assert result["scene_precision"] == 1.0
    specific = captions[captions.level == 3]
    recall_specific = scene_f1(specific.text.tolist(), [scenes[i] for i in specific.image_id])
    generic = captions[captions.level == 0]
    recall_generic = scene_f1(generic.text.tolist(), [scenes[i] for i in generic.image_id])
    assert recall_specific["scene_recall"] > 0.5 > recall_generic["scene_recall"] == 0.0
    assert json.loads(scenes[0])["objects"]


def test_f1_of_nothing_claimed_is_zero():
    result = scene_f1(["some shapes"], [SCENE])
    assert result["scene_recall"] == 0.0 and result["scene_f1"] == 0.0
    assert result["scene_precision"] != result["scene_precision"]  # nan: nothing claimed


@pytest.mark.parametrize("text", ["", "a", "left of", "a red"])
def test_degenerate_text_parses(text):
    assert score_caption(text, SCENE)["claims"] == 0


def test_claim_marks_name_each_claim_right_or_wrong():
    from distinctcap.data.scene import claim_marks

    marks = claim_marks("a large green circle right of a blue square on a grey background", SCENE)
    assert marks == [("circle", True), ("green circle", False), ("large circle", False),
                     ("square", True), ("blue square", True),
                     ("large green circle right of blue square", False),
                     ("grey background", True)]
