"""The report's memory at COCO's size (issue 55): the gallery reads the split's images and the
shown images' captions, not the whole captions table, so its peak does not grow with the data
(+268 MB at 123,287 images before, the table read whole as pandas)."""

from pathlib import Path

import numpy as np
import pandas as pd
from conftest import child_peak_mb

from distinctcap.core.io import write_table

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
