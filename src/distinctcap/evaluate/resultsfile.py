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

Entries that cannot be scored are set aside, each with its image id and reason, and the rest
scored: an image id the data folder does not hold (or holds in another split), one the data
stage quarantined, one without CLIP features, an empty caption, an entry that is not an
``{"image_id", "caption"}`` object.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from distinctcap.core.config import EvalSettings
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_table, write_table
from distinctcap.evaluate.captionfile import parse_results, results_entries
from distinctcap.evaluate.metrics.result import KEYS
from distinctcap.evaluate.stage import EvalPaths, Evaluation, evaluate_decoding
from distinctcap.features.read import feature_ids
from distinctcap.report.summary import HEADLINE_DIVERSITY, HEADLINE_QUALITY, markdown_table
from distinctcap.report.versus import compare_runs


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

    def paths(self, generated: Path) -> EvalPaths:
        return EvalPaths(
            generated=str(generated),
            images=str(self.root / "images.parquet"),
            captions=str(self.root / "captions.parquet"),
            vocab=str(self.root / "vocab.json"),
            features=str(self.features),
        )


@dataclass
class Results:
    """A results file read against a data folder: what can be scored, what is set aside."""

    name: str
    generated: pd.DataFrame  # the generated-table contract: run, image_id, sample, text, logprob
    problems: list[tuple[str, str]] = field(default_factory=list)  # (image id or entry, why)

    def counts(self) -> Counter:
        return Counter(reason.split(":")[0] for _, reason in self.problems)


def entry_problem(entry: object) -> str | None:
    if not isinstance(entry, dict) or "image_id" not in entry or "caption" not in entry:
        return "not an object with image_id and caption"
    if not isinstance(entry["caption"], str):
        return "caption is not text"
    if not entry["caption"].strip():
        return "empty caption"
    try:
        int(entry["image_id"])
    except (TypeError, ValueError):
        return "image_id is not an integer"
    return None


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


def read_results(path: str | Path, data: DataFolder, split: str) -> Results:
    """The scorable entries of a results file as a generated table, and the rest by id."""
    path = Path(path)
    try:
        entries = results_entries(parse_results(path.read_text(encoding="utf-8")), split)
    except (OSError, ValueError) as error:
        raise DistinctcapError(f"{path}: not a readable JSON results file ({error})") from error
    if not isinstance(entries, list):
        raise DistinctcapError(f"{path}: expected a list of {{image_id, caption}} objects")
    known = set(data.images[data.images.split == split].image_id.astype(int).tolist())
    set_apart = image_problems(data, split)
    rows, problems, samples = [], [], Counter()
    for n, entry in enumerate(entries):
        reason = entry_problem(entry)
        image = int(entry["image_id"]) if reason is None else None
        if reason is None and image not in known:
            reason = set_apart.get(image, "unknown image id: not in the data folder")
        elif reason is None and image in set_apart:
            reason = set_apart[image]
        if reason:
            label = entry.get("image_id", f"entry {n}") if isinstance(entry, dict) else f"entry {n}"
            problems.append((str(label), reason))
            continue
        rows.append((path.stem, image, samples[image], entry["caption"].strip(), 0.0))
        samples[image] += 1
    if not rows:
        raise DistinctcapError(f"{path}: no entry can be scored ({len(problems)} set aside)")
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
    """The README's headline columns, one row per results file (skipped cells "-")."""
    columns = (*HEADLINE_QUALITY, *HEADLINE_DIVERSITY)
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
