"""The report's front page (`snakemake --report`): what was run, the headline table, the
significant differences against the reference, the CLIP's retrieval, the entropy extremes,
how to read it, and links to everything else. reStructuredText, as Snakemake wants for the
global `report:` description; written from whatever exists under results/ when the report is
built (a run that has not finished yet gets a page saying what is missing).

Light (pandas, json): the Snakefile calls it while parsing the workflow for `--report`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from distinctcap.core.io import atomic_path, read_json
from distinctcap.report.summary import headline_table, pick_decodings, run_label, run_order
from distinctcap.report.tables import source_label

HOW_TO_READ = """\
**How to read it.** The MLE *reference* is the baseline every method starts from or is
compared with; the *teachers* are MLE runs on the high-entropy (D-, generic) or low-entropy
(D+, specific) half of the captions; the *methods* (UNKT, CL, SMILE, specificity) aim at
captions that single out their image. ↑ marks a column where higher is better, ↓ one where
lower is better. Quality (BLEU-4, METEOR, CIDEr) compares captions with the human ones;
retrieval (``R@1``: share of test images whose caption retrieves them first through the CLIP;
mean rank) measures distinctiveness; scene F1 (shapes world) checks each claim against the
true scene; Div-2 and distinct measure how varied sampled captions are. Values are on their
metric's own scale (fractions stay fractions). A difference against the reference counts only
where its paired bootstrap 95 % interval excludes 0.
"""

LINKS = (  # (file name in the report, what it is)
    ("headline.csv", "the headline table (also .md and .tex beside it)"),
    ("versus.csv", "every run against the reference, with confidence intervals"),
    ("summary.csv", "every metric of every run, split and decoding"),
    ("tables.html", "the papers' table layouts beside their published numbers"),
    ("gallery.html", "captions of test images, every run side by side"),
    ("metric_bars.png", "selected metrics per run"),
    ("cider_vs_n.png", "oracle CIDEr against the number of samples"),
    ("training.png", "training curves"),
    ("entropy_histogram.png", "retrieval entropy of the training captions"),
    ("entropy_extremes.md", "the most generic and most specific training captions"),
    ("retrieval.json", "the CLIP's retrieval on the validation split"),
)


def escape(text: object) -> str:
    """Text safe in reStructuredText (no mailto: from R@1, no emphasis from *, no links)."""
    return re.sub(r"([\\*`|_@<>\[\]])", r"\\\1", str(text))


def cell(text: object) -> str:
    """A list-table cell: escaped, and a leading - or + kept as text (a bare "-", the headline's
    missing value, would otherwise render as an empty bullet list)."""
    return re.sub(r"^([-+])", r"\\\1", escape(text))


def rst_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for row in [headers, *rows]:
        lines.append(f"   * - {cell(row[0])}")
        lines += [f"     - {cell(text)}" for text in row[1:]]
    return [*lines, ""]


def what_was_run(config: dict) -> list[str]:
    data, clip = config["data"], config["clip"]
    source = source_label(data)
    trained = clip["pretrained"] == "train"
    how = f"trained here for {clip['train']['epochs']} epochs" if trained else clip["pretrained"]
    lines = [
        "**What was run.**", "",
        f"- Data: {escape(source)}.",
        f"- CLIP: {escape(clip['arch'])}, {escape(how)}.",
        "- Decoding: " + ", ".join(escape(n) for n in config["decoding"]) + ".",
        "- Runs:", "",
    ]
    runs = config["runs"]
    for name in run_order(runs):
        edges = ", ".join(f"{k} {runs[name][k]}" for k in ("init", "teacher", "reference")
                          if runs[name].get(k))
        data_part = runs[name].get("data", "all")
        lines.append(f"  - {escape(run_label(name, runs[name]))}: method "
                     f"{escape(runs[name]['method'])}, data {escape(data_part)}"
                     + (f", {escape(edges)}" if edges else ""))
    return [*lines, ""]


def headline(results: Path, runs: dict) -> list[str]:
    path = results / "metrics" / "summary.csv"
    if not path.is_file():
        return ["**Headline.** No evaluation yet (results/metrics/summary.csv is missing): "
                "run ``snakemake`` (``make run``) to build it; this report shows what exists.", ""]
    summary = pd.read_csv(path)
    quality, diversity = pick_decodings(summary)
    headers, rows = headline_table(summary, runs, "test", quality, diversity)
    return [f"**Headline** (test split; {escape(quality)} decoding, diversity over "
            f"{escape(diversity)}).", "", *rst_table(headers, rows)]


def versus(results: Path) -> list[str]:
    path = results / "report" / "versus.csv"
    if not path.is_file():
        return []
    table = pd.read_csv(path)
    lines = ["**Against the reference** (paired bootstrap 95 % interval over the test images; "
             "only differences whose interval excludes 0):", ""]
    for (run, decoding), group in table.groupby(["run", "decoding"], sort=False):
        said = [f"{v} on {m} ({d:+.3f} [{lo:+.3f}, {hi:+.3f}])"
                for m, v, d, lo, hi in group[["metric", "verdict", "difference", "ci_low",
                                               "ci_high"]].itertuples(index=False)
                if v in ("better", "worse")]
        lines.append(f"- {escape(run)}, {escape(decoding)}: "
                     + (escape("; ".join(said)) if said else "no significant difference"))
    return [*lines, ""]


def clip_retrieval(results: Path) -> list[str]:
    path = results / "clip" / "retrieval.json"
    if not path.is_file():
        return []
    flat = pd.json_normalize(read_json(path)).iloc[0].to_dict()
    said = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in flat.items())
    return [f"**The CLIP** (retrieval on the validation split): {escape(said)}.", ""]


def entropy_extremes(results: Path, top: int = 3) -> list[str]:
    """The first `top` rows of each part of entropy_extremes.md (distinctcap.features.entropy)."""
    path = results / "report" / "entropy_extremes.md"
    if not path.is_file():
        return []
    lines = ["**Retrieval entropy extremes** (UNKT eq. 3; training captions):", ""]
    part = None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            part, taken = line[3:].split()[0].lower(), 0
        elif part and line.startswith("| ") and line[2:3].isdigit() and taken < top:
            entropy, *_, text = (c.strip() for c in line.strip("|").split("|"))
            lines.append(f"- {part} entropy ({entropy} nats): {escape(text)}")
            taken += 1
    return [*lines, ""]


def links(results: Path) -> list[str]:
    found = [(name, what) for name, what in LINKS if any(results.rglob(name))]
    if not found:
        return []
    return ["**Where to look.**", "", *(f"- `{name}`_: {what}" for name, what in found), ""]


# Snakemake's report (9.x, html_reporter ContentDisplay) centres the front page vertically in
# a window-high scrolling box ("flex items-center h-screen overflow-auto"). A page taller than
# the window overflows above that box's top, where no scrolling reaches: the reader landed
# mid-page, title and headline table out of reach (the default's page is about 3,400 px high).
# The text column (capped at 32rem) also grows to the headline table's width: the table ran
# past it, under the rule graph. The style sits inside the front page, so it holds only while
# the front page is shown.
TOP_ALIGNED = """\
.. raw:: html

   <style>#app div.items-center.justify-center.h-screen.overflow-auto {align-items: flex-start}
   #app .prose.max-w-lg {max-width: none; width: 32rem; min-width: min-content}</style>
"""


def front_page(config: dict, results: Path) -> str:
    title = f"distinctcap: distinctive captioning on {config['data']['source']}"
    lines = [
        title, "=" * len(title), "",
        *headline(results, config["runs"]), *versus(results), HOW_TO_READ,
        *what_was_run(config), *clip_retrieval(results), *entropy_extremes(results),
        *links(results), TOP_ALIGNED,
    ]
    return "\n".join(lines)


def write_front_page(config: dict, results: Path, path: Path) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(front_page(config, results))
    return path
