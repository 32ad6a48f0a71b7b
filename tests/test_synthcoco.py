"""The synthetic COCO's id table (distinctcap.data.synthcoco.Layout): the same table as before
issue 42's fix, and built in linear time (a set of the val ids rebuilt for every id took 130 s
at COCO's 123,287 ids before a single JPEG was encoded)."""

import hashlib
import json
import time

import pytest

from distinctcap.data.synthcoco import COCO_IMAGES, Layout


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
