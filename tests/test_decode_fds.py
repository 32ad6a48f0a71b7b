"""clip.features.decode tensor with DataLoader workers under a small `ulimit -n` (issue 42):
a worker sends each tensor through a file descriptor of its own, so one tensor per JPEG ran
a default limit out of descriptors and the loader hung; a batch is now one tensor
(decode.Packed). Also: a Packed batch unpacks to the items one by one, and the files PIL
decodes instead are counted by reason."""

import subprocess
import sys
from collections import Counter

import numpy as np
import open_clip
import pandas as pd
import pytest
import torch
from PIL import Image

from distinctcap.clip.load import byte_transform, load_clip
from distinctcap.features.decode import ImageBytes, device_batches, tensor_steps, unpacked
from distinctcap.features.extract import FeatureSettings, ImageFiles, extract_images
from distinctcap.features.store import plan_shards
from distinctcap.train.clip import save_weights

ARCH = "shapes-vit-tiny"
CPU = torch.device("cpu")

# Extracts the images of the table argv[1] with the weights argv[2] into argv[3]: 2 workers,
# tensor decoding; prints the rows written. Only what the API had before the fix, so the test
# shows the failure on the old code too.
EXTRACT = """
import sys
import pandas as pd, pyarrow.parquet as pq, torch
from distinctcap.clip.load import load_clip
from distinctcap.features.extract import FeatureSettings, extract_images
from distinctcap.features.store import plan_shards
images = pd.read_parquet(sys.argv[1])
clip = load_clip("shapes-vit-tiny", sys.argv[2])
settings = FeatureSettings(batch_size=100, workers=2, image_shard_size=200, decode="tensor")
keys = list(zip(images.image_id, images.file))
shards = plan_shards("images", keys, 200, "fds", __import__("pathlib").Path(sys.argv[3]))
extract_images(images, clip, shards, settings, torch.device("cpu"), torch.float32)
print(sum(pq.read_metadata(s.path).num_rows for s in shards))
"""


def small_jpeg(path, seed: int, mode: str = "RGB") -> str:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (48, 80, 3), dtype=np.uint8)).convert(mode).save(path)
    return str(path)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "clip.pt"
    torch.manual_seed(0)
    save_weights(open_clip.create_model(ARCH), path)
    return path


def test_tensor_decoding_with_workers_runs_under_ulimit_256(weights, tmp_path):
    """600 JPEGs (a CMYK one among them, PIL's pixels), 2 workers, batches of 100: before the
    fix a worker held ~250 descriptors and the loader waited forever (here: the timeout)."""
    files = [small_jpeg(tmp_path / f"{i}.jpg", i) for i in range(599)]
    files.append(small_jpeg(tmp_path / "cmyk.jpg", 599, "CMYK"))
    table = tmp_path / "images.parquet"
    pd.DataFrame({"image_id": range(len(files)), "file": files}).to_parquet(table)
    command = f'ulimit -n 256 && exec "$0" -c "$1" {table} {weights} {tmp_path / "cache"}'
    try:
        result = subprocess.run(
            ["bash", "-c", command, sys.executable, EXTRACT],
            capture_output=True, text=True, timeout=90,
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"extraction under ulimit -n 256 hung: {(error.stderr or b'')[-2000:]!r}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "600"


def test_a_packed_batch_is_its_items_and_counts_why_pil_decoded(weights, tmp_path):
    """The loader's one-tensor batch gives the same rows, kinds and values as the items one by
    one; the CMYK, grayscale, PNG and cut (no end marker) files are counted by reason, also
    through extract_images."""
    files = [small_jpeg(tmp_path / f"{i}.jpg", i) for i in range(3)]
    files.append(small_jpeg(tmp_path / "cmyk.jpg", 3, "CMYK"))
    files.append(small_jpeg(tmp_path / "gray.jpg", 4, "L"))
    files.append(small_jpeg(tmp_path / "image.png", 5))
    cut = tmp_path / "padded.jpg"  # PIL reads it; bytes after its end marker
    cut.write_bytes(open(files[0], "rb").read() + b"\0" * 16)
    files.append(str(cut))
    clip = load_clip(ARCH, str(weights))
    to_bytes = byte_transform(clip.preprocess)[0]
    pil = ImageFiles(files, to_bytes, clip.preprocess_cfg()["size"])
    dataset = ImageBytes(files, pil)
    fallbacks = Counter()
    [items] = unpacked([dataset.__getitems__(list(range(len(files))))], fallbacks)
    for (row, jpeg, values), i in zip(items, range(len(files)), strict=True):
        assert (row, jpeg) == dataset[i][:2] and torch.equal(values, dataset[i][2])
    want = {"CMYK JPEG": 1, "L JPEG": 1, "PNG file": 1, "JPEG without its end marker": 1}
    assert fallbacks == Counter(want)
    batch = next(device_batches([items], tensor_steps(to_bytes), pil, CPU))
    assert torch.equal(batch[3:], torch.stack([pil[i] for i in range(3, len(files))]))

    images = pd.DataFrame({"image_id": range(len(files)), "file": files})
    shards = plan_shards("images", list(range(len(files))), 4, "packed", tmp_path / "cache")
    settings = FeatureSettings(batch_size=4, workers=0, decode="tensor")
    counted = Counter()
    extract_images(images, clip, shards, settings, CPU, torch.float32, fallbacks=counted)
    assert counted == Counter(want)
