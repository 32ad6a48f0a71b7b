"""The feature store reads what a job needs (issue #16): the loaders give exactly the arrays of
a full read of the shards, for every image and for a selection, from the shards or the grid
cache; and a decode job's peak memory does not grow when unrelated images join the store."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import ROOT, child_peak_mb

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_json
from distinctcap.features.read import (
    ImageFeatures,
    cached,
    feature_ids,
    grid_cache,
    grid_cache_path,
    load_image_features,
    load_text_features,
)

sys.path.insert(0, str(ROOT / "bench"))  # the synthetic stores live beside the benchmarks
from synthetic_store import write_store  # noqa: E402


def full_read(index_path, kind, columns):
    """The loader as it was before issue #16: every shard read whole and concatenated."""
    index = read_json(index_path)
    tables = [
        pq.read_table(index_path.parent / e["path"], columns=columns)
        for e in index[kind]["shards"]
    ]
    out = []
    for name in columns:
        chunks = [t.column(name).combine_chunks() for t in tables]
        if name.endswith("_id"):
            out.append(np.concatenate([c.to_numpy() for c in chunks]).astype(np.int64))
        else:
            width = chunks[0].type.list_size
            out.append(np.concatenate([c.flatten().to_numpy().reshape(-1, width) for c in chunks]))
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # small shards and an uneven last one, so selections cross shard boundaries
    root = tmp_path_factory.mktemp("store")
    return write_store(
        root, 250, test=20, grid_tokens=4, grid_dim=8, pooled_dim=6, vocab_size=50,
        image_shard_size=64, text_shard_size=300,
    )


def test_loaders_equal_a_full_read_for_every_image_and_a_selection(store):
    index = store["features"]
    ids, pooled, grid = full_read(index, "images", ["image_id", "pooled", "grid"])
    grid = grid.reshape(len(ids), 4, 8)
    got_ids, got_pooled, got_grid = load_image_features(index)
    assert got_ids.dtype == np.int64 and got_pooled.dtype == np.float32
    assert got_grid.dtype == np.float16 and got_grid.shape == (250, 4, 8)
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_pooled, pooled)
    np.testing.assert_array_equal(got_grid.view(np.uint16), grid.view(np.uint16))  # bit-equal
    assert load_image_features(index, grid=False)[2] is None
    np.testing.assert_array_equal(feature_ids(index), ids)

    rng = np.random.default_rng(1)
    pick = rng.choice(250, 40, replace=False)  # unsorted, every shard, and a repeat
    pick = np.concatenate([pick, pick[:1]])
    sel_ids, sel_pooled, sel_grid = load_image_features(index, image_ids=ids[pick])
    np.testing.assert_array_equal(sel_ids, ids[pick])
    np.testing.assert_array_equal(sel_pooled, pooled[pick])
    np.testing.assert_array_equal(sel_grid.view(np.uint16), grid[pick].view(np.uint16))
    with pytest.raises(DistinctcapError, match=r"no image features for image ids \[3\]"):
        load_image_features(index, image_ids=[int(ids[0]), 3])

    cap_ids, text = full_read(index, "texts", ["caption_id", "embedding"])
    got_cap, got_text = load_text_features(index)
    np.testing.assert_array_equal(got_cap, cap_ids)
    np.testing.assert_array_equal(got_text, text)


def test_image_features_from_shards_and_from_the_grid_cache_are_the_same(store):
    index = store["features"]
    ids, pooled, grid = load_image_features(index)
    some = ids[[200, 3, 64, 63, 249]]
    assert not grid_cache_path(index).exists()
    from_shards = ImageFeatures.load(index, some)  # no cache yet: reads the shards
    assert not grid_cache_path(index).exists()
    whole = ImageFeatures.load(index)  # training: builds the cache and maps it
    assert grid_cache_path(index).is_file()
    assert isinstance(grid_cache(index), np.memmap)
    from_cache = ImageFeatures.load(index, some)  # a selection gathered from the cache
    assert torch.equal(whole.grid, torch.from_numpy(grid))
    assert torch.equal(whole.pooled, torch.from_numpy(pooled))
    np.testing.assert_array_equal(whole.image_ids, ids)
    for chosen in (from_shards, from_cache):
        np.testing.assert_array_equal(chosen.image_ids, some)
        assert torch.equal(chosen.grid, whole.grid[[200, 3, 64, 63, 249]])
        assert torch.equal(chosen.pooled, whole.pooled[[200, 3, 64, 63, 249]])
    # what training does with it: gather rows, convert, subset
    rows = torch.tensor([5, 0, 249])
    assert torch.equal(whole.grid[rows].float(), torch.from_numpy(grid[[5, 0, 249]]).float())
    assert torch.equal(whole.subset(some).grid, from_cache.grid)
    # the pooled embeddings are cached and read the same way
    assert isinstance(cached(index, "pooled"), np.memmap)
    assert torch.equal(whole.pooled_at(rows), torch.from_numpy(pooled[[5, 0, 249]]))


GATHER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from distinctcap.features.read import ImageFeatures, feature_ids
    index, count = sys.argv[1], int(sys.argv[2])
    ids = feature_ids(index)
    ImageFeatures.load(index, ids[np.linspace(0, len(ids) - 1, count).astype(int)])
    """
)


def test_a_selection_from_the_grid_cache_holds_the_selection_not_the_pages_it_read(tmp_path):
    """run_card, decode and evaluate read a selection of images; where the grid cache exists
    they gather it from there. Gathered through the map, each page read stayed in the job's
    RSS beside the copy (+369 MB for this 144 MB selection); read with plain reads it is the
    copy alone (+146 MB)."""
    index = write_store(tmp_path, 3000, test=100, vocab_size=50, seed=0)["features"]
    grid_cache(index)
    one, many = (child_peak_mb(GATHER, index, count) for count in (1, 2000))
    selection_mb = 2000 * 49 * 768 * 2 / 2**20  # 144 MB of float16 grid
    assert many - one <= 1.25 * selection_mb, (one, many)


BATCHES = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    from distinctcap.core.io import read_table
    from distinctcap.features.batches import CaptionData, select_captions
    from distinctcap.features.read import ImageFeatures
    from distinctcap.train.data import DeviceCaptions
    def mapped_file_mb():
        status = open("/proc/self/status").read().splitlines()
        return next(int(l.split()[1]) for l in status if l.startswith("RssFile")) / 1024
    root = sys.argv[1]
    features = ImageFeatures.load(root + "/features/index.json")
    captions = select_captions(read_table(root + "/data/captions.parquet", "captions"), "train")
    data = DeviceCaptions(CaptionData.from_table(captions, features, 8), torch.device("cpu"))
    rng = np.random.default_rng(0)
    before = mapped_file_mb()
    for _ in range(30):
        data.batch(torch.as_tensor(rng.choice(len(captions), 50, replace=False)))
    print(mapped_file_mb() - before)
    """
)


def test_training_batches_hold_their_rows_not_the_grid_cache_around_them(tmp_path):
    """Issue 55: the trainer gathered each batch through the grid cache's memory map, and every
    row touched mapped the page-cache folio around it into the job's RSS (1,500 random rows of
    the 40,000-image rehearsal's 2.9 GB cache: +554 MB; a long run maps the whole file). Here
    30 batches of 50 captions (1.5 MB of rows) of a 98 MB cache mapped 63-87 MB of it (eb2f449);
    read from the file, they map none of it (1.3 MB: the code the batches first run)."""
    paths = write_store(tmp_path, 100_000, test=100, captions_per_image=1, grid_tokens=1,
                        grid_dim=512, pooled_dim=8, vocab_size=50, grid_cache=True)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", BATCHES, str(paths["features"].parent.parent)],
                          capture_output=True, text=True, check=True, env=env)  # fmt: skip
    assert float(done.stdout.split()[-1]) <= 8, done.stdout


TRAINING_DATA = textwrap.dedent(
    """
    import sys
    from distinctcap.core.io import read_table
    from distinctcap.features.batches import CaptionData, select_captions
    from distinctcap.features.read import ImageFeatures, cached
    root = sys.argv[1]
    index = root + "/features/index.json"
    cached(index, "pooled")  # built by the first training job: not what a job holds
    cached(index, "grid")
    features = ImageFeatures.load(index)
    captions = read_table(root + "/data/captions.parquet", "captions",
                          ["caption_id", "image_id", "split", "tokens"])
    data = CaptionData.from_table(select_captions(captions, "train"), features, 16)
    del captions
    """
)


def test_training_data_holds_its_captions_not_the_images_tables(tmp_path):
    """Issue 55: a COCO training job (590,855 captions, 123,166 images) peaked 1,838 MB
    against 1,221 at 10,000 images. It held every image's pooled embedding (252 MB), its token
    rows as int64 (151 MB), and built them from a Python list per caption (+300 MB while
    loading). Here 20,000 against 80,000 images of five captions: the old code's peak grew by
    580 MB (3384c85), now by 142 (the 300,000 more captions' rows, ids and table)."""
    peaks = {}
    for n in (20_000, 80_000):
        root = tmp_path / f"n{n}"
        write_store(root, n, test=100, grid_tokens=1, grid_dim=8, pooled_dim=512,
                    vocab_size=1000, seed=0)  # fmt: skip
        peaks[n] = child_peak_mb(TRAINING_DATA, root)
    assert peaks[80_000] - peaks[20_000] <= 200, peaks


DECODE = textwrap.dedent(
    """
    import resource, sys
    import torch
    from distinctcap.evaluate.decode import decode_run
    from distinctcap.captioner.model import Captioner, CaptionerConfig
    root = sys.argv[1]
    torch.manual_seed(0)
    cfg = CaptionerConfig(vocab_size=50, visual_dim=768, pooled_dim=512, width=32,
                          enc_layers=1, dec_layers=1, heads=2, ffn=64, max_len=8)
    Captioner(cfg).save(root + "/model.pt")
    decode_run(root + "/model.pt", root + "/features/index.json", root + "/data/images.parquet",
               root + "/data/vocab.json", root + "/generated.parquet", "mem", "test",
               {"kind": "greedy"}, device=torch.device("cpu"))
    """
)


def decode_peak_kib(root) -> int:
    child = subprocess.Popen(
        [sys.executable, "-c", DECODE, str(root)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    _, status, usage = os.wait4(child.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return usage.ru_maxrss


def test_decode_memory_does_not_grow_with_unrelated_images(tmp_path):
    # 2,000 vs 8,000 images of 49 x 768 float16 (150 vs 600 MB of grid), the same 100 test
    # images' worth of work: the old full read peaked at ~3.2x the grid (~2.2 GB vs ~0.8 GB)
    peaks = {}
    for n in (2000, 8000):
        write_store(tmp_path / f"n{n}", n, test=100, vocab_size=50, seed=0)
        peaks[n] = decode_peak_kib(tmp_path / f"n{n}")
    assert peaks[8000] / peaks[2000] <= 1.25, peaks


def full_read_features(index_path, image_ids=None):
    """ImageFeatures as the loader before issue #16 gave them: every shard read whole."""
    index_path = Path(index_path)
    ids, pooled, grid = full_read(index_path, "images", ["image_id", "pooled", "grid"])
    tokens = read_json(index_path)["images"]["grid_tokens"]
    features = ImageFeatures(
        ids, torch.from_numpy(pooled), torch.from_numpy(grid.reshape(len(ids), tokens, -1))
    )
    return features if image_ids is None else features.subset(image_ids)


def test_training_and_decoding_give_the_same_numbers_as_with_a_full_read(
    store, tmp_path, monkeypatch
):
    # the store changes how features are read (row groups, a mapped grid cache), never the
    # numbers: a tiny run trained and decoded both ways ends with the same weights and captions
    from train_job import fit

    from distinctcap.config.check import load
    from distinctcap.config.rungraph import effective_run_config
    from distinctcap.core.io import read_table
    from distinctcap.evaluate.decode import decode_run

    cfg = effective_run_config(
        load(ROOT / "tests/tiny_config.yaml", ROOT / "workflow/schemas/config.schema.yaml"),
        "reference",
    )
    cfg["train"].update(steps=6, warmup_steps=1, val_every=3, val_captions=20,
                        checkpoint_every=0)
    cfg["device"] = "cpu"
    runs = {}
    for how in ("store", "full read"):
        if how == "full read":
            monkeypatch.setattr(ImageFeatures, "load", staticmethod(full_read_features))
        out = tmp_path / how
        cfg["paths"] = {
            "captions": str(store["captions"]),
            "vocab": str(store["vocab"]),
            "features": str(store["features"]),
            "out_dir": str(out),
        }
        result = fit(cfg)
        result.model.save(out / "model.pt")
        decode_run(out / "model.pt", store["features"], store["images"], store["vocab"],
                   out / "generated.parquet", "r", "test", {"kind": "greedy"},
                   device=torch.device("cpu"))
        runs[how] = result.model.state_dict(), read_table(out / "generated.parquet")
    (weights, generated), (weights_old, generated_old) = runs["store"], runs["full read"]
    assert weights.keys() == weights_old.keys()
    assert all(torch.equal(weights[k], weights_old[k]) for k in weights)
    assert generated.equals(generated_old)


@pytest.mark.parametrize("chunks_per_read", [1, 4])
def test_the_entropy_stage_streams_captions_to_the_numbers_of_a_whole_read(
    tmp_path, monkeypatch, chunks_per_read
):
    """score_captions reads the caption embeddings shard by shard (shards of 700 rows, blocks of
    256: neither divides the other), and the images a read at a time (3 reads of 100 of the
    280 train images, or one read), and gives retrieval_entropy's numbers on the whole matrix
    bit for bit."""
    from distinctcap.core.io import read_table
    from distinctcap.features import entropy
    from distinctcap.features.entropy import retrieval_entropy, score_captions
    from distinctcap.features.read import load_image_features

    monkeypatch.setattr(entropy, "CHUNKS_PER_READ", chunks_per_read)
    paths = write_store(tmp_path, 300, test=20, text_shard_size=700, image_shard_size=128)
    captions = read_table(paths["captions"], "captions")
    got = score_captions(paths["features"], captions, text_chunk=256, chunk=100)
    train = captions[captions.split == "train"].sort_values("caption_id")
    ids, text = load_text_features(paths["features"])
    image_ids, pooled, _ = load_image_features(paths["features"], grid=False)
    images = torch.from_numpy(pooled[np.isin(image_ids, train.image_id.unique())])
    rows = np.searchsorted(ids, train.caption_id.to_numpy())
    scale = read_json(paths["features"])["logit_scale"]
    want = retrieval_entropy(torch.from_numpy(text[rows]), images, scale, chunk=100,
                             text_chunk=256)  # fmt: skip
    assert np.array_equal(got.caption_id, train.caption_id)
    assert np.array_equal(got.entropy.to_numpy(), want.numpy())


ENTROPY = textwrap.dedent(
    """
    import sys
    from distinctcap.core.io import read_table
    from distinctcap.features.entropy import score_captions
    root = sys.argv[1]
    columns = ["caption_id", "image_id", "split"]  # as rule retrieval_entropy reads them
    captions = read_table(root + "/data/captions.parquet", "captions", columns)
    score_captions(root + "/features/index.json", captions)
    """
)


def peak_kib(code: str, root) -> int:
    """Peak RSS (KiB) of `code` run in a child with argv[1] = `root` (os.wait4's count)."""
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(root)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    _, status, usage = os.wait4(child.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return usage.ru_maxrss


def test_entropy_memory_grows_by_the_images_embeddings_not_the_captions(tmp_path):
    """1,000 vs 8,000 images of 40 captions each (40k vs 320k captions; a one-token grid, since
    the stage reads none): the peak grows by about the 7,000 extra images' pooled embeddings
    (14 MB), not by the captions' embeddings (575 MB more), which the stage read whole and
    copied, beside the whole captions table, before issue 55 (+1.4 GB then, measured on the
    2-core box; the streamed stage's peak varies by up to ~150 MB between runs there)."""
    peaks = {}
    for n in (1000, 8000):
        write_store(tmp_path / f"n{n}", n, test=100, vocab_size=50, captions_per_image=40,
                    grid_tokens=1, grid_dim=8)  # fmt: skip
        peaks[n] = peak_kib(ENTROPY, tmp_path / f"n{n}")
    assert (peaks[8000] - peaks[1000]) / 1024 <= 300, peaks


IMAGE_CHUNKS = textwrap.dedent(
    """
    import sys
    import torch
    import torch.nn.functional as F
    from distinctcap.features.entropy import entropies_by_image_chunks
    from distinctcap.features.read import feature_ids, pooled_reads
    index, chunk = sys.argv[1] + "/features/index.json", int(sys.argv[2])
    ids = feature_ids(index)
    text = F.normalize(torch.randn(256, 512, generator=torch.Generator().manual_seed(0)), dim=1)
    chunks = pooled_reads(index, ids, chunk or len(ids), torch.device("cpu"))  # 0: one read
    entropy = entropies_by_image_chunks(lambda: (text[:128], text[128:]), chunks, 50.0)
    assert entropy.shape == (256,) and torch.isfinite(entropy).all()
    """
)


def test_entropy_holds_a_chunk_of_the_images_not_all_of_them(tmp_path):
    """The entropy stage's image side: 4,000 against 64,000 images' pooled embeddings (512
    float32, 8 against 131 MB), read 4,096 at a time, grow the peak by under 40 MB; read in one
    chunk, as the stage held them before (242 MB at COCO's size), by over 100 MB."""
    peaks = {}
    for n in (4_000, 64_000):
        write_store(tmp_path / f"n{n}", n, test=100, vocab_size=50, captions_per_image=1,
                    grid_tokens=1, grid_dim=8)  # fmt: skip
        peaks[n] = {c: child_peak_mb(IMAGE_CHUNKS, tmp_path / f"n{n}", c) for c in (4096, 0)}
    chunked, whole = (peaks[64_000][c] - peaks[4_000][c] for c in (4096, 0))
    assert chunked <= 40 and whole >= 100, peaks
