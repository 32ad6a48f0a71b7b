"""The caption gallery (rule `report_gallery`): images of one split with their longest
reference caption and sample 0 of every run and decoding, as a PNG grid and an HTML page."""

from __future__ import annotations

import base64
import html
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from distinctcap.errors import DistinctcapError
from distinctcap.io import atomic_path, read_table
from distinctcap.report.plots import pyplot, save_png
from distinctcap.report.tables import STYLE


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


def _gallery_lines(caps: pd.DataFrame, image_id: int, reference: str) -> list[tuple[str, str]]:
    sub = caps[caps.image_id == image_id]
    return [("reference", reference)] + [
        (f"{r.run}/{r.decoding}", r.text) for r in sub.itertuples()
    ]


def write_gallery(
    images: pd.DataFrame,
    captions: pd.DataFrame,
    generated: Sequence[str | Path],
    split: str,
    png_path: str | Path,
    html_path: str | Path,
    count: int = 24,
) -> None:
    """For `count` images of the split: the image, its longest reference caption and sample 0
    of every run and decoding, as a PNG grid and an HTML table (images embedded)."""
    ids = gallery_images(images, split, count)
    caps = gallery_captions(generated, ids).sort_values(["run", "decoding"], kind="stable")
    files = images.set_index("image_id").file
    refs = captions[captions.image_id.isin(ids)]
    refs = refs.assign(n=refs.text.str.len()).sort_values(["image_id", "n"], kind="stable")
    refs = refs.groupby("image_id").text.last()  # the longest, usually the most specific
    _gallery_png(ids, files, refs, caps, png_path)
    rows = []
    for i in ids:
        data = base64.b64encode(Path(files[i]).read_bytes()).decode()
        lines = "".join(
            f"<div><b>{html.escape(who)}</b>: {html.escape(text)}</div>"
            for who, text in _gallery_lines(caps, i, refs.get(i, ""))
        )
        rows.append(
            f"<tr><td><img src='data:image/png;base64,{data}' width='128'><br>"
            f"image {i}</td><td>{lines}</td></tr>"
        )
    with atomic_path(html_path) as tmp:
        tmp.write_text(
            f"<html><head><meta charset='utf-8'>{STYLE}</head><body>"
            f"<h2>Caption gallery: {len(ids)} {split} images, every run</h2>"
            f"<table>{''.join(rows)}</table></body></html>"
        )


def _gallery_png(
    ids: list[int],
    files: pd.Series,
    refs: pd.Series,
    caps: pd.DataFrame,
    path: str | Path,
    cols: int = 3,
    width: int = 64,
) -> None:
    """Grid of (image, text) cells; each caption wrapped to `width` monospace characters."""
    from PIL import Image

    plt = pyplot()
    texts = {
        i: "\n".join(
            textwrap.fill(f"{who}: {t}", width, subsequent_indent="  ")
            for who, t in _gallery_lines(caps, i, refs.get(i, ""))
        )
        for i in ids
    }
    lines = max(t.count("\n") + 1 for t in texts.values())
    rows = math.ceil(len(ids) / cols)
    fig, axes = plt.subplots(
        rows,
        2 * cols,
        figsize=(7.0 * cols, max(1.3, 0.11 * lines + 0.3) * rows),
        squeeze=False,
        gridspec_kw={"width_ratios": [1, 4] * cols},
    )
    for ax in axes.flat:
        ax.axis("off")
    for k, i in enumerate(ids):
        img_ax, txt_ax = axes[k // cols, 2 * (k % cols)], axes[k // cols, 2 * (k % cols) + 1]
        with Image.open(files[i]) as image:
            img_ax.imshow(image.convert("RGB"))
        img_ax.set_title(f"image {i}", fontsize=7)
        txt_ax.text(0, 1, texts[i], va="top", ha="left", fontsize=6, family="monospace",
                    transform=txt_ax.transAxes)  # fmt: skip
    fig.suptitle("Caption gallery: the longest reference and sample 0 of every run/decoding")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))
    save_png(fig, path, dpi=100)
