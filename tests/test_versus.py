"""Each run against the MLE reference with paired bootstrap intervals: a noise-level difference
is never listed as a win, a real one is (on a generated shapes world, real captions; R@1, mean
rank and CLIPScore from hand-made per-image tables)."""

import numpy as np
import pandas as pd
import pytest

from distinctcap.data import shapes
from distinctcap.data.scene_retrieval import scene_key_matrix
from distinctcap.report.judged import LOWER_BETTER
from distinctcap.report.summary import headline_quality
from distinctcap.report.versus import (
    compare_runs,
    markdown,
    mean_statistic,
    paired_bootstrap,
    verdict,
    wide,
    write_versus,
)
from distinctcap.scores.distinctive import similar_images

GENERIC = "a picture of some shapes"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    images, captions = shapes.generate(
        shapes.ShapesConfig(n_train=10, n_val=5, n_test=60), tmp_path_factory.mktemp("world")
    )
    test = images[images.split == "test"]
    return test, captions[captions.image_id.isin(test.image_id)]


def generated(run, texts):
    return pd.DataFrame({"run": run, "image_id": list(texts), "sample": 0,
                         "text": list(texts.values()), "logprob": -1.0})


def runs_of(world, **texts_of):
    images, captions = world
    return {(run, "test", "greedy"): generated(run, texts(images, captions))
            for run, texts in texts_of.items()}


def generic(images, captions):
    return dict.fromkeys(images.image_id, GENERIC)


def specific(images, captions):  # the longest human caption: the fully specific one
    return captions.groupby("image_id").text.agg(lambda t: max(t, key=len)).to_dict()


def almost_generic(images, captions):  # noise: one image of 60 differs
    texts = generic(images, captions)
    first = next(iter(texts))
    texts[first] = specific(images, captions)[first]
    return texts


def test_a_real_gain_is_better_and_noise_is_never_a_win(world):
    images, captions = world
    runs = runs_of(world, reference=generic, smile=specific, noise=almost_generic, same=generic)
    table = compare_runs(runs, captions, images, "reference").set_index(["run", "metric"])
    for metric in ("cider", "scene_f1"):
        assert table.loc[("smile", metric), "verdict"] == "better"
        assert table.loc[("smile", metric), "ci_low"] > 0
        for run in ("noise", "same"):
            assert table.loc[(run, metric), "verdict"] == "no significant difference", run
    assert table.loc[("same", "cider"), "difference"] == 0
    assert table.loc[("noise", "cider"), "difference"] > 0  # higher, yet not called better


def clip_table(images, ranks, clipscore):
    """A per-image table (distinctcap.evaluate.device.PER_IMAGE) of the world's test images."""
    n = len(images)
    return pd.DataFrame({"image_id": images.image_id.to_numpy(),
                         "clip_rank": np.broadcast_to(ranks, n).astype(np.int64),
                         "clipscore": np.broadcast_to(clipscore, n).astype(np.float32)})


def reference_ranks(n):  # every 4th image retrieved at rank 1, the others at ranks 10..19
    return np.where(np.arange(n) % 4 == 0, 1, 10 + np.arange(n) % 10)


@pytest.fixture(scope="module")
def clip_versus(world):
    images, captions = world
    n = len(images)
    ranks = reference_ranks(n)
    noise = np.where(ranks == 1, 1, 29 - ranks)  # the same hits, other misses
    per_image = {
        ("reference", "test", "greedy"): clip_table(images, ranks, 0.6),
        ("noise", "test", "greedy"): clip_table(images, noise, 0.6),
        ("sharp", "test", "greedy"): clip_table(images, 1, 0.7),  # every image at rank 1
        ("blunt", "test", "greedy"): clip_table(images, np.where(ranks == 1, 1, ranks + 5), 0.5),
    }
    runs = runs_of(world, reference=generic, noise=generic, sharp=generic, blunt=generic)
    table = compare_runs(runs, captions, images, "reference", per_image=per_image)
    return table.set_index(["run", "metric"])


def test_identical_per_image_hits_are_no_difference_in_r_at_1(clip_versus):
    row = clip_versus.loc[("noise", "r_at_1")]
    assert row.value == row.reference_value == 0.25  # 15 of 60 hits, the same 15 images
    assert row.difference == row.ci_low == row.ci_high == 0  # every resample: 0
    assert row.verdict == "no significant difference"
    assert clip_versus.loc[("noise", "clipscore"), "verdict"] == "no significant difference"


def test_a_lower_mean_rank_is_better(clip_versus, world):
    n = len(world[0])
    sharp = clip_versus.loc[("sharp", "mean_rank")]
    assert sharp.value == 1 and sharp.reference_value == reference_ranks(n).mean()
    assert sharp.ci_high < 0 and sharp.verdict == "better"  # lower is better
    for metric in ("r_at_1", "clipscore"):  # higher is better
        assert clip_versus.loc[("sharp", metric), "ci_low"] > 0
        assert clip_versus.loc[("sharp", metric), "verdict"] == "better"
    blunt = clip_versus.loc[("blunt", "mean_rank")]
    assert blunt.difference == pytest.approx(5 * 3 / 4)  # +5 on the 45 misses of 60
    assert blunt.ci_low > 0 and blunt.verdict == "worse"
    assert clip_versus.loc[("blunt", "clipscore"), "verdict"] == "worse"
    assert clip_versus.loc[("blunt", "r_at_1"), "verdict"] == "no significant difference"


def test_rows_follow_reference_teachers_methods(world):
    images, captions = world
    runs = runs_of(world, smile=specific, reference=generic, teacher_neg=generic)
    blocks = {"reference": {"method": "mle"}, "teacher_neg": {"method": "mle", "data": "D-"},
              "smile": {"method": "smile"}}
    table = compare_runs(runs, captions, images, "reference", blocks)
    assert list(dict.fromkeys(table.run)) == ["teacher_neg", "smile"]


def test_paired_bootstrap_of_a_mean():
    rng = np.random.default_rng(1)
    a = rng.normal(1.0, 1.0, size=(200, 1))
    b = a - 0.5 + rng.normal(0, 0.1, size=(200, 1))  # paired: the difference is nearly constant
    value, ref, diff, low, high = paired_bootstrap(a, b, mean_statistic(200), seed=0)
    assert diff == pytest.approx(a.mean() - b.mean())
    assert 0.45 < low < diff < high < 0.55  # pairing removes the images' own spread
    assert verdict(low, high) == "better" and verdict(-high, -low) == "worse"
    assert verdict(-0.1, 0.2) == "no significant difference"
    assert verdict(low, high, lower_better=True) == "worse"  # e.g. a higher mean rank
    assert verdict(-high, -low, lower_better=True) == "better"
    assert verdict(-0.1, 0.2, lower_better=True) == "no significant difference"


def test_markdown_csv_and_latex_exports(world, tmp_path):
    images, captions = world
    runs = runs_of(world, reference=generic, smile=specific)
    per_image = {("reference", "test", "greedy"): clip_table(images, reference_ranks(60), 0.6),
                 ("smile", "test", "greedy"): clip_table(images, 1, 0.7)}
    table = compare_runs(runs, captions, images, "reference", per_image=per_image)
    write_versus(table, "reference", tmp_path / "v.csv", tmp_path / "v.md", tmp_path / "v.tex")
    headers, rows = wide(table)
    field = ["CIDErBtw (scenes) ↓", "DisWordRate (scenes) ↑"]  # the scene graphs' neighbours
    assert headers == ["run", "decoding", "CIDEr ↑", "R@1 ↑", "mean rank ↓", "CLIPScore ↑",
                       "scene precision ↑", "scene F1 ↑", *field]
    assert "**better**" in markdown(table, "reference")
    assert len(pd.read_csv(tmp_path / "v.csv")) == 8
    tex = (tmp_path / "v.tex").read_text()
    assert "\\textbf{better}" in tex and "$\\uparrow$" in tex and "\\toprule" in tex
    assert "mean rank $\\downarrow$" in tex
    without = wide(compare_runs(runs, captions, images, "reference"))[0]  # no per-image tables
    assert without == ["run", "decoding", "CIDEr ↑", "scene precision ↑", "scene F1 ↑", *field]


def judged_table(images, ranks, clipscore, judge_ranks, judge_score, scene_top1, scene_ranks):
    """`clip_table` with the independent judges' per-image columns (issue 45): the judge
    CLIP's rank and CLIPScore, the scene judge's expected rank and probability of rank 1."""
    n = len(images)
    return clip_table(images, ranks, clipscore).assign(
        judge_rank=np.broadcast_to(judge_ranks, n).astype(np.int64),
        judge_clipscore=np.float32(judge_score),
        scene_rank=np.broadcast_to(scene_ranks, n).astype(float),
        scene_top1=np.broadcast_to(scene_top1, n).astype(float))


@pytest.fixture(scope="module")
def judged(world):
    """`tuned` wins everything under the trainer's CLIP and almost nothing under the judges;
    `honest` wins as much under the judges; `unjudged` has no judge columns."""
    images, captions = world
    n = len(images)
    ranks, quarter = reference_ranks(n), np.arange(n) % 4
    one_more = np.where(np.arange(n) == 1, 1, ranks)  # one more judge hit: +1/60
    kept = np.where(quarter != 3, 1, ranks)  # the judges: rank 1 on three images of four
    per_image = {
        ("reference", "test", "greedy"): judged_table(
            images, ranks, 0.6, ranks, 0.5, (ranks == 1).astype(float), ranks),
        ("tuned", "test", "greedy"): judged_table(
            images, 1, 0.7, one_more, 0.5, (ranks == 1).astype(float), ranks),
        ("honest", "test", "greedy"): judged_table(
            images, 1, 0.7, kept, 0.58, np.where(quarter != 3, 1.0, 0.5), kept),
        ("unjudged", "test", "greedy"): clip_table(images, 1, 0.7),
    }
    runs = runs_of(world, reference=generic, tuned=generic, honest=generic, unjudged=generic)
    return compare_runs(runs, captions, images, "reference", per_image=per_image)


def test_the_judges_get_their_own_rows_where_both_tables_have_them(judged, world):
    table = judged.set_index(["run", "metric"])
    judges = ["judge_r_at_1", "judge_mean_rank", "judge_clipscore", "scene_r_at_1",
              "scene_mean_rank"]
    assert [m for m in judges if ("unjudged", m) in table.index] == []  # its table has none
    assert table.loc[("unjudged", "r_at_1"), "verdict"] == "better"  # today's rows stay
    tuned, honest = table.loc["tuned"], table.loc["honest"]
    assert tuned.loc["r_at_1", "difference"] == pytest.approx(0.75)  # 1.0 against 15 of 60
    assert tuned.loc["judge_r_at_1", "difference"] == pytest.approx(1 / 60)
    assert tuned.loc["scene_r_at_1", "difference"] == 0
    assert honest.loc["judge_r_at_1", "difference"] == pytest.approx(0.5)  # 45 of 60 hits
    assert honest.loc["scene_r_at_1", "difference"] == pytest.approx(0.875 - 0.25)
    assert honest.loc["scene_r_at_1", "value"] == pytest.approx(0.875)  # the mean of scene_top1
    n = len(world[0])
    kept_mean = np.where(np.arange(n) % 4 != 3, 1, reference_ranks(n)).mean()
    assert honest.loc["judge_mean_rank", "value"] == pytest.approx(kept_mean)
    assert honest.loc["judge_mean_rank", "verdict"] == "better"  # lower is better
    assert honest.loc["scene_mean_rank", "verdict"] == "better"
    assert honest.loc["judge_clipscore", "difference"] == pytest.approx(0.08, abs=1e-6)


def test_a_gain_the_judges_do_not_share_is_flagged_in_words(judged):
    text = markdown(judged, "reference")
    tuned = next(line for line in text.splitlines() if line.startswith("- tuned"))
    assert tuned.startswith("- tuned (greedy): gain measured mainly by the CLIP it was tuned on "
                            "(R@1 +0.750: judge R@1 +0.017 [")
    assert "R@1 +0.750: scene R@1 +0.000 [+0.000, +0.000]" in tuned
    assert "CLIPScore +0.100: judge CLIPScore +0.000 [+0.000, +0.000]" in tuned
    honest = next(line for line in text.splitlines() if line.startswith("- honest"))
    assert honest.startswith("- honest (greedy): the judges confirm its CLIP gains (R@1 +0.750: "
                             "judge R@1 +0.500 [")
    assert "mean rank" in honest and "scene R@1 +0.625" in honest
    assert "unjudged" not in text.split("is flagged.")[-1]  # no judge: no line
    assert "judge R@1 ↑" in wide(judged)[0] and "scene mean rank ↓" in wide(judged)[0]


def test_captions_of_the_similar_images_lose_on_cider_btw_and_dis_word_rate(world):
    """Issue 58: each image captioned with the specific caption of its most similar image by
    the scene graphs says what its similar images' references say: a higher CIDErBtw (lower
    is better: "worse") and a lower DisWordRate than its own specific caption. A space given
    as `spaces` (here the scene graphs' again, as the judge's "") gives the same rows."""
    images, captions = world
    own = specific(images, captions)
    ids = sorted(own)
    scenes = images.set_index("image_id").scene.loc[ids].tolist()
    near = similar_images(ids, scene_key_matrix(scenes), 5)
    copied = {i: own[near[i][0]] for i in ids}
    runs = {("reference", "test", "greedy"): generated("reference", own),
            ("copycat", "test", "greedy"): generated("copycat", copied)}  # fmt: skip
    space = {"": lambda wanted: scene_key_matrix(images.set_index("image_id").scene.loc[wanted])}
    table = compare_runs(runs, captions, images, "reference", spaces=space).set_index("metric")
    assert table.loc["cider_btw_scene", "difference"] > 0 > table.loc["dis_word_rate_scene",
                                                                      "difference"]  # fmt: skip
    for metric in ("cider_btw_scene", "dis_word_rate_scene"):
        assert table.loc[metric, "verdict"] == "worse", metric
        same = table.loc[metric.removesuffix("_scene")]
        assert same[["value", "difference", "verdict"]].tolist() == table.loc[
            metric, ["value", "difference", "verdict"]].tolist()  # fmt: skip


def test_the_headline_ends_with_the_fields_metrics_where_measured():
    rows = pd.DataFrame([{"run": "reference", "split": "test", "decoding": "greedy",
                          "cider": 1.0, "cider_btw": 0.4, "dis_word_rate": np.nan}])  # fmt: skip
    columns = [column for _, column, _, _ in headline_quality(rows)]
    assert columns[-1] == "cider_btw" and "dis_word_rate" not in columns
    assert {"cider_btw", "cider_btw_scene"} <= LOWER_BETTER
    assert "dis_word_rate" not in LOWER_BETTER
