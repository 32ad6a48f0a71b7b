"""The entries of a results file for `distinctcap evaluate`: the COCO caption format as it is,
or the JSON lines `distinctcap caption --out` writes (one object per image: file, image_id and
split when the image is one of the experiment's, caption, samples when it sampled several).

A caption line becomes {image_id, caption} entries, one per sample (its `samples`, else its
caption), so the scorer reads it as any results file. Lines of images of another split of the
experiment are left out (`distinctcap caption` a whole images folder, score one split); the
others are kept, so a file outside the data or one that was not captioned is set aside with
its reason (distinctcap.evaluate.resultsfile).
"""

from __future__ import annotations

import json


def results_entries(text: str, split: str) -> list:
    """The entries of a results file's text (module docstring); ValueError if it is neither
    JSON nor JSON lines."""
    try:
        entries = json.loads(text)
    except ValueError:
        entries = None
    if isinstance(entries, list):
        return entries
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [entry for line in lines for entry in caption_entries(line, split)]


def caption_entries(line: object, split: str) -> list:
    """A caption line's entries for `split`: none for another split, its samples (or its
    caption) as {image_id, caption} otherwise; anything else as it is."""
    if not isinstance(line, dict) or "file" not in line:
        return [line]
    if line.get("split", split) != split:
        return []
    if "image_id" not in line or "caption" not in line:
        return [{k: v for k, v in line.items() if k in ("image_id", "caption")}]
    texts = line.get("samples") or [line["caption"]]
    return [{"image_id": line["image_id"], "caption": text} for text in texts]
