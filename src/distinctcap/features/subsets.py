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
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import (
    atomic_path,
    check_schema,
    read_rows,
    read_table,
    release_arrow_memory,
    write_arrow,
    write_table,
)

log = logging.getLogger(__name__)

SUBSETS = ("D-", "D+")


def split_subsets(scores: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """Rank by entropy (highest first, ties by caption_id); the top `fraction` is D-, the rest
    D+ (UNKT §3.1: the top 50% by retrieval entropy form the negative set)."""
    if not 0 < fraction < 1:
        raise DistinctcapError(f"entropy.fraction = {fraction}: choose 0 < fraction < 1")
    if len(scores) < 2:
        raise DistinctcapError("need at least two train captions to split into D- and D+")
    ranked = scores.sort_values(["entropy", "caption_id"], ascending=[False, True])
    n_neg = min(max(round(fraction * len(ranked)), 1), len(ranked) - 1)
    subset = np.where(np.arange(len(ranked)) < n_neg, "D-", "D+")
    return ranked.assign(subset=subset).sort_values("caption_id").reset_index(drop=True)


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
    that hold its captions (`core.io.read_rows`): the job holds a shard and a row group, not
    the captions (issue 55: a pandas merge of COCO's 590,855 training captions, token arrays
    and all, peaked +410 MB; the whole table kept packed still grew the peak x1.26 from
    10,000 to 40,000 images)."""
    caption_ids = captions.read(columns=["caption_id"]).column(0).to_numpy()
    at = pd.Index(table.caption_id).get_indexer(caption_ids)  # each caption's row in `table`
    entropy = table.entropy.to_numpy(np.float32)
    negative = (table.subset == "D-").to_numpy()
    by_id = np.argsort(caption_ids, kind="stable")
    by_id = by_id[at[by_id] >= 0]  # the scored captions, by caption_id
    counts = {}
    for name in SUBSETS:
        rows = by_id[negative[at[by_id]] == (name == "D-")]
        folder = Path(out_dirs[name])
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("part-*.parquet"):
            stale.unlink()
        for i, start in enumerate(range(0, len(rows), shard_size)):
            take = rows[start : start + shard_size]
            part = read_rows(captions, take).append_column("entropy", pa.array(entropy[at[take]]))
            write_arrow(part, folder / f"part-{i:05d}.parquet", "captions")
        counts[name] = len(rows)
    return counts


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
    table = split_subsets(read_table(scores_path), fraction)
    write_table(table, outputs["table"], "entropy")
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
    """Histogram of retrieval entropies per subset, with the split threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cut = threshold(table)
    edges = np.linspace(table.entropy.min(), table.entropy.max(), bins + 1)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(  # stacked: a bin straddling the threshold shows both parts
        [table.entropy[table.subset == name] for name in SUBSETS],
        bins=edges,
        stacked=True,
        color=["tab:red", "tab:blue"],
        label=[f"{name} ({(table.subset == name).sum()} captions)" for name in SUBSETS],
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


def text_hashes(captions: pq.ParquetFile) -> pd.DataFrame:
    """Each caption's id and a 64-bit hash of its text (pandas' hash_array), read a row group
    at a time: the report groups the captions by text without holding the texts (two texts
    with one hash would share a row: about n² / 2**65 for n captions, 1e-8 for COCO's)."""
    parts = []
    for g in range(captions.num_row_groups):
        group = captions.read_row_group(g, columns=["caption_id", "text"])
        texts = group.column("text").to_numpy(zero_copy_only=False)
        ids = group.column("caption_id").to_numpy()
        parts.append(pd.DataFrame({"caption_id": ids, "text_hash": pd.util.hash_array(texts)}))
        release_arrow_memory()
    return pd.concat(parts, ignore_index=True)


def caption_texts(captions_path: str | Path, caption_ids: np.ndarray) -> dict[int, str]:
    """The texts of a few captions, read with a filter (one row group at a time)."""
    wanted = [("caption_id", "in", [int(i) for i in caption_ids])]
    texts = read_table(captions_path, "captions", ["caption_id", "text"], filters=wanted)
    return dict(zip(texts.caption_id.tolist(), texts.text.tolist(), strict=True))


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
    joined = table.merge(text_hashes(captions), on="caption_id")
    texts = joined.groupby("text_hash", sort=False).agg(
        entropy=("entropy", "mean"),
        subset=("subset", lambda s: "/".join(sorted(set(s)))),
        captions=("caption_id", "size"),
        first_id=("caption_id", "min"),
    )
    ranked = texts.reset_index().sort_values(["entropy", "first_id"], ascending=[False, True])
    shown = (("Highest", ranked.head(top)), ("Lowest", ranked.tail(top)[::-1]))
    text_of = caption_texts(captions_path, np.concatenate([rows.first_id for _, rows in shown]))
    n_images = table.image_id.nunique()
    lines = [
        "# Retrieval entropy extremes (UNKT eq. 3)\n",
        f"{len(table)} train captions ({len(texts)} distinct texts); D- = top "
        f"{(table.subset == 'D-').mean():.0%} (H >= {threshold(table):.4f} nats; uniform over "
        f"all {n_images} images would be {math.log(n_images):.4f}).\n",
    ]
    for title, rows in shown:
        lines += [
            f"\n## {title} {len(rows)}\n",
            "| entropy | subset | captions | first caption_id | text |",
            "|---:|:---|---:|---:|:---|",
        ]
        lines += [
            f"| {r.entropy:.4f} | {r.subset} | {r.captions} | {r.first_id} | "
            f"{str(text_of[r.first_id]).replace('|', '/')} |"
            for r in rows.itertuples()
        ]
    return "\n".join(lines) + "\n"
