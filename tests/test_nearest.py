"""The evaluate job's nearest training images (evaluate.nearest, evaluate.loaded): the pool
read a block at a time gives the neighbours of the whole pool, and the job's memory for them
does not grow with the training set (issue 55: the training images' pooled features, 242 MB
for COCO, were held for every decoding of the job)."""

from __future__ import annotations

import sys
import tracemalloc

import numpy as np
import pytest
from conftest import ROOT

from distinctcap.core.io import read_table
from distinctcap.evaluate.loaded import JobLoads, load_pooled, pooled_blocks
from distinctcap.evaluate.nearest import nearest, nearest_in_blocks

sys.path.insert(0, str(ROOT / "bench"))  # the synthetic stores live beside the benchmarks
from synthetic_store import write_store  # noqa: E402


def test_blocks_of_any_size_give_the_whole_pools_neighbours():
    rng = np.random.default_rng(0)
    query, pool = rng.standard_normal((40, 16)), rng.standard_normal((300, 16))
    whole = np.argsort(-(query @ pool.T), axis=1, kind="stable")
    cuts = [0, 5, 105, 106, 300]
    blocks = [pool[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    for k in (1, 7, 300):
        assert (nearest_in_blocks(query, iter(blocks), k, chunk=16) == whole[:, :k]).all()


def test_no_blocks_or_no_query_rows_give_empty_answers():
    query = np.ones((3, 4), np.float32)
    assert nearest_in_blocks(query, [], 5).shape == (3, 0)
    assert nearest(query, np.zeros((0, 4), np.float32), 5).shape == (3, 0)
    assert nearest(np.zeros((0, 4), np.float32), np.ones((9, 4)), 5).shape == (0, 5)


def training_ids(paths) -> list[int]:
    images = read_table(paths["images"])
    return images[images.split == "train"].image_id.astype(int).tolist()


def test_the_jobs_training_neighbours_equal_nearest_over_all_training_features(tmp_path):
    paths = write_store(tmp_path, 250, test=20, grid_tokens=1, grid_dim=4, pooled_dim=6,
                        vocab_size=50, image_shard_size=64, workers=1)  # fmt: skip
    features, train = paths["features"], training_ids(paths)
    images = read_table(paths["images"])
    ids = images[images.split == "test"].image_id.astype(int).tolist()
    query, pool = load_pooled(features, ids), load_pooled(features, train)
    loads = JobLoads()
    near, rows_of = loads.training_neighbours(features, ids, train, 5)
    assert rows_of == train and (near == nearest(query, pool, 5)).all()
    by_block = nearest_in_blocks(query, pooled_blocks(features, train, block=50), 5)
    assert (by_block == near).all()
    assert loads.training_neighbours(features, ids, train, 5)[0] is near  # once per job


@pytest.mark.slow
def test_the_jobs_memory_for_neighbours_does_not_grow_with_the_training_images(tmp_path):
    """16,384 vs 65,536 training images of 512-d pooled features (32 vs 128 MB), the same
    1,000 test images: holding the training features, as the job did before, took ~4x."""

    def peak(n_train: int) -> int:
        paths = write_store(tmp_path / f"n{n_train}", n_train + 1000, test=1000,
                            captions_per_image=1, grid_tokens=1, grid_dim=8, vocab_size=50,
                            workers=1)  # fmt: skip
        images = read_table(paths["images"])
        ids = images[images.split == "test"].image_id.astype(int).tolist()
        train = training_ids(paths)
        tracemalloc.start()
        JobLoads().training_neighbours(paths["features"], ids, train, 5)
        used = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return used

    small, large = peak(16_384), peak(65_536)
    assert large <= 1.25 * small, (small, large)
