"""The caption gallery (rule `report_gallery`): images of one split, one card each, with their
longest human caption and sample 0 of every run and decoding, as an HTML page."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, read_table
from distinctcap.report.summary import run_order


def gallery_images(images: pd.DataFrame, split: str, count: int = 24) -> list[int]:
    """`count` image ids of the split spread evenly over its sorted ids (deterministic)."""
    ids = np.sort(images[images.split == split].image_id.to_numpy())
    if len(ids) == 0:
        raise DistinctcapError(f"no {split} images for the gallery")
    pick = np.unique(np.linspace(0, len(ids) - 1, min(count, len(ids))).round().astype(int))
    return [int(i) for i in ids[pick]]


def gallery_captions(generated: Sequence[str | Path], image_ids: Sequence[int]) -> pd.DataFrame:
    """run, decoding, image_id, text of sample 0 of each generated table for the images.

    The decoding is the file name's part after the split ("test-greedy.parquet" -> greedy)."""
    rows = []
    for path in generated:
        table = read_table(path, "generated")
        table = table[table.image_id.isin(image_ids) & (table["sample"] == 0)]
        decoding = Path(path).stem.split("-", 1)[-1]
        rows += [(r.run, decoding, int(r.image_id), r.text) for r in table.itertuples()]
    return pd.DataFrame(rows, columns=["run", "decoding", "image_id", "text"])


GALLERY_STYLE = """<style>body{font-family:sans-serif;font-size:14px;margin:1em}
.cards{display:flex;flex-wrap:wrap;gap:12px}.card{width:380px;border:1px solid #ccc;
border-radius:6px;padding:8px;text-align:left}.card img{width:192px;height:192px;
image-rendering:pixelated;display:block;margin-bottom:6px}.who{font-weight:bold}
.human{color:#555}.line{margin:3px 0}</style>"""


def run_labels(runs: dict) -> dict[str, str]:
    """run -> "name (METHOD)", e.g. "reference (MLE)", "smile (SMILE)"."""
    return {
        name: f"{name} ({block.get('method', 'mle').upper()}"
        + (f" on {block['data']}" if block.get("data", "all") != "all" else "") + ")"
        for name, block in runs.items()
    }


def card(image_id: int, file: str, human: str, caps: pd.DataFrame, labels: dict) -> str:
    """One image: the picture, its human caption and every run's caption, labelled."""
    data = base64.b64encode(Path(file).read_bytes()).decode()
    lines = [f"<div class='line human'><span class='who'>human</span>: {html.escape(human)}</div>"]
    lines += [
        f"<div class='line'><span class='who'>{html.escape(labels.get(r.run, r.run))}</span>, "
        f"{html.escape(r.decoding)}: {html.escape(r.text)}</div>"
        for r in caps[caps.image_id == image_id].itertuples()
    ]
    return (
        f"<div class='card'><img src='data:image/png;base64,{data}' alt='image {image_id}'>"
        f"<div>image {image_id}</div>{''.join(lines)}</div>"
    )


def write_gallery(
    images: pd.DataFrame,
    captions: pd.DataFrame,
    generated: Sequence[str | Path],
    split: str,
    html_path: str | Path,
    count: int = 24,
    runs: dict | None = None,
) -> None:
    """For `count` images of the split, one card each: the image, its longest human caption
    and sample 0 of every run (labelled with its method, `runs`: the config's blocks, in
    report order) and decoding, as an HTML page with the images embedded."""
    ids = gallery_images(images, split, count)
    caps = gallery_captions(generated, ids)
    runs = runs or {r: {} for r in caps.run.unique()}
    order = {name: k for k, name in enumerate(run_order(runs))}
    caps = caps.assign(k=caps.run.map(order)).sort_values(["k", "decoding"], kind="stable")
    files = images.set_index("image_id").file
    refs = captions[captions.image_id.isin(ids)]
    refs = refs.assign(n=refs.text.str.len()).sort_values(["image_id", "n"], kind="stable")
    refs = refs.groupby("image_id").text.last()  # the longest, usually the most specific
    labels = run_labels(runs)
    cards = [card(i, files[i], refs.get(i, ""), caps, labels) for i in ids]
    with atomic_path(html_path) as tmp:
        tmp.write_text(
            f"<html><head><meta charset='utf-8'>{GALLERY_STYLE}</head><body>"
            f"<h2>Caption gallery: {len(ids)} {split} images</h2><p>Each card: the image, its "
            "longest human caption (<b>human</b>) and the first caption of every run (with its "
            "method) under each decoding.</p>"
            f"<div class='cards'>{''.join(cards)}</div></body></html>"
        )
