"""The synthetic COCO's id table (distinctcap.data.synthcoco.Layout): the same table as before
issue 42's fix, and built in linear time (a set of the val ids rebuilt for every id took 130 s
at COCO's 123,287 ids before a single JPEG was encoded); its odd files (grayscale, CMYK,
progressive, truncated) and what the data stage's checks do with each."""

import hashlib
import json
import time
from collections import Counter

import pandas as pd
import pytest

from distinctcap.data.quality import check_tables
from distinctcap.data.synthcoco import (
    COCO_IMAGES,
    ODD_FILES,
    Layout,
    image_ids,
    jpeg_bytes,
    odd_counts,
    odd_kind,
    split_counts,
)


def layout_digest(layout: Layout) -> str:
    """sha256 of the three id tables in their order (dict order is the archives' order)."""
    tables = [list(t.items()) for t in (layout.part2014, layout.part2017, layout.karpathy)]
    return hashlib.sha256(json.dumps(tables).encode()).hexdigest()


@pytest.mark.parametrize(
    ("n", "expected"),
    [  # the digests of the quadratic version, before the fix
        (8, "cd469c886f2ca7309593275c5be39e4cf8dceaaebc0e9a6456c51eea167cd4a4"),
        (40, "fceb415c50f530342a983ce9f60dfbd66a8887aad8965118138f5ec768078971"),
        (1000, "70c77516708316f6742602b98de988cbea6c57ee57077ad846dfc658de1830a4"),
    ],
)
def test_the_layout_is_the_one_before_the_fix(n, expected):
    assert layout_digest(Layout.of(n)) == expected


def test_the_layout_of_cocos_size_takes_well_under_seconds():
    # ~0.1 s on the 2-core box; the quadratic version took 70-130 s: a 5 s bound holds on a
    # busy box and still fails the quadratic one by an order of magnitude
    start = time.perf_counter()
    layout = Layout.of(COCO_IMAGES)
    seconds = time.perf_counter() - start
    assert seconds < 5.0, f"Layout.of({COCO_IMAGES}) took {seconds:.1f} s"
    assert sum(p == "val2014" for p in layout.part2014.values()) == layout.counts.val2014


def test_odd_files_are_spread_one_kind_each_and_counted():
    assert odd_counts(1100) == {"grayscale": 12, "progressive": 6, "cmyk": 3, "truncated": 2}
    # index 8,258 is 13 mod 97 and 29 mod 211: grayscale, not also progressive
    assert odd_kind(image_ids(8259)[-1]) == "grayscale"
    assert odd_counts(8259)["progressive"] == len(range(29, 8259, 211)) - 1
    at_coco = odd_counts(COCO_IMAGES)
    assert at_coco["truncated"] == 121 and sum(at_coco.values()) < COCO_IMAGES // 45


def test_the_data_stage_keeps_grayscale_cmyk_progressive_and_quarantines_truncated(tmp_path):
    """The first image of each odd kind through the real checks (data.quality.check_tables):
    three decode and are counted by kind, the truncated one is quarantined with its reason and
    takes its captions with it; the plain image is kept."""
    first = {k: 9 + 7 * at for k, (_, at) in ODD_FILES.items()}
    ids = [9, *first.values()]
    for i in ids:
        (tmp_path / f"{i}.jpg").write_bytes(jpeg_bytes(i))
    images = pd.DataFrame(
        {"image_id": ids, "file": [f"{i}.jpg" for i in ids], "split": "train", "width": 1,
         "height": 1}
    )  # fmt: skip
    captions = pd.DataFrame(
        {"caption_id": ids, "image_id": ids, "split": "train", "text": "a red dog near a cat"}
    )
    kinds = Counter()
    kept, kept_captions, quarantine = check_tables(images, captions, tmp_path, "skip", kinds)
    assert sorted(kept.image_id) == sorted(i for i in ids if i != first["truncated"])
    assert first["truncated"] not in set(kept_captions.image_id)
    assert kinds == Counter({"RGB": 1, "L": 1, "CMYK": 1, "RGB+progressive": 1})
    image_row = quarantine[quarantine.kind == "image"].iloc[0]
    assert image_row.id == str(first["truncated"])
    assert image_row.reason.startswith("unreadable image: OSError: image file is truncated")
    assert list(quarantine.kind) == ["image", "caption"]


def test_cocos_val_keeps_cocos_val_and_test_splits_at_every_size():
    """bench/rehearsal.py's sizes: mrnn's 4,000 val and 1,000 test images at 10k and 40k as at
    COCO's size, where both ways are COCO's own counts; the layout holds them."""
    for n, train in ((10_000, 5_000), (40_000, 35_000)):
        counts = split_counts(n, cocos_val=True)
        assert (counts.train2017, counts.val2017, counts.mrnn_val_images) == (train, 5000, 4000)
        assert sum(p == "val2017" for p in Layout.of(n, True).part2017.values()) == 5000
    assert split_counts(COCO_IMAGES, cocos_val=True) == split_counts(COCO_IMAGES)
    assert split_counts(300, cocos_val=True).val2017 == 150  # half, at most
