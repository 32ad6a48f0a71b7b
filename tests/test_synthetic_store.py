"""bench/synthetic_store.py after issue 42 (one random block per kind, varied per shard, shards
written by a pool of threads): the values are still what readers expect (finite grids in the
block's range, unit vectors), no two shards hold the same rows (a reader that mixes shards up
still gets other numbers), the store does not depend on how many threads wrote it, and the grid
cache it can write is the one training would build from its shards."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import ROOT

from distinctcap.core.io import read_json
from distinctcap.features.read import (
    grid_cache,
    grid_cache_path,
    load_image_features,
    load_text_features,
)

sys.path.insert(0, str(ROOT / "bench"))  # the synthetic stores live beside the benchmarks
from synthetic_store import write_store  # noqa: E402

SMALL = {  # 4 image shards (the last one short), 5 text shards
    "test": 20,
    "grid_tokens": 4,
    "grid_dim": 8,
    "pooled_dim": 6,
    "vocab_size": 50,
    "image_shard_size": 64,
    "text_shard_size": 300,
}


def features(index: str):
    """(pooled, grid, text embeddings) of every image and caption, as numpy arrays."""
    _, pooled, grid = load_image_features(index)
    return pooled, grid, load_text_features(index)[1]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    return [
        write_store(root / f"w{workers}", 250, workers=workers, grid_cache=workers > 1, **SMALL)[
            "features"
        ]
        for workers in (1, 3)
    ]


def test_values_are_finite_unit_and_distinct_across_shards(stores):
    pooled, grid, texts = features(stores[0])
    assert pooled.shape == (250, 6) and grid.shape == (250, 4, 8) and texts.shape == (1250, 6)
    assert np.isfinite(grid).all() and (np.abs(grid) >= 0.125).all() and (np.abs(grid) < 4).all()
    assert np.allclose(np.linalg.norm(pooled, axis=1), 1, atol=1e-5)
    assert np.allclose(np.linalg.norm(texts, axis=1), 1, atol=1e-5)
    for values in (pooled, grid.reshape(250, -1), texts):
        assert len(np.unique(values, axis=0)) == len(values)  # every row, every shard its own
    index = read_json(stores[0])
    assert len(index["images"]["shards"]) == 4 and len(index["texts"]["shards"]) == 5


def test_the_store_is_the_same_whatever_the_threads(stores):
    for one, three in zip(features(stores[0]), features(stores[1]), strict=True):
        assert np.array_equal(one, three)


def test_the_grid_cache_written_with_the_store_is_the_grid_of_the_shards(stores):
    assert grid_cache_path(stores[1]).is_file()  # written by the store, not built here
    _, grid, _ = features(stores[1])
    cached = grid_cache(stores[1])
    assert cached.dtype == grid.dtype and np.array_equal(cached, grid)
