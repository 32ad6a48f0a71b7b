"""The caption gallery (rule `report_gallery`): images of one split, one card each, with their
longest human caption and each run's caption under its main decodings (greedy, beam), the
sampled decodings' first samples behind a toggle, as an HTML page. On the shapes world (images
with a `scene`) every claim of a shown caption is marked right or wrong against the scene graph
(data.scene.claim_marks), and `write_showcase` picks the best scene-scored caption for the
README."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, read_table
from distinctcap.data.scene import claim_marks, score_caption
from distinctcap.report.summary import run_order


def gallery_images(images: pd.DataFrame, split: str, count: int = 24) -> list[int]:
    """`count` image ids of the split spread evenly over its sorted ids (deterministic)."""
    ids = np.sort(images[images.split == split].image_id.to_numpy())
    if len(ids) == 0:
        raise DistinctcapError(f"no {split} images for the gallery")
    pick = np.unique(np.linspace(0, len(ids) - 1, min(count, len(ids))).round().astype(int))
    return [int(i) for i in ids[pick]]


SAMPLES_SHOWN = 3  # of a sampled decoding, behind the card's toggle


def gallery_captions(generated: Sequence[str | Path], image_ids: Sequence[int]) -> pd.DataFrame:
    """run, decoding, image_id, sample, text of the first SAMPLES_SHOWN samples of each
    generated table for the images.

    The decoding is the file name's part after the split ("test-greedy.parquet" -> greedy)."""
    rows = []
    shown = [("image_id", "in", list(image_ids)), ("sample", "<", SAMPLES_SHOWN)]
    for path in generated:
        table = read_table(path, "generated", filters=shown)
        decoding = Path(path).stem.split("-", 1)[-1]
        rows += [
            (r.run, decoding, int(r.image_id), int(r.sample), r.text) for r in table.itertuples()
        ]
    return pd.DataFrame(rows, columns=["run", "decoding", "image_id", "sample", "text"])


GALLERY_STYLE = """<style>body{font-family:sans-serif;font-size:14px;margin:1em}
.cards{display:flex;flex-wrap:wrap;gap:12px}.card{width:380px;border:1px solid #ccc;
border-radius:6px;padding:8px;text-align:left}.card img{width:192px;height:192px;
image-rendering:pixelated;display:block;margin-bottom:6px}.who{font-weight:bold}
.human{color:#555}.line{margin:3px 0}.right{color:#060}.wrong{color:#b00;
text-decoration:line-through}.claims{font-size:12px}details{margin-top:4px;color:#444}
summary{cursor:pointer}</style>"""


def longest_human_captions(captions: str | Path, image_ids: Sequence[int]) -> pd.Series:
    """image_id -> its longest human caption (usually the most specific), read for those
    images only: the whole captions table is 268 MB as pandas at COCO's size (issue 55)."""
    refs = read_table(
        captions, "captions", ["image_id", "text"], filters=[("image_id", "in", list(image_ids))]
    )
    refs = refs.assign(n=refs.text.str.len()).sort_values(["image_id", "n"], kind="stable")
    return refs.groupby("image_id").text.last()


def run_labels(runs: dict) -> dict[str, str]:
    """run -> "name (METHOD)", e.g. "reference (MLE)", "smile (SMILE)"."""
    return {
        name: f"{name} ({block.get('method', 'mle').upper()}"
        + (f" on {block['data']}" if block.get("data", "all") != "all" else "") + ")"
        for name, block in runs.items()
    }


def marked(text: str, scene: dict | None) -> str:
    """A caption, escaped, followed by its claims marked right or wrong against `scene`."""
    if scene is None:
        return html.escape(text)
    marks = claim_marks(text, scene)
    if not marks:
        return f"{html.escape(text)} <span class='claims'>(claims nothing)</span>"
    chips = ", ".join(
        f"<span class='{'right' if right else 'wrong'}'>{'✓' if right else '✗'} "
        f"{html.escape(claim)}</span>"
        for claim, right in marks
    )
    return f"{html.escape(text)} <span class='claims'>[{chips}]</span>"


def caption_line(r, labels: dict, scene: dict | None) -> str:
    who = html.escape(labels.get(r.run, r.run))
    sample = f" #{r.sample}" if r.sample else ""
    return (
        f"<div class='line'><span class='who'>{who}</span>, {html.escape(r.decoding)}{sample}: "
        f"{marked(r.text, scene)}</div>"
    )


def card(
    image_id: int, file: str, human: str, caps: pd.DataFrame, labels: dict,
    main: set[str] | None = None, scene: dict | None = None,
) -> str:
    """One image: the picture, its human caption, every run's caption under the `main`
    decodings (all when None) and, behind a toggle, the other decodings' samples."""
    data = base64.b64encode(Path(file).read_bytes()).decode()
    lines = [f"<div class='line human'><span class='who'>human</span>: {html.escape(human)}</div>"]
    mine = caps[caps.image_id == image_id]
    is_main = mine.decoding.isin(main) & (mine["sample"] == 0) if main else mine["sample"] == 0
    lines += [caption_line(r, labels, scene) for r in mine[is_main].itertuples()]
    rest = [caption_line(r, labels, scene) for r in mine[~is_main].itertuples()]
    if rest:
        lines.append(
            f"<details><summary>{len(rest)} sampled captions</summary>{''.join(rest)}</details>"
        )
    return (
        f"<div class='card'><img src='data:image/png;base64,{data}' alt='image {image_id}'>"
        f"<div>image {image_id}</div>{''.join(lines)}</div>"
    )


def main_decodings(decoding: dict | None) -> set[str] | None:
    """The decodings shown on every card: those that do not sample (greedy, beam); None (all)
    without the config's decoding settings."""
    if decoding is None:
        return None
    return {name for name, block in decoding.items() if block.get("kind") != "sample"}


def scenes_of(images: pd.DataFrame) -> dict[int, dict]:
    """image_id -> scene graph, on the shapes world (empty elsewhere)."""
    if "scene" not in images:
        return {}
    return {int(i): json.loads(s) for i, s in zip(images.image_id, images.scene, strict=True)}


def write_gallery(
    images: pd.DataFrame,
    captions: str | Path,
    generated: Sequence[str | Path],
    split: str,
    html_path: str | Path,
    count: int = 24,
    runs: dict | None = None,
    decoding: dict | None = None,
) -> None:
    """For `count` images of the split, one card each (`card`): the image, its longest human
    caption (read from the `captions` file) and every run's captions (labelled with its
    method, `runs`: the config's blocks, in report order; `decoding`: the config's settings,
    which say which decodings sample), as an HTML page with the images embedded."""
    ids = gallery_images(images, split, count)
    caps = gallery_captions(generated, ids)
    runs = runs or {r: {} for r in caps.run.unique()}
    order = {name: k for k, name in enumerate(run_order(runs))}
    caps = caps.assign(k=caps.run.map(order)).sort_values(
        ["k", "decoding", "sample"], kind="stable"
    )
    files = images.set_index("image_id").file
    refs = longest_human_captions(captions, ids)
    labels, main, scenes = run_labels(runs), main_decodings(decoding), scenes_of(images)
    cards = [
        card(i, files[i], refs.get(i, ""), caps, labels, main, scenes.get(i)) for i in ids
    ]
    marks = (
        " Each claim of a caption is marked <span class='right'>✓ right</span> or "
        "<span class='wrong'>✗ wrong</span> against the image's scene graph."
        if scenes else ""
    )
    with atomic_path(html_path) as tmp:
        tmp.write_text(
            f"<html><head><meta charset='utf-8'>{GALLERY_STYLE}</head><body>"
            f"<h2>Caption gallery: {len(ids)} {split} images</h2><p>Each card: the image, its "
            "longest human caption (<b>human</b>) and every run's caption (with its method) "
            f"under each decoding that does not sample; the sampled ones behind a toggle.{marks}"
            "</p>"
            f"<div class='cards'>{''.join(cards)}</div></body></html>"
        )


def best_captions(
    images: pd.DataFrame, generated: Sequence[str | Path], main: set[str] | None
) -> pd.DataFrame:
    """Per run, its caption (sample 0 of a main decoding) with the best scene score: all
    claims right first, then the most scene facts covered (a repeated claim covers nothing
    new), then the most claims right; run,
    decoding, image_id, text, claims, correct, facts, covered."""
    scenes = scenes_of(images)
    rows = []
    for path in generated:
        decoding = Path(path).stem.split("-", 1)[-1]
        if main is not None and decoding not in main:
            continue
        table = read_table(path, "generated", filters=[("sample", "==", 0)])
        for r in table.itertuples():
            counts = score_caption(r.text, scenes[int(r.image_id)])
            rows.append({"run": r.run, "decoding": decoding, "image_id": int(r.image_id),
                         "text": r.text, **counts})  # fmt: skip
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table = table.assign(all_right=table.correct == table.claims).sort_values(
        ["all_right", "covered", "correct", "image_id"],
        ascending=[False, False, False, True], kind="stable",
    )
    return table.groupby("run", sort=False).head(1)


def write_showcase(
    images: pd.DataFrame,
    generated: Sequence[str | Path],
    path: str | Path,
    runs: dict | None = None,
    decoding: dict | None = None,
) -> None:
    """The README's showcase (markdown): each run's best scene-scored caption
    (`best_captions`) with its score, so the captions quoted are chosen by the pipeline."""
    lines = ["# Showcase: each run's best scene-scored caption", ""]
    if not scenes_of(images):
        lines.append("No scene graphs here (not the shapes world): no showcase.")
    else:
        best = best_captions(images, generated, main_decodings(decoding))
        labels = run_labels(runs or {r: {} for r in best.get("run", [])})
        order = {name: k for k, name in enumerate(run_order(runs or dict.fromkeys(labels)))}
        for r in sorted(best.itertuples(), key=lambda r: order.get(r.run, len(order))):
            lines.append(
                f'- {labels.get(r.run, r.run)}, {r.decoding}, image {r.image_id}: "{r.text}" '
                f"({r.correct} of {r.claims} claims right, {r.covered} of {r.facts} scene "
                "facts covered)"
            )
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")


def gallery_stage(
    images: str | Path,
    captions: str | Path,
    generated: Sequence[str | Path],
    split: str,
    html_path: str | Path,
    showcase_path: str | Path,
    count: int = 24,
    runs: dict | None = None,
    decoding: dict | None = None,
) -> None:
    """Rule report_gallery: `write_gallery` and `write_showcase` from the data tables' files,
    reading the split's images and the shown images' captions only, so the job's memory does
    not grow with COCO's 616k captions (+268 MB at 123,287 images before, issue 55)."""
    shown = read_table(images, "images", filters=[("split", "==", split)])
    write_gallery(shown, captions, generated, split, html_path, count, runs, decoding)
    write_showcase(shown, generated, showcase_path, runs, decoding)
