"""Retrieval entropy (UNKT eq. 3), the D- / D+ split and its report; the whole stage end to end."""

import copy
import math
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import ROOT, snakemake

from distinctcap.config.check import load_schema, validate
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_table
from distinctcap.features.entropy import retrieval_entropy
from distinctcap.features.subsets import (
    extremes_markdown,
    plot_histogram,
    read_split,
    read_subset,
    rows_in,
    split_subsets,
    threshold,
    write_split,
    write_subsets,
)


def direct_entropy(text, images, scale):
    """The full N_text x N_images matrix, the way eq. 3 reads."""
    logp = torch.log_softmax(scale * text @ images.T, dim=1)
    return -(logp.exp() * logp).sum(1)


def unit(n, d, seed):
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


@pytest.mark.parametrize("scale", [1.0, 14.3, 100.0])
def test_streamed_entropy_equals_full_matrix(scale):
    text, images = unit(301, 24, 0), unit(1003, 24, 1)  # neither divisible by the chunks
    got = retrieval_entropy(text, images, scale, chunk=97, text_chunk=64)
    assert got.shape == (301,) and got.dtype == torch.float32
    torch.testing.assert_close(got, direct_entropy(text, images, scale), atol=1e-5, rtol=0)
    got64 = retrieval_entropy(text.double(), images.double(), scale, chunk=97, text_chunk=64)
    want64 = direct_entropy(text.double(), images.double(), scale)
    torch.testing.assert_close(got64, want64, atol=1e-10, rtol=0)


def test_chunk_sizes_do_not_change_the_result():
    text, images = unit(50, 16, 2), unit(333, 16, 3)
    ref = retrieval_entropy(text, images, 20.0, chunk=333, text_chunk=50)
    for chunk, text_chunk in [(1, 7), (10, 1), (332, 49), (10_000, 10_000)]:
        got = retrieval_entropy(text, images, 20.0, chunk=chunk, text_chunk=text_chunk)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_half_precision_products_stay_close():
    """The GPU path (fp16/bf16 products, fp32 log-sum-exp), exercised here on the CPU."""
    text, images = unit(40, 32, 4), unit(300, 32, 5)
    ref = retrieval_entropy(text, images, 50.0, chunk=64)
    for dtype, tol in ((torch.float16, 0.02), (torch.bfloat16, 0.1)):
        got = retrieval_entropy(text, images, 50.0, chunk=64, matmul_dtype=dtype)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, ref, atol=tol, rtol=0)


def test_hand_computed_entropies():
    # one caption, two images at cos 1 and 0, scale ln 3: p = (3/4, 1/4)
    text = torch.tensor([[1.0, 0.0]])
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    want = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert retrieval_entropy(text, images, math.log(3), chunk=1).item() == pytest.approx(want)
    # a caption equally close to all N images: uniform, H = log N
    same = torch.tensor([[0.6, 0.8]]).repeat(7, 1)
    assert retrieval_entropy(text, same, 50.0, chunk=3).item() == pytest.approx(math.log(7))
    # a very sharp softmax on one matching image: H -> 0
    assert retrieval_entropy(text, images, 1000.0).item() == pytest.approx(0.0, abs=1e-6)


def test_mismatched_dims_are_an_error():
    with pytest.raises(DistinctcapError, match="dim"):
        retrieval_entropy(unit(3, 4, 0), unit(3, 5, 1), 10.0)


def captions_file(captions: pd.DataFrame, path, row_group_size: int) -> pq.ParquetFile:
    """The captions as a parquet file of small row groups, so a shard spans several (texts
    as the captions contract's string, as core.io writes them)."""
    table = pa.Table.from_pandas(captions, preserve_index=False)
    table = table.set_column(table.schema.get_field_index("text"), "text",
                             table["text"].cast(pa.string()))  # fmt: skip
    pq.write_table(table, path, row_group_size=row_group_size)
    return pq.ParquetFile(path)


def scores_table(entropies):
    n = len(entropies)
    return pd.DataFrame(
        {
            "caption_id": np.arange(n, dtype=np.int64),
            "image_id": np.arange(n, dtype=np.int64) // 2,
            "entropy": np.asarray(entropies, dtype=np.float32),
        }
    )


def test_split_top_fraction_is_d_minus():
    table = split_subsets(scores_table([0.1, 3.0, 2.0, 0.5, 2.0, 1.0]), 0.5)
    assert table.caption_id.tolist() == list(range(6))
    # ranked 1 (3.0), 2 and 4 (2.0, tie broken by caption_id), 5, 3, 0
    assert table.subset.tolist() == ["D+", "D-", "D-", "D+", "D-", "D+"]
    assert threshold(table) == pytest.approx(2.0)
    table = split_subsets(scores_table([0.1, 3.0, 2.0, 0.5, 2.0, 1.0, 0.0, 0.2, 0.3, 0.4]), 0.3)
    assert (table.subset == "D-").sum() == 3


@pytest.mark.parametrize("fraction", [0, 1, 1.5])
def test_empty_subset_is_a_config_error(fraction):
    schema = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")
    with pytest.raises(DistinctcapError, match="fraction"):
        validate({"entropy": {"fraction": fraction}, "runs": {"r": {"method": "mle"}}}, schema)
    with pytest.raises(DistinctcapError, match="fraction"):
        split_subsets(scores_table([1.0, 2.0]), fraction)


def test_subset_shards_roundtrip_and_report(tmp_path):
    scores = scores_table(np.linspace(0, 5, 30)[::-1])
    captions = pd.DataFrame(
        {
            "caption_id": scores.caption_id,
            "image_id": scores.image_id,
            "split": "train",
            "text": [f"caption {i}" for i in range(30)],
            "tokens": [np.array([4, 5 + i], dtype=np.int32) for i in range(30)],
        }
    )
    table = split_subsets(scores, 0.4)
    dirs = {"D-": tmp_path / "D-", "D+": tmp_path / "D+"}
    counts = write_subsets(table, captions_file(captions, tmp_path / "c.parquet", 7), dirs, 5)
    assert counts == {"D-": 12, "D+": 18}
    assert len(list(dirs["D-"].glob("part-*.parquet"))) == 3
    neg, pos = read_subset(dirs["D-"]), read_subset(dirs["D+"])
    assert sorted(neg.caption_id) == list(range(12))  # the highest entropies come first
    assert set(pos.caption_id) == set(range(12, 30))
    assert neg.tokens[0].tolist() == [4, 5] and "entropy" in neg.columns

    plot_histogram(table, tmp_path / "hist.png")
    assert (tmp_path / "hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = extremes_markdown(table, tmp_path / "c.parquet", top=4)
    assert "## Highest 4" in text and "## Lowest 4" in text
    highest = text.split("## Lowest")[0]
    assert "| 5.0000 | D- | 1 | 0 | caption 0 |" in highest
    assert "| 0.0000 | D+ | 1 | 29 | caption 29 |" in text.split("## Lowest")[1]
    captions["text"] = ["generic"] * 10 + [f"caption {i}" for i in range(10, 30)]
    captions_file(captions, tmp_path / "c.parquet", 7)
    text = extremes_markdown(table, tmp_path / "c.parquet", top=2)  # one row per distinct text
    assert "| D- | 10 | 0 | generic |" in text and "caption 10 |" in text.split("## Lowest")[0]


def test_subsets_are_the_pandas_merges_shards_in_any_caption_order(tmp_path):
    """The shards read from the captions file's row groups hold what the pandas merge wrote
    before issue 55
    (captions columns, extra ones too, + entropy; sorted by caption_id), whatever the captions
    file's order, with val/test captions left out."""
    rng = np.random.default_rng(0)
    n = 500
    captions = pd.DataFrame(
        {
            "caption_id": rng.permutation(n).astype(np.int64),
            "image_id": rng.integers(0, 50, n),
            "split": rng.choice(["train", "train", "val"], n),
            "text": [f"caption {i}" for i in range(n)],
            "tokens": [rng.integers(0, 9, rng.integers(1, 6)).astype(np.int32) for _ in range(n)],
            "level": rng.integers(0, 3, n),
        }
    )
    train = captions[captions.split == "train"]
    scores = pd.DataFrame(
        {
            "caption_id": train.caption_id.to_numpy()[::-1],
            "image_id": train.image_id.to_numpy()[::-1],
            "entropy": rng.random(len(train)).astype(np.float32),
        }
    )
    table = split_subsets(scores, 0.5)
    dirs = {"D-": tmp_path / "D-", "D+": tmp_path / "D+"}
    counts = write_subsets(table, captions_file(captions, tmp_path / "c.parquet", 37), dirs, 64)
    joined = captions.merge(table[["caption_id", "entropy", "subset"]], on="caption_id")
    for name in ("D-", "D+"):
        before = joined[joined.subset == name].drop(columns="subset").sort_values("caption_id")
        got = read_subset(dirs[name])
        assert counts[name] == len(before) == len(got) and len(got) > 64
        pd.testing.assert_frame_equal(
            got.drop(columns="tokens"), before.drop(columns="tokens").reset_index(drop=True),
            check_dtype=False,
        )  # fmt: skip
        assert all(map(np.array_equal, got.tokens, before.tokens))
        assert got.entropy.dtype == np.float32


def test_the_split_and_report_jobs_do_not_load_torch():
    """Their jobs hold the captions, not torch's ~440 MB (issue 55)."""
    code = (
        "import sys, distinctcap.features.subsets, distinctcap.core.logs\n"
        "assert 'torch' not in sys.modules, 'torch loaded'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- the stage, for real

STAGE = ["split_entropy", "entropy_report"]


def jobs_planned(result) -> dict[str, int]:
    """Rule -> count from the `Job stats` table of a snakemake (dry) run."""
    table = result.stdout.split("Job stats:")[1].split("\n\n")[0]
    return {
        m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"
    }


@pytest.mark.slow
def test_stage_end_to_end_reruns_only_what_changed(tiny_dag, tmp_path):
    """On a copy of the shared tiny run (snakemake --cores 2 through the D-/D+ shards and the
    report), moved away from its workflow: a rerun does nothing; editing entropy.fraction
    reruns only the split and the report; generic captions land in D-."""
    shared, config = tiny_dag
    workdir = shutil.copytree(shared, tmp_path / "run", symlinks=True)
    config = copy.deepcopy(config)
    recall = yaml.safe_load((workdir / "results/clip/retrieval.json").read_text())
    assert recall["text_to_image_R@1"] > 3 * recall["chance_R@1"], recall
    assert recall["image_to_text_R@1"] > 3 * recall["chance_R@1"], recall

    table = read_table(workdir / "results/entropy/entropy.parquet", "entropy")
    captions = read_table(workdir / "results/data/captions.parquet", "captions")
    assert len(table) == (captions.split == "train").sum()
    assert (table.subset == "D-").mean() == pytest.approx(0.5, abs=1e-3)
    neg, pos = (
        read_subset(workdir / "results/entropy/D-"),
        read_subset(workdir / "results/entropy/D+"),
    )
    generic_neg, generic_pos = (neg.level == 0).mean(), (pos.level == 0).mean()
    assert generic_neg > 2 * generic_pos, (generic_neg, generic_pos)
    assert (workdir / "results/report/entropy_histogram.png").stat().st_size > 1000
    assert "## Highest 20" in (workdir / "results/report/entropy_extremes.md").read_text()

    # the whole copied run, not only this stage: a moved experiment folder is up to date
    again = snakemake(workdir, "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout, again.stdout

    config["entropy"] = {"fraction": 0.3}
    edited = snakemake(workdir, "-n", *STAGE, config=config)
    assert jobs_planned(edited) == {"split_entropy": 1, "entropy_report": 1}, edited.stdout
    rerun = snakemake(workdir, *STAGE)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    table = read_table(workdir / "results/entropy/entropy.parquet", "entropy")
    assert (table.subset == "D-").mean() == pytest.approx(0.3, abs=1e-3)


def grouped_page_rows(table: pd.DataFrame, captions: pd.DataFrame, top: int) -> list[str]:
    """The extremes' rows as a pandas groupby of every text computes them (the report before
    issue 55): mean entropy, subsets, captions and first caption_id per text, ranked by
    entropy then first caption_id."""
    joined = table.merge(captions[["caption_id", "text"]], on="caption_id")
    texts = joined.groupby("text").agg(
        entropy=("entropy", "mean"), subset=("subset", lambda s: "/".join(sorted(set(s)))),
        captions=("caption_id", "size"), first_id=("caption_id", "min"),
    ).reset_index().sort_values(["entropy", "first_id"], ascending=[False, True])  # fmt: skip
    shown = pd.concat([texts.head(top), texts.tail(top)[::-1]])
    return [f"| {r.entropy:.4f} | {r.subset} | {r.captions} | {r.first_id} | {r.text} |"
            for r in shown.itertuples()]  # fmt: skip


def test_extremes_are_a_groupby_of_every_text(tmp_path):
    """Repeated texts, some in both subsets, in a captions file of several row groups: the
    page lists what a pandas groupby of every text lists, in its order."""
    rng = np.random.default_rng(1)
    n = 600
    text_of = rng.integers(0, 150, n)  # 150 texts, most repeated; one entropy per text
    scores = pd.DataFrame({"caption_id": np.arange(n, dtype=np.int64) * 3,
                           "image_id": rng.integers(0, 100, n),
                           "entropy": rng.random(150).astype(np.float32)[text_of]})  # fmt: skip
    table = split_subsets(scores, 0.5)
    captions = scores.assign(split="train", text=[f"text {t}" for t in text_of],
                             tokens=[np.array([4], dtype=np.int32)] * n)  # fmt: skip
    captions_file(captions.sample(frac=1, random_state=0), tmp_path / "c.parquet", 64)
    page = extremes_markdown(table, tmp_path / "c.parquet", top=80)  # every text: the split
    rows = [line for line in page.splitlines() if line.startswith("| 0.")]
    assert rows == grouped_page_rows(table, captions, 80)
    assert any("| D+/D- |" in row for row in rows)  # the text at the threshold
    assert f"({captions.text.nunique()} distinct texts)" in page


def test_the_entropy_table_reads_back_as_split(tmp_path):
    table = split_subsets(scores_table(np.random.default_rng(2).random(70_000)), 0.3)
    write_split(table, tmp_path / "entropy.parquet")
    assert pq.ParquetFile(tmp_path / "entropy.parquet").num_row_groups == 2
    pd.testing.assert_frame_equal(read_split(tmp_path / "entropy.parquet"), table)
    stored = read_table(tmp_path / "entropy.parquet", "entropy")  # the contract's strings
    assert stored.subset.tolist() == table.subset.tolist()


def test_scored_captions_missing_from_the_captions_file_are_an_error(tmp_path):
    assert rows_in(np.array([7, 3, 5]), np.array([5, 7, 4])).tolist() == [2, 0, -1]
    assert rows_in(np.array([3, 5, 7]), np.array([9, 3])).tolist() == [-1, 0]
    scores = scores_table([0.3, 0.2, 0.1])
    captions = scores.iloc[:2].assign(split="train", text="a", tokens=[np.array([4])] * 2)
    dirs = {"D-": tmp_path / "D-", "D+": tmp_path / "D+"}
    file = captions_file(captions, tmp_path / "c.parquet", 7)
    with pytest.raises(DistinctcapError, match="1 scored captions are not in the captions file"):
        write_subsets(split_subsets(scores, 0.5), file, dirs)
