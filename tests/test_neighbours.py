"""The neighbours stage at COCO's size (issue 55): the keys meet each chunk of queries a tile at a
time, from a spilled file, so the stage's memory is set by its tiles, not by the N keys."""

import sys
import textwrap

import numpy as np
import torch
import torch.nn.functional as F
from conftest import ROOT, child_peak_mb
from test_specificity import EXPECTED, circle

from distinctcap.features import neighbours
from distinctcap.features.neighbours import (
    PooledFile,
    build_table,
    read_neighbours,
    top_neighbours,
    write_neighbours,
)
from distinctcap.features.read import load_image_features

sys.path.insert(0, str(ROOT / "bench"))  # the synthetic stores live beside the benchmarks
from synthetic_store import write_store  # noqa: E402


def unit_rows(n: int, dim: int, seed: int = 0) -> torch.Tensor:
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)


def test_keys_in_tiles_give_the_answer_of_all_keys_at_once(monkeypatch):
    """Tiles smaller than k, than a chunk, and not dividing N: each tile's best merged with the
    best so far is the top k of all keys, self excluded in whichever tile holds it."""
    emb = unit_rows(300, 8)
    whole = top_neighbours(emb, 12)
    for key_rows in (3, 7, 64):
        monkeypatch.setattr(neighbours, "KEY_ROWS", key_rows)
        assert torch.equal(top_neighbours(emb, 12, chunk=32), whole), key_rows
        assert top_neighbours(circle(), 5, chunk=2).tolist() == EXPECTED


def test_a_pooled_file_gives_the_table_of_the_pooled_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(neighbours, "KEY_ROWS", 50)
    ids, emb = np.arange(200) * 7 + 3, unit_rows(200, 16)
    (tmp_path / "keys.f32").write_bytes(emb.numpy().tobytes())
    keys = PooledFile(tmp_path / "keys.f32", 200, 16)
    write_neighbours(ids, emb, tmp_path / "memory.parquet", fraction=0.05)
    write_neighbours(ids, keys, tmp_path / "file.parquet", fraction=0.05)
    memory, file = (read_neighbours(tmp_path / f) for f in ("memory.parquet", "file.parquet"))
    assert np.array_equal(memory[0], file[0]) and np.array_equal(memory[1], file[1])


def test_the_stage_reads_the_store_and_leaves_no_spilled_keys(tmp_path):
    paths = write_store(tmp_path, 400, test=100, captions_per_image=1, grid_tokens=1, grid_dim=4,
                        pooled_dim=32, vocab_size=50)  # fmt: skip
    out = tmp_path / "neighbours" / "train_top2pct.parquet"
    k = build_table(paths["features"], paths["images"], out, pct=2.0)
    train, pooled, _ = load_image_features(paths["features"], grid=False)
    images = read_neighbours(out)
    is_train = np.isin(train, images[0])
    expected = top_neighbours(torch.from_numpy(pooled[is_train]), k).numpy()
    assert k == 6 and np.array_equal(images[1], train[is_train][expected])
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]


BUILD = textwrap.dedent(
    """
    import sys
    from distinctcap.features import neighbours
    neighbours.KEY_ROWS = neighbours.READ_ROWS = 256  # a COCO-size run's tiles and reads, shrunk
    root = sys.argv[1]
    neighbours.build_table(root + "/features/index.json", root + "/data/images.parquet",
                           root + "/train_top1pct.parquet", chunk=128)
    """
)


def test_the_stages_memory_does_not_grow_with_the_keys(tmp_path):
    """Issue 55: the stage held the N train images' keys (242 MB at 123,287 images, x1.58 of its
    10,000-image peak there). Now 4,400 more images of 4,096-d keys (+69 MB of keys) add
    under a third of that to its peak: the keys are read a tile at a time from a spilled file."""
    peaks = {}
    for n in (600, 5000):
        write_store(tmp_path / str(n), n + 50, test=50, captions_per_image=1, grid_tokens=1,
                    grid_dim=4, pooled_dim=4096, vocab_size=50, image_shard_size=256)  # fmt: skip
        peaks[n] = child_peak_mb(BUILD, tmp_path / str(n))
    keys_mb = 4400 * 4096 * 4 / 2**20
    assert peaks[5000] - peaks[600] <= keys_mb / 3, (peaks, keys_mb)


TOP_HALF = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    import torch.nn.functional as F
    from distinctcap.features.neighbours import write_neighbours
    n = int(sys.argv[1])
    emb = F.normalize(torch.randn(n, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    write_neighbours(np.arange(n), emb, sys.argv[2], fraction=0.5)
    """
)


def test_the_stages_memory_does_not_grow_with_the_neighbours_an_image(tmp_path):
    """Issue 55: k grows with N (1% of the training images: 1,183 at COCO's size), and a
    chunk's best k and its tiles' were allocated anew per tile: 2,000 more neighbours an image
    added 92-102 MB to the peak. Now the tensors are taken once per pass and a chunk takes fewer
    queries when k is large (TOP_BYTES), so the peak stays: here the top half, 2,000 vs 4,000."""
    peaks = {n: child_peak_mb(TOP_HALF, n, tmp_path / f"{n}.parquet") for n in (4000, 8000)}
    assert peaks[8000] - peaks[4000] <= 30, peaks
    ids, table = read_neighbours(tmp_path / "8000.parquet")
    assert table.shape == (8000, 4000) and (table != ids[:, None]).all()
