"""`distinctcap evaluate`: any captioner's results file, scored as the evaluate rule scores the
pipeline's own captions.

A results file is the COCO caption format, ``[{"image_id": 42, "caption": "..."}, ...]``, or
the JSON lines of ``distinctcap caption --out`` (distinctcap.evaluate.captionfile);
several entries of one image are its samples, in file order (sample 0 is the one the
single-caption metrics use; all of them feed diversity, oracle and consensus). It is scored
against a data folder the pipeline prepared (``results/data`` of any experiment: its images,
references and quarantine) and the CLIP features beside it (``results/features``), with the
metric settings of that experiment's config, by the evaluate stage's own functions
(`evaluate.stage.evaluate_decoding`): the same numbers for the same captions. The captioner's
own self-retrieval needs the captioner, so its columns are skipped. Captions are scored as
given (the references are lowercase without punctuation; the COCO tools' tokeniser treats
yours alike, the diversity counts see your words as written).

An image id is a JSON integer, or a string of ASCII digits only (``"42"``, as some tools
write them); a float (``280.9``, ``280.0``), a boolean, a padded or signed string is not an id.

Entries that cannot be scored are set aside, each with its image id (or its position) and
reason, and the rest scored: an id that is not one, an image id the data folder does not hold
(or holds in another split), one the data stage quarantined, one without CLIP features, an
empty caption or one that is not UTF-8 text, an entry that is not an ``{"image_id",
"caption"}`` object.

Memory is bounded by the data folder, not by the file: at most `MAX_SAMPLES_PER_IMAGE`
captions of one image are scored, and a file larger than that many entries of
`MAX_ENTRY_BYTES` for every image of the split is refused before it is read. Either refusal,
like every unreadable file, is one line.

It sits in runs/, beside the other `distinctcap` commands: it reads the report's headline
table and its comparison with ours (report/, the layer below; ARCHITECTURE.md, Layers).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_table, write_table
from distinctcap.core.settings import EvalSettings
from distinctcap.evaluate.captionfile import parse_results, results_entries
from distinctcap.evaluate.headline import HEADLINE_DIVERSITY
from distinctcap.evaluate.inputs import EvalPaths
from distinctcap.evaluate.stage import Evaluation, evaluate_decoding
from distinctcap.features.read import feature_ids
from distinctcap.report.summary import headline_quality, markdown_table
from distinctcap.report.versus import compare_runs
from distinctcap.scores.result import KEYS

# The most samples of one image that are scored: the largest n any metric reads (the oracle
# best-of-100 of UNKT Table 1, `evaluate.oracle_ns` of the COCO preset); the multi-sample
# metrics (mBLEU-4, Self-CIDEr, consensus re-ranking) grow as the square of it.
MAX_SAMPLES_PER_IMAGE = 100
# Generous room for one entry in the file: {"image_id": 391895, "caption": "..."} of a
# 20-word caption, pretty-printed, is about 100 bytes.
MAX_ENTRY_BYTES = 500


@dataclass
class DataFolder:
    """A prepared data folder and the CLIP features of its experiment."""

    root: Path
    images: pd.DataFrame
    quarantine: pd.DataFrame
    features: Path

    @property
    def experiment(self) -> Path:
        """The experiment's folder (above results/), against which the features' manifest
        names a trained CLIP."""
        return self.root.parent.parent

    @classmethod
    def open(cls, root: str | Path, features: str | Path | None = None) -> DataFolder:
        root = Path(root).resolve()
        index = Path(features).resolve() if features else root.parent / "features" / "index.json"
        for path in (root / "images.parquet", root / "captions.parquet", index):
            if not path.is_file():
                raise DistinctcapError(
                    f"--data {root}: {path} is missing; give the results/data folder of an "
                    "experiment whose data stage and feature extraction ran (or --features)"
                )
        images = read_table(root / "images.parquet", "images")
        quarantine = read_table(root / "quarantine.parquet", "quarantine")
        return cls(root, images, quarantine, index)

    @property
    def judge_features(self) -> Path | None:
        """The experiment's judge CLIP features (rule judge_features), where it has them: the
        judge's columns are then scored too (else skipped, as without evaluate.judge)."""
        path = self.root.parent / "judge" / "features.parquet"
        return path if path.is_file() else None

    def paths(self, generated: Path) -> EvalPaths:
        judge = self.judge_features
        return EvalPaths(
            generated=str(generated),
            images=str(self.root / "images.parquet"),
            captions=str(self.root / "captions.parquet"),
            vocab=str(self.root / "vocab.json"),
            features=str(self.features),
            judge_features=str(judge) if judge else None,
        )


@dataclass
class Results:
    """A results file read against a data folder: what can be scored, what is set aside."""

    name: str
    generated: pd.DataFrame  # the generated-table contract: run, image_id, sample, text, logprob
    problems: list[tuple[str, str]] = field(default_factory=list)  # (image id or entry, why)

    def counts(self) -> Counter:
        return Counter(reason.split(":")[0] for _, reason in self.problems)


INT64 = range(-(2**63), 2**63)


def image_id(value: object) -> int | None:
    """`value` as an image id: a JSON integer in int64, or a string of ASCII digits; else None."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 19:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value in INT64:
        return value
    return None


def shown(value: object, width: int = 30) -> str:
    """`value` on one short line, for a message: JSON of a scalar (a string cut to `width`),
    else its type."""
    if isinstance(value, list | dict):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    text = json.dumps(value[:width] if isinstance(value, str) else value)
    return text if len(text) <= width + 2 else text[:width] + "..."


def caption_problem(caption: object) -> str | None:
    if not isinstance(caption, str):
        return f"caption is not text ({shown(caption)})"
    if not caption.strip():
        return "empty caption"
    try:
        caption.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate such as "\ud800" in the JSON
        return "caption is not valid UTF-8 text"
    return None


def entry_problem(entry: object) -> str | None:
    if not isinstance(entry, dict) or "image_id" not in entry or "caption" not in entry:
        return "not an object with image_id and caption"
    if image_id(entry["image_id"]) is None:
        return (f"image_id is not an integer (int64) or a string of digits "
                f"({shown(entry['image_id'])})")  # fmt: skip
    return caption_problem(entry["caption"])


def image_problems(data: DataFolder, split: str) -> dict[int, str]:
    """image id -> why its captions cannot be scored, for every id the folder knows of that is
    not a scorable image of `split`."""
    out = {}
    quarantined = data.quarantine[data.quarantine.kind == "image"]
    for item, reason in zip(quarantined.id, quarantined.reason, strict=True):
        if str(item).lstrip("-").isdigit():
            out[int(item)] = f"missing image: quarantined by the data stage ({reason})"
    others = data.images[data.images.split != split]
    out |= {int(i): f"unknown image id: a {s} image, not {split}" for i, s in
            zip(others.image_id, others.split, strict=True)}  # fmt: skip
    have = set(feature_ids(data.features).tolist())
    ours = data.images[data.images.split == split].image_id.astype(int)
    out |= {int(i): "missing image: no CLIP features of it" for i in ours if i not in have}
    return out


def id_problem(image: int, known: set[int], set_apart: dict[int, str]) -> str | None:
    """Why the captions of `image` cannot be scored (`image_problems`), or None."""
    if image not in known:
        return set_apart.get(image, "unknown image id: not in the data folder")
    return set_apart.get(image)


def parse_json(path: Path) -> object:
    """The JSON value of the file at `path`, or one line why not."""
    try:
        return parse_results(path.read_text(encoding="utf-8"))
    except RecursionError as error:
        raise DistinctcapError(f"{path}: not a readable JSON results file (nested too deeply)"
                               ) from error  # fmt: skip
    except (OSError, ValueError) as error:
        raise DistinctcapError(f"{path}: not a readable JSON results file ({error})") from error


def load_entries(path: Path, n_images: int) -> list:
    """The JSON list of a results file of a split of `n_images` images, or one line why not:
    a file larger than MAX_SAMPLES_PER_IMAGE entries of MAX_ENTRY_BYTES per image is refused
    unread, so memory is bounded by the data folder."""
    limit = max(n_images, 1) * MAX_SAMPLES_PER_IMAGE * MAX_ENTRY_BYTES
    if path.is_file() and path.stat().st_size > limit:
        raise DistinctcapError(
            f"{path}: {path.stat().st_size / 1e6:.1f} MB is more than a results file of the "
            f"split's {n_images} images can need ({limit / 1e6:.1f} MB: at most "
            f"{MAX_SAMPLES_PER_IMAGE} samples per image, {MAX_ENTRY_BYTES} bytes each); "
            "nothing was read"
        )
    entries = parse_json(path)
    if not isinstance(entries, list):
        raise DistinctcapError(f"{path}: expected a list of {{image_id, caption}} objects")
    return entries


def too_many_samples(path: Path, image: int) -> DistinctcapError:
    return DistinctcapError(
        f"{path}: image {image} has more than {MAX_SAMPLES_PER_IMAGE} captions; distinctcap "
        f"evaluate scores at most {MAX_SAMPLES_PER_IMAGE} samples per image (the oracle "
        f"best-of-100 of UNKT Table 1): keep each image's first {MAX_SAMPLES_PER_IMAGE}"
    )


def read_results(path: str | Path, data: DataFolder, split: str) -> Results:
    """The scorable entries of a results file as a generated table, and the rest by id (or
    position); one line why when the file cannot be read or an image has too many samples."""
    path = Path(path)
    known = set(data.images[data.images.split == split].image_id.astype(int).tolist())
    entries = results_entries(load_entries(path, len(known)), split)
    set_apart = image_problems(data, split)
    rows, problems, samples = [], [], Counter()
    for n, entry in enumerate(entries):
        image = image_id(entry.get("image_id")) if isinstance(entry, dict) else None
        reason = entry_problem(entry) or id_problem(image, known, set_apart)
        if reason:
            problems.append((str(image) if image is not None else f"entry {n}", reason))
            continue
        if samples[image] == MAX_SAMPLES_PER_IMAGE:
            raise too_many_samples(path, image)
        rows.append((path.stem, image, samples[image], entry["caption"].strip(), 0.0))
        samples[image] += 1
    if not rows:
        item, why = problems[0] if problems else ("", "")
        who = item if item.startswith("entry") else f"image {item}"
        first = f"; the first, {who}: {why}" if problems else ""
        raise DistinctcapError(
            f"{path}: no entry can be scored ({len(problems)} set aside{first})"
        )
    generated = pd.DataFrame(rows, columns=["run", "image_id", "sample", "text", "logprob"])
    return Results(path.stem, generated.astype({"sample": "int32", "logprob": "float32"}),
                   problems)  # fmt: skip


def score(results: Results, data: DataFolder, split: str, settings: EvalSettings) -> Evaluation:
    """Every metric of the results, by the evaluate stage's `evaluate_decoding`."""
    with tempfile.TemporaryDirectory(prefix="distinctcap-evaluate-") as tmp:
        generated = Path(tmp) / "generated.parquet"
        write_table(results.generated, generated, "generated")
        with contextlib.chdir(data.experiment):
            return evaluate_decoding(data.paths(generated), split, "given", settings)


def versus(
    ours: tuple[Results, Evaluation], theirs: tuple[Results, Evaluation], data: DataFolder,
    split: str, seed: int = 0,
) -> pd.DataFrame:
    """The paired bootstrap of ours against theirs (report.versus.compare_runs) on the images
    both files captioned."""
    captions = read_table(data.root / "captions.parquet", "captions")
    captions = captions[captions.split == split]
    keys = {r.name: (r.name, split, "given") for r, _ in (ours, theirs)}
    generated = {keys[r.name]: r.generated for r, _ in (ours, theirs)}
    per_image = {keys[r.name]: e.per_image for r, e in (ours, theirs)}
    return compare_runs(generated, captions, data.images, theirs[0].name, seed=seed,
                        per_image=per_image)  # fmt: skip


def headline(evaluations: list[Evaluation]) -> str:
    """The README's headline columns, with the judges' beside the trainer CLIP's where they
    were scored (report.summary.headline_quality), one row per results file (skipped: "-")."""
    rows = pd.DataFrame([e.row for e in evaluations])
    columns = (*headline_quality(rows, rows.split.iloc[0], "given"), *HEADLINE_DIVERSITY)
    headers = ["results", "images", "samples", *(f"{h} {arrow}" for h, _, _, arrow in columns)]
    rows = []
    for e in evaluations:
        values = [(e.row.get(c), digits) for _, c, digits, _ in columns]
        cells = ["-" if pd.isna(v) else f"{v:.{digits}f}" for v, digits in values]
        rows.append([e.row["run"], str(e.row["n_images"]), str(e.row["n_samples"]), *cells])
    return markdown_table(headers, rows)


def problem_lines(results: Results, limit: int = 50) -> list[str]:
    """Each entry set aside (the first `limit`), then the count of each reason."""
    lines = [f"{results.name}: image {item}: {why}" for item, why in results.problems[:limit]]
    if len(results.problems) > limit:
        lines.append(f"{results.name}: ... and {len(results.problems) - limit} more")
    counts = ", ".join(f"{n} {reason}" for reason, n in sorted(results.counts().items()))
    if counts:
        lines.append(f"{results.name}: set aside {len(results.problems)} entries ({counts}); "
                     f"scored {len(results.generated)} captions of "
                     f"{results.generated.image_id.nunique()} images")  # fmt: skip
    return lines


def summary_rows(evaluations: list[Evaluation]) -> pd.DataFrame:
    """The metrics rows of the evaluations, `KEYS` first (for report.summary.write_summary)."""
    table = pd.DataFrame([e.row for e in evaluations])
    return table[[*KEYS, *(c for c in table.columns if c not in KEYS)]]
