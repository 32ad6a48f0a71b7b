"""The evaluation stage on a tiny real world: the metrics row, skips, curve and orderings."""

import json
import logging
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY_CAPTIONER, child_peak_mb
from evaluate_world import N_TEST, SAMPLES, build

from distinctcap.core.io import read_table
from distinctcap.core.settings import EvalSettings, metric_block
from distinctcap.data.scene import scene_f1
from distinctcap.evaluate.device import (
    block_logprobs,
    device_metrics,
    evaluate_device_stage,
    model_metrics,
    retrieval_blocks,
)
from distinctcap.evaluate.inputs import EvalPaths
from distinctcap.evaluate.loaded import JobLoads
from distinctcap.evaluate.metrics import CocoTools, spice_unavailable_reason
from distinctcap.evaluate.nearest import nearest
from distinctcap.evaluate.stage import (
    evaluate_decoding,
    evaluate_stage,
    metric_columns,
    write_curve,
    write_metrics,
    write_per_image,
)
from distinctcap.report.summary import read_metrics
from distinctcap.report.versus import compare_runs
from distinctcap.scores.result import KEYS

SETTINGS = EvalSettings(
    oracle_ns=[2, 4, 20],
    curve_ns=[1, 2, 4, 20],
    best_of=2,
    consensus_neighbours=2,
    hard_pool=1,
    self_retrieval_pool=6,
)
RUNS, DECODINGS = ("perfect", "generic"), ("greedy", f"sample{SAMPLES}")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build(tmp_path_factory.getbasetemp() / "evaluate-world")


def paths(world, run: str, decoding: str) -> EvalPaths:
    return EvalPaths(
        world.generated(run, decoding),
        world.images,
        world.captions,
        world.vocab,
        world.features,
        world.model,
    )


@pytest.fixture(scope="module")
def results(world):
    with CocoTools() as tools:  # one METEOR server for the four evaluations
        out = {
            (run, dec): evaluate_decoding(paths(world, run, dec), "test", dec, SETTINGS, tools)
            for run in RUNS
            for dec in DECODINGS
        }
        assert tools.launches["meteor"] == 1
    return out


def test_row_has_keys_counts_and_every_metric_column(results):
    for (run, dec), ev in results.items():
        assert list(ev.row) == [*KEYS, "n_images", "n_samples", *metric_columns(SETTINGS)]
        assert (ev.row["run"], ev.row["split"], ev.row["decoding"]) == (run, "test", dec)
        assert ev.row["n_images"] == N_TEST
        assert ev.row["n_samples"] == (1 if dec == "greedy" else SAMPLES)
        assert set(ev.skipped) <= set(metric_columns(SETTINGS))
        for name, value in ev.row.items():
            if name in ev.skipped:
                assert math.isnan(value), name  # skipped is NaN, never 0
            elif name not in (*KEYS, "n_images", "n_samples"):
                assert not math.isnan(value), f"{run}/{dec}: {name} is NaN without a reason"


def test_skips_say_why(results):
    greedy, sampled = results["perfect", "greedy"], results["perfect", DECODINGS[1]]
    reason = spice_unavailable_reason()
    if reason is not None:
        assert greedy.skipped["spice"] == reason and "CoreNLP" in reason
    assert "GPT-2" in greedy.skipped["ppl"]
    for name in ("div1", "oracle_cider_2", "consensus_cider", "consensus_div1"):
        assert name in greedy.skipped, name
    assert "oracle_cider_20" in sampled.skipped and "oracle_cider_4" not in sampled.skipped
    assert "consensus_div1" not in sampled.skipped and "div1" not in sampled.skipped


def test_perfect_captions_beat_generic_ones(results, world):
    perfect, generic = results["perfect", "greedy"].row, results["generic", "greedy"].row
    assert perfect["cider"] > 1.0 > 0.5 > generic["cider"]
    assert perfect["bleu4"] > generic["bleu4"] and perfect["meteor"] > generic["meteor"]
    assert perfect["scene_f1"] > 0.5 and generic["scene_recall"] < 0.05
    assert perfect["novelty"] > generic["novelty"]
    # One caption for all 12 images: 1/12 distinct, and retrieval exactly at chance: the one
    # text ranks the 12 images once, so the ranks are 1..12 (CLIP weights are random here).
    assert generic["distinct_corpus"] == pytest.approx(1 / N_TEST)
    assert generic["r_at_1"] == pytest.approx(1 / N_TEST)
    assert generic["mean_rank"] == pytest.approx((N_TEST + 1) / 2)
    assert generic["vocab"] == 5 and generic["length"] == 5  # "a picture of some shapes"
    # the scene judge: no claims, every scene ties, chance exactly; specific captions win
    assert generic["scene_r_at_1"] == pytest.approx(1 / N_TEST)
    assert generic["scene_mean_rank"] == pytest.approx((N_TEST + 1) / 2)
    assert perfect["scene_r_at_1"] > 0.5 and perfect["scene_mean_rank"] < 2


def test_scene_f1_is_the_scene_scorer_on_sample_zero(results, world):
    images = read_table(world.images).set_index("image_id")
    gen = read_table(world.generated("perfect", "greedy")).sort_values("image_id")
    expected = scene_f1(gen.text.tolist(), images.scene.loc[gen.image_id].tolist())
    row = results["perfect", "greedy"].row
    assert row["scene_f1"] == pytest.approx(expected["scene_f1"])
    assert row["scene_precision"] == pytest.approx(expected["scene_precision"])


def test_retrieval_pools_and_model_self_retrieval(results, world, tmp_path):
    sampled = results["perfect", DECODINGS[1]]  # samples are not ranked unless asked
    assert "self_r_at_1" in sampled.skipped and "self_mean_rank" in sampled.skipped
    gen = read_table(world.generated("perfect", "greedy")).sort_values("image_id")
    args = (paths(world, "perfect", "greedy"), gen.image_id.tolist(), gen.text.tolist())
    asked = replace(SETTINGS, self_retrieval_of_samples=True)
    assert model_metrics(*args, SETTINGS, n_samples=4).skipped.keys() >= {"self_r_at_1"}
    assert 0 <= model_metrics(*args, asked, n_samples=4).values["self_r_at_1"] <= 1
    for ev in (results["perfect", "greedy"], results["generic", "greedy"]):
        row = ev.row
        assert row["hard_mean_rank"] >= row["mean_rank"]  # more images never lift a caption
        assert 0 <= row["self_r_at_1"] <= row["self_r_at_5"] <= 1
        assert 1 <= row["self_mean_rank"] <= SETTINGS.self_retrieval_pool
        assert 0 <= row["clipscore"] <= 2.5


def test_refclipscore_of_a_caption_that_is_one_of_its_references(results):
    """RefCLIPScore through the stage (Hessel et al. 2021 eq. 2): the perfect run's greedy
    caption is one of its image's references, so its best reference cosine is 1 and its
    RefCLIPScore is H-Mean(CLIPScore, 1) = 2 s / (s + 1), s from the per-image table."""
    perfect = results["perfect", "greedy"]
    s = perfect.per_image.clipscore.to_numpy(np.float64)
    assert perfect.row["refclipscore"] == pytest.approx(np.mean(2 * s / (s + 1)), rel=1e-5)
    for ev in results.values():
        assert 0 <= ev.row["refclipscore"] <= 2 * 2.5 / 3.5


def test_a_pool_larger_than_the_split_is_capped_with_a_warning(world, caplog):
    """Issue 28: a pool of a billion images is the split, and one warning says so."""
    gen = read_table(world.generated("perfect", "greedy")).sort_values("image_id")
    args = (paths(world, "perfect", "greedy"), gen.image_id.tolist(), gen.text.tolist())
    huge = replace(SETTINGS, self_retrieval_pool=10**9)
    caplog.set_level(logging.WARNING, logger="distinctcap.evaluate.inputs")
    assert 0 <= model_metrics(*args, huge).values["self_r_at_1"] <= 1
    n = len(gen)
    expected = f"evaluate.self_retrieval_pool = {10**9} exceeds the {n} images of the split; "
    assert [r.getMessage() for r in caplog.records] == [f"{expected}capped to {n}"]


def test_oracle_curve_rises_with_n(results, tmp_path):
    ev = results["perfect", DECODINGS[1]]
    assert ev.curve.n.tolist() == [1, 2, 4]  # 20 > the 4 samples decoded
    assert ev.curve.cider.is_monotonic_increasing
    assert ev.curve.cider.iloc[-1] == pytest.approx(ev.row["oracle_cider_4"])
    assert results["perfect", "greedy"].curve.empty
    write_curve(ev, tmp_path / "curve.csv")
    assert pd.read_csv(tmp_path / "curve.csv").n.tolist() == [1, 2, 4]


def test_metrics_parquet_round_trip(results, tmp_path):
    files = []
    for (run, dec), ev in results.items():
        files.append(tmp_path / run / f"test-{dec}.parquet")
        write_metrics(ev, files[-1])
    table = read_metrics(files)
    assert len(table) == 4 and table[list(KEYS)].drop_duplicates().shape[0] == 4
    row = table[(table.run == "generic") & (table.decoding == "greedy")].iloc[0]
    assert row.skipped == results["generic", "greedy"].skipped
    assert json.loads(read_table(files[0]).skipped[0]) == results["perfect", "greedy"].skipped


@pytest.mark.parametrize("gpu_job", [True, False], ids=["evaluate_gpu-job", "one-job"])
def test_the_rules_parallel_jobs_give_the_one_process_serial_rows(
    results, world, tmp_path, gpu_job
):
    """The rules' paths: with a GPU profile evaluate_gpu's torch part in its own job, else in
    the evaluate job itself; the text metrics on two workers with a token cache. Either gives
    every value, skip and per-image number of the one-process serial evaluation, to the last
    digit. (One job covers both runs here, so METEOR starts once.)"""
    block = {**metric_block(vars(SETTINGS)), "device": "cpu"}
    keys = [(run, dec) for run in RUNS for dec in DECODINGS]
    names = ("images", "captions", "vocab", "features", "model")
    common = {name: getattr(world, name) for name in names}
    common["generated"] = [world.generated(run, dec) for run, dec in keys]
    evaluations = [("test", dec) for _, dec in keys]
    per_image = [str(tmp_path / f"{run}-{dec}-per_image.parquet") for run, dec in keys]
    outputs = {
        "metrics": [str(tmp_path / f"{run}-{dec}.parquet") for run, dec in keys],
        "curve": [str(tmp_path / f"{run}-{dec}.csv") for run, dec in keys],
        "work": str(tmp_path / "work.json"),
    }
    inputs = common
    if gpu_job:
        device = [str(tmp_path / f"{run}-{dec}-gpu.parquet") for run, dec in keys]
        outputs_gpu = {"device": device, "per_image": per_image}
        evaluate_device_stage(common, outputs_gpu, evaluations, block)
        inputs = {**common, "device": device, "per_image": per_image}
    else:
        outputs["per_image"] = per_image
    done = evaluate_stage(
        inputs, outputs, evaluations, block, workers=2, cache_dir=str(tmp_path / "cache")
    )
    for key, evaluation, table in zip(keys, done, per_image, strict=True):
        want = results[key]
        assert evaluation.skipped == want.skipped
        # the same work counted wherever the torch part ran, whatever the caches held
        assert evaluation.work == want.work and evaluation.work["clip_encoded"] > 0
        got, expected = pd.Series(evaluation.row), pd.Series(want.row)
        pd.testing.assert_series_equal(got, expected, check_exact=True)
        pd.testing.assert_frame_equal(
            read_table(table, "per_image"),
            want.per_image.astype({"clipscore": "float32"}),
            check_exact=True,
        )
    assert list((tmp_path / "cache").glob("ptb-*.txt.gz"))
    # one job per run in the rule; here both runs' entries share their (split, decoding) keys
    assert json.loads((tmp_path / "work.json").read_text()) == {
        f"test-{dec}": done[len(DECODINGS) + k].work for k, dec in enumerate(DECODINGS)
    }


@pytest.fixture(scope="module")
def per_image(results, tmp_path_factory):
    """(run, "test", decoding) -> the per-image table as written and read back."""
    root, out = tmp_path_factory.mktemp("per_image"), {}
    for (run, dec), ev in results.items():
        write_per_image(ev, root / f"{run}-{dec}.parquet")
        out[run, "test", dec] = read_table(root / f"{run}-{dec}.parquet", "per_image")
    return out


def test_per_image_means_are_the_metrics_row(results, per_image):
    """R@1 and mean rank agree exactly, CLIPScore too (the row's is the float32 mean of the
    same float32 values)."""
    for (run, _, dec), table in per_image.items():
        row = results[run, dec].row
        assert len(table) == N_TEST and table.image_id.is_monotonic_increasing
        assert (table.clip_rank == 1).mean() == row["r_at_1"]
        assert table.clip_rank.mean() == row["mean_rank"]
        assert np.mean(table.clipscore.to_numpy()) == row["clipscore"]
        assert table.scene_top1.mean() == pytest.approx(row["scene_r_at_1"])
        assert table.scene_rank.mean() == pytest.approx(row["scene_mean_rank"])


def test_versus_values_are_the_summary_values(results, per_image, world):
    """The bootstrap's full-sample statistics are the metrics rows' R@1, mean rank, CLIPScore
    (the last summed in float64 here, so equal to float32 rounding)."""
    generated = {(run, "test", dec): read_table(world.generated(run, dec))
                 for run, _, dec in per_image}
    table = compare_runs(generated, read_table(world.captions), read_table(world.images),
                         "generic", per_image=per_image, n_boot=50)
    for row in table[table.metric.isin(["r_at_1", "mean_rank", "clipscore"])].itertuples():
        exact = row.metric != "clipscore"
        for run, value in (("perfect", row.value), ("generic", row.reference_value)):
            want = results[run, row.decoding].row[row.metric]
            assert value == (want if exact else pytest.approx(want, rel=1e-6)), row
    assert set(table.decoding) == set(DECODINGS) and set(table.run) == {"perfect"}


def test_nearest_is_cosine_top_k_in_order():
    pool = np.array([[1, 0], [0, 1], [0.8, 0.6], [-1, 0]], dtype=np.float32)
    query = np.array([[1, 0.1], [-0.1, -1]], dtype=np.float32)
    assert nearest(query, pool, 2).tolist() == [[0, 2], [3, 0]]
    assert nearest(query, pool, 10).shape == (2, 4)


def test_nearest_is_the_same_in_pool_chunks_and_breaks_ties_by_lower_row():
    rng = np.random.default_rng(0)
    query, pool = rng.standard_normal((40, 16)), rng.standard_normal((300, 16))
    whole = np.argsort(-(query @ pool.T), axis=1, kind="stable")
    for k in (1, 5, 300):
        for pool_chunk in (7, 64, 1000):
            assert (nearest(query, pool, k, pool_chunk=pool_chunk) == whole[:, :k]).all()
        for chunk in (1, 7, 2048):  # query rows a block: a row's neighbours are its own
            assert (nearest(query, pool, k, chunk=chunk, pool_chunk=64) == whole[:, :k]).all()
    twins = np.repeat(pool[:20], 3, axis=0)  # rows 3j, 3j+1, 3j+2 are equal
    near = nearest(query, twins, 6, pool_chunk=4)
    assert (near[:, 0::3] + 1 == near[:, 1::3]).all() and (near[:, 0::3] % 3 == 0).all()


def test_nearest_memory_is_bounded_by_its_chunks_not_by_the_pool():
    """The consensus neighbours of COCO's 1,000 test images among 118,287 training images:
    before the pool was chunked, a 4x pool took 4x the memory (a whole similarity matrix)."""
    import tracemalloc

    def peak(pool_rows: int) -> int:
        pool = np.random.default_rng(1).standard_normal((pool_rows, 64)).astype(np.float32)
        query = pool[:500].copy()
        tracemalloc.start()
        nearest(query, pool, 5, pool_chunk=1024)
        used = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return used

    assert peak(32_768) <= 1.25 * peak(8192)


def test_metric_block_leaves_report_only_keys_out():
    block = {"oracle_ns": [20], "spice": False, "gallery_images": 5, "gallery_split": "val"}
    assert metric_block(block) == {"oracle_ns": [20], "spice": False}
    assert EvalSettings.from_config(block).spice is False


def test_block_logprobs_match_the_decoders_sequence_logprob(world):
    from distinctcap.captioner.model import Captioner
    from distinctcap.captioner.search import sequence_logprob
    from distinctcap.data.tokenizer import CaptionTokenizer
    from distinctcap.features.read import load_image_features

    _, pooled, grid = load_image_features(world.features)
    grid, pooled = torch.from_numpy(grid[:3].astype(np.float32)), torch.from_numpy(pooled[:3])
    tok = CaptionTokenizer.load(world.vocab)
    tokens = [tok.encode(t) for t in ("a red circle", "a picture of some shapes", "a star")]
    model = Captioner.load(world.model)
    got = block_logprobs(model, grid, pooled, tokens, rows=1)  # one image per chunk
    pairs = [(c, i) for c in range(3) for i in range(3)]
    want = sequence_logprob(
        model, grid, pooled, [tokens[c] for c, _ in pairs], image_index=[i for _, i in pairs]
    ).view(3, 3)
    np.testing.assert_allclose(got, want.double().numpy(), rtol=1e-5, atol=1e-4)


SELF_RETRIEVAL = """
import json
import sys
import numpy as np
import torch
from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.evaluate.device import block_logprobs
torch.set_num_threads(1)
images, g = int(sys.argv[1]), torch.Generator().manual_seed(0)
model = Captioner(CaptionerConfig(64, 768, 512, **json.loads(sys.argv[2]))).eval()
grid, pooled = torch.randn(images, 49, 768, generator=g), torch.randn(images, 512, generator=g)
tokens = [torch.randint(3, 64, (31,), generator=g).tolist() for _ in range(999)]
x = np.ones(30 * 2**20 // 8)
del x  # a freed 30 MB mapping: glibc's mmap threshold rises, as torch's frees raise it
block_logprobs(model, grid, pooled, tokens)
"""


def test_self_retrieval_memory_does_not_grow_with_its_chunks():
    """Issue 55: an evaluate job's peak varied 1.7-3.7 GB between runs of the same inputs, the
    main heap holding freed memory (malloc_trim gave back 0.7-0.9 GB of it) after the
    self-retrieval: each chunk of images kept a small tensor of its log-probabilities, placed
    between the chunk's freed temporaries, so the next chunk's took new memory. Here 220
    images of 999 captions added 415-915 MB that way; filled into one matrix, 33."""
    sizes = json.dumps({**TINY_CAPTIONER, "max_len": 32})
    peaks = {n: child_peak_mb(SELF_RETRIEVAL, n, sizes) for n in (1, 220)}
    assert peaks[220] - peaks[1] <= 150, peaks


def test_retrieval_blocks_split_the_images_evenly():
    blocks = retrieval_blocks(250, 100, seed=0)
    assert [len(b) for b in blocks] == [84, 83, 83]
    assert sorted(np.concatenate(blocks).tolist()) == list(range(250))
    assert [len(b) for b in retrieval_blocks(12, 100)] == [12]


def test_a_jobs_decodings_share_one_read_of_each_model_and_feature_file(results, world):
    """Issue 46: one JobLoads serves every decoding of a job; the second decoding reads
    nothing again, and both give the per-decoding values and work counts to the last digit."""
    loads = JobLoads()
    for dec in DECODINGS:
        part = device_metrics(paths(world, "perfect", dec), "test", SETTINGS, loads=loads)
        want = results["perfect", dec]
        pd.testing.assert_frame_equal(part.per_image, want.per_image, check_exact=True)
        assert part.result.values.items() <= want.row.items()
        assert part.work == {k: want.work[k] for k in part.work} and part.work["clip_encoded"] > 0
    # the images table once, the captions once as the split's rows and once as the training
    # references (never held whole), the captioner and its image rows once (greedy only: the
    # sampling decoding skips self-retrieval by default), one CLIP, one pooled read for the
    # split and one for its hard pool's training images, found once (the training features a
    # block at a time: evaluate.nearest)
    assert loads.loads == {"table": 1, "split_captions": 1, "train_refs": 1, "pooled": 2,
                           "manifest": 1, "clip": 1, "image_features": 1, "captioner": 1,
                           "train_with_features": 1, "training_neighbours": 1}  # fmt: skip
    assert list(loads.split_captions(world.captions, "test").columns) == ["image_id", "text"]
