"""The scene-retrieval judge on the shapes world: hand-built scenes, hand-computed ranks."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from distinctcap.core.io import read_table
from distinctcap.core.settings import EvalSettings
from distinctcap.data import shapes
from distinctcap.data.scene import claim_marks
from distinctcap.data.scene_retrieval import (
    hit_probability,
    scene_ranks,
    scene_retrieval,
    scene_scores,
    tied_counts,
)
from distinctcap.evaluate.device import PER_IMAGE
from distinctcap.evaluate.scene_judge import NO_SCENES, scene_retrieval_metrics
from distinctcap.evaluate.stage import Evaluation, metric_columns, scene_metrics, write_per_image


def scene(background: str, *objects: tuple[str, str, str, int, int]) -> dict:
    objs = [dict(zip(("shape", "colour", "size", "row", "col"), o, strict=True))
            for o in objects]  # fmt: skip
    return {"background": background, "objects": objs, "relations": shapes.relations(objs)}


A = scene("grey", ("circle", "red", "small", 1, 0), ("square", "blue", "large", 1, 2))
B = scene("black", ("triangle", "green", "large", 0, 1))
C = scene("white", ("circle", "red", "large", 0, 1), ("star", "yellow", "small", 2, 1))
D = scene("grey", ("square", "blue", "small", 1, 1))
SCENES = [A, B, C, D]
SPECIFIC = [
    "a small red circle left of a large blue square on a grey background",
    "a large green triangle on a black background",
    "a large red circle above a small yellow star",
    "a small blue box against a grey backdrop",
]


def test_hand_computed_scores():
    # A's caption: 2 objects x 3 facts + relation + background = 8 claims, all in A; C has
    # a circle and a red circle (2); D a square, a blue square and grey (3); B nothing.
    assert scene_scores(SPECIFIC[:1], SCENES).tolist() == [[8, 0, 2, 3]]


def test_captions_true_only_of_their_own_image_rank_it_first():
    values, per_caption = scene_retrieval(SPECIFIC, SCENES, [1, 2])
    assert per_caption["scene_rank"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert per_caption["scene_top1"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert values == {"scene_r_at_1": 1.0, "scene_r_at_2": 1.0, "scene_mean_rank": 1.0}


@pytest.mark.parametrize("text", ["a picture of some shapes", "", "geometric shapes"])
def test_a_caption_without_claims_ranks_at_chance(text):
    n = len(SCENES)
    values, per_caption = scene_retrieval([text] * n, SCENES, [1, 2, 10])
    assert per_caption["scene_rank"].tolist() == [(n + 1) / 2] * n
    assert values["scene_r_at_1"] == pytest.approx(1 / n)
    assert values["scene_r_at_2"] == pytest.approx(2 / n)
    assert values["scene_r_at_10"] == 1.0
    assert values["scene_mean_rank"] == (n + 1) / 2


def test_a_claim_every_scene_holds_ranks_at_chance():
    circles = [A, C, scene("black", ("circle", "pink", "small", 0, 0))]
    values, per_caption = scene_retrieval(["a disc"] * 3, circles, [1])
    assert per_caption["scene_rank"].tolist() == [2.0, 2.0, 2.0]
    assert per_caption["scene_top1"] == pytest.approx([1 / 3] * 3)
    assert values["scene_r_at_1"] == pytest.approx(1 / 3)


def test_a_false_claim_another_scene_holds_costs_rank():
    # "a red circle": A and C both hold its 2 claims, a tie: expected rank 1.5, P(rank 1) 1/2
    texts = ["a red circle", *SPECIFIC[1:]]
    _, tied = scene_retrieval(texts, SCENES, [1])
    assert tied["scene_rank"][0] == 1.5 and tied["scene_top1"][0] == 0.5
    # adding "above a yellow star" (false of A, true of C): C holds 5 claims, A still 2
    texts[0] = "a red circle above a yellow star"
    _, worse = scene_retrieval(texts, SCENES, [1])
    assert worse["scene_rank"][0] == 2.0 and worse["scene_top1"][0] == 0.0


def test_expected_rank_and_hit_probability_under_random_tie_order():
    scores = np.array([[3, 5, 3, 3, 1],  # g = 1 better, t = 2 ties besides itself
                       [0, 0, 0, 0, 0],  # all tied: chance
                       [0, 0, 9, 0, 0],
                       [4, 4, 4, 2, 4],  # g = 4: last
                       [0, 1, 1, 0, 0]])  # g = 2, t = 2  # fmt: skip
    better, ties = tied_counts(scores)
    assert better.tolist() == [1, 0, 0, 4, 2] and ties.tolist() == [2, 4, 0, 0, 2]
    assert hit_probability(better, ties, 1).tolist() == [0.0, 0.2, 1.0, 0.0, 0.0]
    assert hit_probability(better, ties, 2) == pytest.approx([1 / 3, 0.4, 1.0, 0.0, 0.0])
    assert hit_probability(better, ties, 4) == pytest.approx([1.0, 0.8, 1.0, 0.0, 2 / 3])


def generated_world(n: int, seed: int = 0) -> tuple[list[dict], list[str]]:
    """n scenes of the shapes world generator and one caption of each level per scene."""
    rng = np.random.default_rng(seed)
    scenes = [shapes.make_scene(rng, 3) for _ in range(n)]
    texts = [shapes.caption(s, level, rng) for s in scenes for level in shapes.LEVELS]
    return scenes, texts


def test_scores_are_claim_marks_truths_on_generated_scenes():
    scenes, texts = generated_world(40)
    texts += ["a big red disc under a small blue box beside a green star on a white backdrop",
              "a tiny pink hexagon to the right of a rhombus above a large triangle"]  # fmt: skip
    expected = [[sum(right for _, right in claim_marks(t, s)) for s in scenes] for t in texts]
    assert scene_scores(texts, [json.dumps(s) for s in scenes]).tolist() == expected


def test_500_images():
    scenes, texts = generated_world(500, seed=1)
    specific = texts[3::4]  # one caption per scene
    values, per_caption = scene_retrieval(specific, scenes, [1, 5])
    ranks = per_caption["scene_rank"]
    assert ranks.shape == (500,) and ranks.min() >= 1 and ranks.max() <= 500
    assert values["scene_r_at_1"] == pytest.approx(per_caption["scene_top1"].mean())
    assert values["scene_mean_rank"] == pytest.approx(ranks.mean())
    assert scene_ranks(specific, scenes) == pytest.approx(ranks)
    assert values["scene_r_at_1"] > 0.5  # specific true captions: mostly first


def images_table(ids: list[int], scenes: list[dict] | None) -> pd.DataFrame:
    table = pd.DataFrame({"image_id": ids, "split": "test"})
    if scenes is not None:
        table["scene"] = [json.dumps(s) for s in scenes]
    return table


def test_stage_columns_on_hand_built_captions(tmp_path):
    ids = [12, 5, 7, 30]  # the images table in another order than the captions
    images = images_table([5, 30, 12, 7], [B, D, A, C])
    texts = ["a red circle", *SPECIFIC[1:]]
    settings = EvalSettings()
    out, per_caption = scene_retrieval_metrics(texts, ids, images, settings.retrieval_ks)
    names = [f"scene_r_at_{k}" for k in settings.retrieval_ks] + ["scene_mean_rank"]
    assert list(out.values) == names and not out.skipped
    assert out["scene_r_at_1"] == pytest.approx((0.5 + 3) / 4)
    assert out["scene_mean_rank"] == pytest.approx((1.5 + 3) / 4)
    assert per_caption["scene_rank"].tolist() == [1.5, 1.0, 1.0, 1.0]
    columns = metric_columns(settings)
    after_f1 = columns[columns.index("scene_f1") + 1 :]
    assert after_f1[: len(names)] == names
    assert scene_metrics(texts, ids, images).values["scene_precision"] == 1.0

    per_image = pd.DataFrame({"image_id": np.array(ids, np.int64), "clip_rank": np.ones(4, int),
                              "clipscore": np.zeros(4), "judge_rank": np.ones(4, int),
                              "judge_clipscore": np.zeros(4), **per_caption})  # fmt: skip
    write_per_image(Evaluation({}, {}, pd.DataFrame(), per_image=per_image), tmp_path / "p.pq")
    table = read_table(tmp_path / "p.pq", "per_image")
    assert list(table.columns) == list(PER_IMAGE) == [
        "image_id", "clip_rank", "clipscore", "judge_rank", "judge_clipscore", "scene_rank",
        "scene_top1",
    ]  # fmt: skip
    assert table.scene_top1.dtype == np.float64 and table.scene_top1.mean() == out["scene_r_at_1"]


def test_stage_skips_off_the_shapes_world():
    images = images_table([1, 2], None)
    out, per_caption = scene_retrieval_metrics(["a circle", "a box"], [1, 2], images, [1, 5])
    assert out.skipped == dict.fromkeys(["scene_r_at_1", "scene_r_at_5", "scene_mean_rank"],
                                        NO_SCENES)  # fmt: skip
    assert all(math.isnan(v) for v in out.values.values())
    assert all(np.isnan(per_caption[c]).all() for c in ("scene_rank", "scene_top1"))
    assert scene_metrics(["a circle"], [1], images).skipped["scene_f1"] == NO_SCENES
