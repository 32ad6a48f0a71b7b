"""What one evaluate job reads once for all its (split, decoding) evaluations (issue 46).

An evaluate or evaluate_gpu job covers every (split, decoding) of a run; each evaluation needs
the same models and the same rows of the same files: the trainer's CLIP and the judge CLIP,
the captioner and its tokenizer, GPT-2, the pooled CLIP features of the split and of its
nearest training images (the training features pass a block at a time), the judge's pooled
features, the captioner's image features of the split, the images table and the training
references. `JobLoads` reads each once (per key: path, device, image ids) and hands the same
object to every later evaluation. One is made per job (`evaluate_stage`,
`evaluate_device_stage`) and dropped with it, never a module-level cache, so a test or a long
process never sees another job's files. Nothing here counts work
(distinctcap.core.work): the counters sit in the scorers, which run once per evaluation as
before.

Sharing is safe because no scorer changes what it is handed: the CLIPs and GPT-2 run in
inference mode, `block_logprobs` puts the captioner back in the mode it found it in, and the
feature arrays and tables are only read.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from distinctcap.core.io import read_json, read_table, release_arrow_memory
from distinctcap.evaluate.nearest import POOL_BLOCK, nearest_in_blocks
from distinctcap.features.read import feature_ids, load_image_features

T = TypeVar("T")
CAPTION_COLUMNS = ["image_id", "split", "text"]  # what the metrics read of the captions


def captions_by_image(captions: pd.DataFrame, image_ids: Sequence[int]) -> dict[int, list[str]]:
    """image id -> its reference texts, for the given ids (in that order)."""
    groups = captions[captions.image_id.isin(image_ids)].groupby("image_id").text.agg(list)
    return {int(i): list(groups[i]) for i in image_ids if i in groups.index}


def read_split_captions(captions: str | Path, split: str) -> pd.DataFrame:
    """The image_id and text of the split's rows of a captions table."""
    table = read_table(captions, "captions", columns=CAPTION_COLUMNS)
    rows = table[table.split == split].drop(columns="split").reset_index(drop=True)
    del table
    release_arrow_memory()  # the whole table's buffers: 100 MB at COCO's size
    return rows


def load_pooled(features: str | Path, ids: Sequence[int]) -> np.ndarray:
    """Pooled features of `ids` (L2-normalised, in that order): only these rows of the pooled
    column are read, never the grid."""
    return load_image_features(features, grid=False, image_ids=list(ids))[1]


def training_with_features(features: str | Path, train_ids: Iterable[int]) -> list[int]:
    """The training images that have features, in `train_ids`' order."""
    have = set(feature_ids(features).tolist())
    return [i for i in train_ids if i in have]


def pooled_blocks(
    features: str | Path, ids: Sequence[int], block: int = POOL_BLOCK
) -> Iterator[np.ndarray]:
    """`load_pooled` of `ids`, `block` rows at a time: one block is held, not all of them."""
    for s in range(0, len(ids), block):
        yield load_pooled(features, ids[s : s + block])


class JobLoads:
    """Memoised loaders of one evaluate job: each (what, key) is loaded on first use."""

    def __init__(self) -> None:
        self._kept: dict[Hashable, Any] = {}
        self.loads: dict[str, int] = {}  # what -> how many times it was read (the bench's check)

    def _once(self, what: str, key: tuple, load: Callable[[], T]) -> T:
        if (what, key) not in self._kept:
            self._kept[what, key] = load()
            self.loads[what] = self.loads.get(what, 0) + 1
        return self._kept[what, key]

    def table(self, path: str | Path) -> pd.DataFrame:
        """A data table (the images), read once."""
        return self._once("table", (str(path),), lambda: read_table(path))

    def split_captions(self, captions: str | Path, split: str) -> pd.DataFrame:
        """The split's rows of the captions table (image_id, text), read once. The job keeps
        these and the training references (`train_refs`), never the whole table: at COCO's
        size it held 238 MB of RSS, with the token ids that no metric reads (issue 55)."""
        return self._once("split_captions", (str(captions), split),
                          lambda: read_split_captions(captions, split))  # fmt: skip

    def train_refs(self, images: str | Path, captions: str | Path) -> dict[int, list[str]]:
        """Training image id -> its captions (the novelty and consensus references)."""

        def load() -> dict[int, list[str]]:
            table = self.table(images)
            train_ids = table[table.split == "train"].image_id.astype(int).tolist()
            return captions_by_image(read_split_captions(captions, "train"), train_ids)

        return self._once("train_refs", (str(images), str(captions)), load)

    def pooled(self, features: str | Path, ids: Sequence[int]) -> np.ndarray:
        """`load_pooled` of these ids, read once."""
        key = (str(features), tuple(ids))
        return self._once("pooled", key, lambda: load_pooled(features, ids))

    def training_neighbours(
        self, features: str | Path, ids: Sequence[int], train_ids: Iterable[int], k: int
    ) -> tuple[np.ndarray, list[int]]:
        """(rows of the k nearest training images of each of `ids` by pooled features, the
        training images with features that the rows index), found once per k. The training
        features pass a block at a time (evaluate.nearest): the job never holds them all,
        242 MB for COCO's 118,287 training images."""
        train_key = (str(features), tuple(train_ids))
        train = self._once("train_with_features", train_key,
                           lambda: training_with_features(features, train_key[1]))  # fmt: skip

        def find() -> np.ndarray:
            query = self.pooled(features, ids)
            return nearest_in_blocks(query, pooled_blocks(features, train), k)

        return self._once("training_neighbours", (*train_key, tuple(ids), k), find), train

    def clip(self, arch: str, pretrained: str, device: str, tag: str | None = None):
        """A CLIP (distinctcap.clip.load.load_clip) in eval mode on `device`."""
        from distinctcap.clip.load import load_clip  # open_clip takes seconds to import

        key = (arch, pretrained, str(device), tag)
        return self._once("clip", key, lambda: load_clip(arch, pretrained, device, tag))

    def features_clip(self, index_path: str | Path, device: str):
        """The CLIP that computed the features (arch and weights from the index's manifest)."""
        manifest = self._once("manifest", (str(index_path),), lambda: read_json(index_path))
        m = manifest["manifest"]
        return self.clip(m["arch"], m["pretrained"], device, m.get("tag"))

    def judge_pooled(self, features: str | Path, ids: Sequence[int]) -> tuple[np.ndarray, dict]:
        """(the judge's pooled features of `ids`, its manifest): features.pooled.read_pooled."""
        from distinctcap.features.pooled import read_pooled

        return self._once("judge_pooled", (str(features), tuple(ids)),
                          lambda: read_pooled(features, ids))  # fmt: skip

    def image_features(self, index_path: str | Path, ids: Sequence[int]):
        """features.read.ImageFeatures of `ids` (the captioner's own, or CLIP's)."""
        from distinctcap.features.read import ImageFeatures

        return self._once("image_features", (str(index_path), tuple(ids)),
                          lambda: ImageFeatures.load(index_path, ids))  # fmt: skip

    def captioner(self, model: str | Path, vocab: str | Path, device: str):
        """(a run's captioner on `device`, its tokenizer)."""
        from distinctcap.captioner.load import caption_tokenizer, load_captioner

        def load():
            captioner = load_captioner(model, map_location=device)
            return captioner, caption_tokenizer(captioner, vocab)

        return self._once("captioner", (str(model), str(vocab), str(device)), load)

    def gpt2(self, path: str | Path, device: str):
        """(tokenizer, model) of a local GPT-2 directory (evaluate.metrics.fluency.load_gpt2)."""
        from distinctcap.evaluate.metrics.fluency import load_gpt2

        return self._once("gpt2", (str(path), str(device)), lambda: load_gpt2(path, device))
