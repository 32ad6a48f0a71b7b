"""The report's and the entropy split's memory at COCO's size (issue 55): the gallery reads the
split's images and the shown images' captions, not the whole captions table, so its peak does
not grow with the data (+268 MB at 123,287 images before, the table read whole as pandas); the
split reads each D- / D+ shard's captions from the row groups that hold them."""

from pathlib import Path

import numpy as np
import pandas as pd
from conftest import child_peak_mb

from distinctcap.core.io import read_table, write_table
from distinctcap.features.subsets import split_subsets, write_split

CAPTIONS_PER_IMAGE = 5
TEST_IMAGES = 100

GALLERY = """
import sys
from pathlib import Path
from distinctcap.report.gallery import gallery_stage
root = Path(sys.argv[1])
gallery_stage(root / "images.parquet", root / "captions.parquet", [root / "test-greedy.parquet"],
              "test", root / "gallery.html", root / "showcase.md", count=24)
"""


def write_data(root: Path, images: int) -> None:
    """`images` images (the last TEST_IMAGES of them test), five 60-character captions of 16
    tokens each, and one greedy caption per test image."""
    root.mkdir()
    ids = np.arange(images, dtype=np.int64)
    split = np.where(ids >= images - TEST_IMAGES, "test", "train")
    files = [str(root / "pixel.png")] * images
    (root / "pixel.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    write_table(pd.DataFrame({"image_id": ids, "file": files, "split": split, "width": 1,
                              "height": 1}), root / "images.parquet", "images")  # fmt: skip
    owner = np.repeat(ids, CAPTIONS_PER_IMAGE)
    write_table(
        pd.DataFrame({
            "caption_id": np.arange(len(owner), dtype=np.int64), "image_id": owner,
            "split": np.repeat(split, CAPTIONS_PER_IMAGE),
            "text": [f"a caption {k:08d} of an image with some shapes on a plain field"
                     for k in range(len(owner))],
            "tokens": [list(range(16))] * len(owner),
        }),
        root / "captions.parquet", "captions",
    )  # fmt: skip
    test = ids[split == "test"]
    write_table(pd.DataFrame({"run": "reference", "image_id": test, "sample": 0,
                              "text": "a shape", "logprob": -1.0}),
                root / "test-greedy.parquet", "generated")  # fmt: skip


def test_the_gallerys_memory_does_not_grow_with_the_captions_table(tmp_path):
    """4,000 against 120,000 images (20k against 600k captions, COCO's count): the peak stays
    within 40 MB: +12 MB (the whole table read as pandas added 392 MB here before; on the 2-core
    box), and both pages show 24 cards."""
    peaks = {}
    for n in (4_000, 120_000):
        write_data(tmp_path / f"n{n}", n)
        peaks[n] = child_peak_mb(GALLERY, tmp_path / f"n{n}")
    assert peaks[120_000] - peaks[4_000] <= 40, peaks
    pages = [(tmp_path / f"n{n}" / "gallery.html").read_text() for n in peaks]
    assert all(page.count("<div class='card'>") == 24 for page in pages)


SPLIT = """
import sys
from pathlib import Path
from distinctcap.features.subsets import split_stage
root = Path(sys.argv[1])
outputs = {"table": root / "entropy.parquet", "negative": root / "D-", "positive": root / "D+"}
split_stage(root / "scores.parquet", root / "captions.parquet", outputs, 0.5, 100_000)
"""


def write_scores(root: Path) -> None:
    """A retrieval entropy for every train caption of `write_data`'s captions."""
    captions = pd.read_parquet(root / "captions.parquet", columns=["caption_id", "image_id",
                                                                   "split"])  # fmt: skip
    train = captions[captions.split == "train"]
    entropy = np.random.default_rng(0).random(len(train), dtype=np.float32)
    write_table(pd.DataFrame({"caption_id": train.caption_id, "image_id": train.image_id,
                              "entropy": entropy}), root / "scores.parquet")  # fmt: skip


def scored_peaks(tmp_path: Path, code: str, split: bool = False) -> dict[int, float]:
    """`code`'s peak RSS on 4,000 and 120,000 images' data, their train captions scored (and
    split into the entropy table where `split`)."""
    peaks = {}
    for n in (4_000, 120_000):
        write_data(tmp_path / f"n{n}", n)
        write_scores(tmp_path / f"n{n}")
        if split:
            scores = read_table(tmp_path / f"n{n}" / "scores.parquet")
            write_split(split_subsets(scores, 0.5), tmp_path / f"n{n}" / "entropy.parquet")
        peaks[n] = child_peak_mb(code, tmp_path / f"n{n}")
    return peaks


def test_the_splits_memory_grows_by_its_scores_not_the_captions(tmp_path):
    """4,000 against 120,000 images (20k against 600k captions): the split holds the scores,
    the scored captions' rows in the file and a row group, not the captions table with its
    texts and tokens (on the 2-core box: +254 MB with the packed table held; +120-133 with
    pandas' sorts, a merge index and each 100,000-caption shard gathered whole; +60-63 now)."""
    peaks = scored_peaks(tmp_path, SPLIT)
    assert peaks[120_000] - peaks[4_000] <= 90, peaks


REPORT = """
import sys
from pathlib import Path
from distinctcap.features.subsets import extremes_markdown, plot_histogram, read_split
root = Path(sys.argv[1])
table = read_split(root / "entropy.parquet")
plot_histogram(table, root / "histogram.png")
(root / "extremes.md").write_text(extremes_markdown(table, root / "captions.parquet", 20))
"""


def test_the_entropy_reports_memory_grows_by_its_scores_not_the_texts(tmp_path):
    """4,000 against 120,000 images (20k against 600k captions): the report reads the entropy
    table a row group at a time, hashes the texts and sums only the 40 it lists (on the
    2-core box: +320 MB with every text read and merged; +143-167 with a pandas groupby of
    every text and a threaded filtered read of the listed ones; +50-58 now)."""
    peaks = scored_peaks(tmp_path, REPORT, split=True)
    assert peaks[120_000] - peaks[4_000] <= 90, peaks
    assert (tmp_path / "n120000" / "extremes.md").read_text().count("| a caption ") == 40
