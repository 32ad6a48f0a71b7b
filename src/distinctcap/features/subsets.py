"""The D- / D+ split of the scored training captions and its report (UNKT §3.1).

Captions ranked by retrieval entropy H (`features.entropy`): the top `fraction` (high
entropy: the caption fits many images, i.e. generic, the "many-to-one" case) form D-, the rest
D+. Only the train split is scored and split; val/test captions are never in D- or D+.

No torch here: the split and report jobs load pandas and pyarrow only (issue 55: importing
torch was ~440 MB of each job's ~980 MB peak at COCO's size).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import (
    ROW_GROUP_ROWS,
    atomic_path,
    check_schema,
    read_columns,
    read_rows,
    read_table,
    release_arrow_memory,
    row_group_starts,
    row_pieces,
    rows_in,
    write_pieces,
)

log = logging.getLogger(__name__)

SUBSETS = ("D-", "D+")


def split_subsets(scores: Mapping[str, np.ndarray] | pd.DataFrame, fraction: float) -> pd.DataFrame:
    """Rank by entropy (highest first, ties by caption_id); the top `fraction` is D-, the rest
    D+ (UNKT §3.1: the top 50% by retrieval entropy form the negative set). The table is sorted
    by caption_id, its subset a categorical of SUBSETS: ranked with numpy, not pandas' sorts
    of the whole frame (issue 55: +52 MB for 600,000 captions)."""
    if not 0 < fraction < 1:
        raise DistinctcapError(f"entropy.fraction = {fraction}: choose 0 < fraction < 1")
    ids, entropy = np.asarray(scores["caption_id"]), np.asarray(scores["entropy"])
    if len(ids) < 2:
        raise DistinctcapError("need at least two train captions to split into D- and D+")
    ranked = np.lexsort((ids, -entropy))
    n_neg = min(max(round(fraction * len(ids)), 1), len(ids) - 1)
    code = np.ones(len(ids), dtype=np.int8)  # the index of the caption's subset in SUBSETS
    code[ranked[:n_neg]] = 0
    by_id = np.argsort(ids, kind="stable")
    return pd.DataFrame({
        "caption_id": ids[by_id], "image_id": np.asarray(scores["image_id"])[by_id],
        "entropy": entropy[by_id], "subset": pd.Categorical.from_codes(code[by_id], SUBSETS),
    })  # fmt: skip


def write_split(table: pd.DataFrame, path: str | Path) -> None:
    """The entropy table, written a row group at a time (issue 55: written whole, it left
    +38 MB held at COCO's size)."""
    pieces = (
        pa.Table.from_pandas(table.iloc[start : start + ROW_GROUP_ROWS], preserve_index=False)
        for start in range(0, len(table), ROW_GROUP_ROWS)
    )
    write_pieces(pieces, path, "entropy")


def read_split(path: str | Path) -> pd.DataFrame:
    """The entropy table as `split_subsets` made it, read a row group at a time (issue 55: the
    subset column read as Python strings added +96 MB for 600,000 captions)."""
    table = pd.DataFrame(read_columns(path, "entropy", ["caption_id", "image_id", "entropy"]))
    file, code = pq.ParquetFile(path), np.empty(len(table), dtype=np.int8)
    starts = row_group_starts(file)
    for g in range(file.num_row_groups):
        subset = file.read_row_group(g, columns=["subset"]).column(0)
        code[starts[g] : starts[g + 1]] = pc.not_equal(subset, SUBSETS[0]).to_numpy()
    return table.assign(subset=pd.Categorical.from_codes(code, SUBSETS))


def threshold(table: pd.DataFrame) -> float:
    """The lowest entropy in D- (the split point)."""
    return float(table.entropy[table.subset == "D-"].min())


def write_subsets(
    table: pd.DataFrame,
    captions: pq.ParquetFile,
    out_dirs: dict[str, str],
    shard_size: int = 100_000,
) -> dict[str, int]:
    """Each subset's captions (the captions file's columns + entropy), sorted by caption_id,
    as part-NNNNN.parquet shards of `shard_size` rows. Each shard is read from the row groups
    that hold its captions (`shard_pieces`): the job holds the scored captions' rows in the
    file and a row group, not the captions (issue 55: a pandas merge of COCO's 590,855
    training captions, token arrays and all, peaked +410 MB; the whole table kept packed
    still grew the peak x1.26 from 10,000 to 40,000 images). `table` is sorted by caption_id,
    as `split_subsets` leaves it."""
    in_file = read_columns(captions, None, ["caption_id"])["caption_id"]
    rows = rows_in(in_file, table.caption_id.to_numpy())
    del in_file
    if (rows < 0).any():
        missing = table.caption_id.to_numpy()[rows < 0]
        raise DistinctcapError(
            f"{len(missing)} scored captions are not in the captions file, "
            f"e.g. caption_id {missing[0]}"
        )
    entropy = table.entropy.to_numpy(np.float32)
    negative = (table.subset == "D-").to_numpy()
    counts = {}
    for name in SUBSETS:
        mine = negative if name == "D-" else ~negative
        subset_rows, subset_entropy = rows[mine], entropy[mine]
        folder = Path(out_dirs[name])
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("part-*.parquet"):
            stale.unlink()
        for i, start in enumerate(range(0, len(subset_rows), shard_size)):
            shard = slice(start, start + shard_size)
            pieces = shard_pieces(captions, subset_rows[shard], subset_entropy[shard])
            write_pieces(pieces, folder / f"part-{i:05d}.parquet", "captions")
        counts[name] = len(subset_rows)
    return counts


def shard_pieces(
    captions: pq.ParquetFile, rows: np.ndarray, entropy: np.ndarray
) -> Iterator[pa.Table]:
    """The captions at file rows `rows` (in caption_id order) with their entropies: a row
    group's part at a time where the file holds them in that order, as prepare_data writes
    it, so the job holds a row group rather than a shard; gathered whole otherwise."""
    if (np.diff(rows) < 0).any():
        yield read_rows(captions, rows).append_column("entropy", pa.array(entropy))
        return
    for pick, piece in row_pieces(captions, rows):
        yield piece.append_column("entropy", pa.array(entropy[pick]))


def read_subset(folder: str | Path) -> pd.DataFrame:
    """All captions of one subset folder (D- or D+), as a captions table with `entropy`."""
    parts = sorted(Path(folder).glob("part-*.parquet"))
    if not parts:
        raise DistinctcapError(f"{folder} holds no part-*.parquet shards")
    return pd.concat([read_table(p, "captions") for p in parts], ignore_index=True)


def split_stage(
    scores_path: str, captions_path: str, outputs: dict, fraction: float, shard_size: int
) -> dict:
    """The split rule: entropy table (with subset) + the D- / D+ shards."""
    scores = read_columns(scores_path, "entropy", ["caption_id", "image_id", "entropy"])
    table = split_subsets(scores, fraction)
    del scores
    write_split(table, outputs["table"])
    captions = pq.ParquetFile(captions_path)
    check_schema(captions.schema_arrow, "captions", captions_path)
    counts = write_subsets(
        table, captions, {"D-": outputs["negative"], "D+": outputs["positive"]}, shard_size
    )
    log.info(
        "D-: %d captions, D+: %d captions, threshold H >= %.4f nats",
        counts["D-"],
        counts["D+"],
        threshold(table),
    )
    return counts


# ---------------------------------------------------------------- report


def plot_histogram(table: pd.DataFrame, path: str | Path, bins: int = 60) -> None:
    """Histogram of retrieval entropies per subset, with the split threshold. The bins are
    counted with numpy and drawn as weights: matplotlib binning the entropies itself held
    copies of them (issue 55)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cut = threshold(table)
    entropy, negative = table.entropy.to_numpy(), (table.subset == "D-").to_numpy()
    edges = np.linspace(entropy.min(), entropy.max(), bins + 1)
    counts = [np.histogram(entropy[negative], edges)[0], np.histogram(entropy[~negative], edges)[0]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(  # stacked: a bin straddling the threshold shows both parts
        [edges[:-1]] * 2,
        bins=edges,
        weights=counts,
        stacked=True,
        color=["tab:red", "tab:blue"],
        label=[f"{name} ({n.sum()} captions)" for name, n in zip(SUBSETS, counts, strict=True)],
    )
    ax.axvline(cut, color="black", linestyle="--", label=f"threshold {cut:.3f}")
    ax.axvline(
        math.log(max(1, table.image_id.nunique())),
        color="grey",
        linestyle=":",
        label="log N images (uniform)",
    )
    ax.set(
        xlabel="retrieval entropy H(y) [nats] (UNKT eq. 3)",
        ylabel="captions",
        title="Retrieval entropy of the training captions",
    )
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def text_hashes(captions: pq.ParquetFile, caption_ids: np.ndarray) -> np.ndarray:
    """A 64-bit hash (pandas' hash_array) of the text of each of the ascending `caption_ids`,
    read a row group at a time: the report groups the captions by text without holding the
    texts (two texts with one hash would share a row: about n² / 2**65 for n captions, 1e-8
    for COCO's)."""
    hashes, found = np.zeros(len(caption_ids), dtype=np.uint64), 0
    for g in range(captions.num_row_groups):
        group = captions.read_row_group(g, columns=["caption_id", "text"])
        rows = rows_in(caption_ids, group.column("caption_id").to_numpy())
        keep = rows >= 0
        texts = group.column("text").filter(pa.array(keep)).to_numpy(zero_copy_only=False)
        hashes[rows[keep]] = pd.util.hash_array(texts)
        found += int(keep.sum())
        del group, texts
        release_arrow_memory()
    if found != len(caption_ids):
        raise DistinctcapError(
            f"{len(caption_ids) - found} scored captions are not in the captions file"
        )
    return hashes


def first_distinct(hashes: np.ndarray, order: np.ndarray, top: int) -> np.ndarray:
    """The first `top` distinct values of `hashes[order]`, in that order: only the head of
    the ranking is looked at, widened until it holds `top` distinct texts."""
    head = 4 * top
    while True:
        seen = hashes[order[:head]]
        _, first = np.unique(seen, return_index=True)
        if len(first) >= top or head >= len(order):
            return seen[np.sort(first)[:top]]
        head *= 4


def text_row(table: pd.DataFrame, hashes: np.ndarray, text_hash: np.uint64) -> dict:
    """One distinct text's captions: their mean entropy, how many (in D- and in all) and
    the first caption_id."""
    mine = hashes == text_hash
    captions = int(mine.sum())
    negative = int((table.subset.cat.codes.to_numpy()[mine] == 0).sum())
    return {
        "entropy": float(table.entropy.to_numpy()[mine].mean(dtype=np.float64)),
        "subset": "D-" if negative == captions else "D+" if negative == 0 else "D+/D-",
        "captions": captions,
        "first_id": int(table.caption_id.to_numpy()[mine][0]),
    }


def extreme_texts(table: pd.DataFrame, hashes: np.ndarray, top: int) -> dict[str, list[dict]]:
    """The `top` highest- and lowest-entropy distinct texts. The captions are ranked (entropy,
    then caption_id) and each text stands where its first caption in the ranking stands; only
    the listed texts are summed, not every text grouped (issue 55: a pandas groupby with a
    Python function per text took 14 s and +138 MB for 600,000 captions)."""
    ids = table.caption_id.to_numpy()
    if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():
        raise DistinctcapError("the entropy table is not sorted by caption_id")
    order = np.lexsort((ids, -table.entropy.to_numpy()))
    return {
        title: [text_row(table, hashes, h) for h in first_distinct(hashes, ranking, top)]
        for title, ranking in (("Highest", order), ("Lowest", order[::-1]))
    }


def caption_texts(captions: pq.ParquetFile, caption_ids: np.ndarray) -> dict[int, str]:
    """The texts of a few captions, read a row group at a time (a filtered `read_table`
    decodes several groups at once: +73 MB of COCO's captions, issue 55)."""
    wanted, texts = pa.array(np.asarray(caption_ids, dtype=np.int64)), {}
    for g in range(captions.num_row_groups):
        group = captions.read_row_group(g, columns=["caption_id", "text"])
        hit = group.filter(pc.is_in(group.column("caption_id"), value_set=wanted))
        ids, text = hit.column("caption_id").to_pylist(), hit.column("text").to_pylist()
        texts.update(zip(ids, text, strict=True))
        del group, hit
        release_arrow_memory()
    return texts


def extremes_markdown(table: pd.DataFrame, captions_path: str | Path, top: int = 20) -> str:
    """The `top` highest- and lowest-entropy captions with their entropies, as markdown.

    Identical texts have identical embeddings, hence one entropy: each distinct text is listed
    once with how many train captions (and images) carry it, so one generic caption repeated
    across images does not fill the whole list. The captions are grouped by their texts'
    hashes and only the listed texts are read (issue 55: the texts of COCO's captions, held
    and merged, grew the job x1.40 from 10,000 to 40,000 images).
    """
    captions = pq.ParquetFile(captions_path)
    check_schema(captions.schema_arrow, "captions", captions_path, ["caption_id", "text"])
    hashes = text_hashes(captions, table.caption_id.to_numpy())
    distinct = len(np.unique(hashes))
    shown = extreme_texts(table, hashes, top)
    first_ids = [row["first_id"] for rows in shown.values() for row in rows]
    text_of = caption_texts(captions, np.array(first_ids))
    n_images = table.image_id.nunique()
    lines = [
        "# Retrieval entropy extremes (UNKT eq. 3)\n",
        f"{len(table)} train captions ({distinct} distinct texts); D- = top "
        f"{(table.subset == 'D-').mean():.0%} (H >= {threshold(table):.4f} nats; uniform over "
        f"all {n_images} images would be {math.log(n_images):.4f}).\n",
    ]
    for title, rows in shown.items():
        lines += [
            f"\n## {title} {len(rows)}\n",
            "| entropy | subset | captions | first caption_id | text |",
            "|---:|:---|---:|---:|:---|",
        ]
        lines += [
            f"| {r['entropy']:.4f} | {r['subset']} | {r['captions']} | {r['first_id']} | "
            f"{str(text_of[r['first_id']]).replace('|', '/')} |"
            for r in rows
        ]
    return "\n".join(lines) + "\n"
