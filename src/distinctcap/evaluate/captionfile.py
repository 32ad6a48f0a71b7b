"""The entries of a results file for `distinctcap evaluate`: the COCO caption format as it is,
or the JSON lines `distinctcap caption --out` writes (one object per image: file, image_id and
split when the image is one of the experiment's, caption, samples when it sampled several).

`parse_results` reads the text (JSON, else JSON lines); `results_entries` turns each caption
line into {image_id, caption} entries, one per sample (its `samples`, else its caption), so the
scorer reads it as any results file. Lines of images of another split of the experiment are
left out (`distinctcap caption` a whole images folder, score one split); the others are kept,
so a file outside the data or one that was not captioned is set aside with its reason
(distinctcap.runs.resultsfile).
"""

from __future__ import annotations

import json


def parse_results(text: str) -> object:
    """The JSON value of a results file, or the list of its JSON lines; ValueError (JSON's
    own) when it is neither."""
    try:
        value = json.loads(text)
    except ValueError as error:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError:
            raise error from None
    return [value] if is_caption_line(value) else value


def is_caption_line(value: object) -> bool:
    return isinstance(value, dict) and "file" in value


def results_entries(entries: object, split: str) -> object:
    """The entries of a parsed results file for `split` (module docstring); anything but a
    list as it is, for the reader to refuse."""
    if not isinstance(entries, list):
        return entries
    return [entry for line in entries for entry in caption_entries(line, split)]


def caption_entries(line: object, split: str) -> list:
    """A caption line's entries for `split`: none for another split, its samples (or its
    caption) as {image_id, caption} otherwise; anything else as it is."""
    if not is_caption_line(line):
        return [line]
    if line.get("split", split) != split:
        return []
    if "image_id" not in line or "caption" not in line:
        return [{k: v for k, v in line.items() if k in ("image_id", "caption")}]
    texts = line.get("samples") or [line["caption"]]
    return [{"image_id": line["image_id"], "caption": text} for text in texts]
