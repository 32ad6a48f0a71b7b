"""The report's front page (`snakemake --report`): one verdict line per method against the
reference, the headline table with the intervals of its differences and its best values in
bold, the forest plot of those differences, how to read it, what was run, the CLIP's
retrieval, the entropy extremes, and links to everything else. reStructuredText, as Snakemake
wants for the global `report:` description; written from whatever exists under results/ when
the report is built (a run that has not finished yet gets a page saying what is missing).

Light (pandas, json): the Snakefile calls it while parsing the workflow for `--report`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from distinctcap.core.io import atomic_path, read_json
from distinctcap.evaluate.headline import HEADLINE_DIVERSITY, HEADLINE_QUALITY
from distinctcap.report.summary import (
    headline_quality,
    pick_decodings,
    pooled_rows,
    reference_run,
    run_label,
)
from distinctcap.report.tables import source_label
from distinctcap.report.verdicts import (
    front_table,
    methods_first,
    read_versus,
    verdict_lines,
    versus_decoding,
)

HOW_TO_READ = """\
**How to read it.** The MLE *reference* is the baseline every method starts from or is
compared with; the *teachers* are MLE runs on the high-entropy (D-, generic) or low-entropy
(D+, specific) half of the captions; the *methods* (UNKT, CL, SMILE, specificity) aim at
captions that single out their image. ↑ marks a column where higher is better, ↓ one where
lower is better. Quality (BLEU-4, METEOR, CIDEr) compares captions with the human ones;
retrieval (``R@1``: share of test images whose caption retrieves them first through the CLIP;
mean rank) measures distinctiveness under the CLIP the methods were tuned on, which the
independent judges re-measure where evaluated: judge R@1 and judge CLIPScore with a second CLIP
no training rule sees, scene R@1 (shapes world) by ranking each caption's claims against every
image's true scene; a gain under the trainer's CLIP that a judge's gain does not reach half of,
or whose judge interval includes 0, reads "gain measured mainly by the CLIP it was tuned on";
scene F1 (shapes world) checks each claim against the
true scene; Div-2 and distinct measure how varied sampled captions are. Values are on their
metric's own scale (fractions stay fractions). A difference against the reference counts only
where its paired bootstrap 95 % interval excludes 0.
"""

LINKS = (  # (file name in the report, what it is)
    ("headline.csv", "the headline table (also .md and .tex beside it)"),
    ("versus.csv", "every run against the reference, with confidence intervals"),
    ("forest.png", "the differences from the reference with their intervals"),
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


def rst_table(headers: list[str], rows: list[list[str]], escaped: bool = False) -> list[str]:
    """A list-table; `escaped`: the rows' cells are reStructuredText already (headers never)."""
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for k, row in enumerate([headers, *rows]):
        say = (lambda text: text) if escaped and k else cell
        lines.append(f"   * - {say(row[0])}")
        lines += [f"     - {say(text)}" for text in row[1:]]
    return [*lines, ""]


def what_was_run(config: dict, results: Path) -> list[str]:
    """The data, the CLIP as it was obtained, the decodings, and the runs of the config that
    have a run folder (run.json) in `results`; the others are named as not built."""
    data = config["data"]
    source = source_label(data)
    runs = config["runs"]
    built = [n for n in methods_first(runs) if (results / "runs" / n / "run.json").is_file()]
    clip = config["clip"]
    lines = [
        "**What was run.**", "",
        f"- Data: {escape(source)}.",
        f"- CLIP: {escape(clip['arch'])}, {escape(clip_origin(clip, results))}.",
        "- Decoding: " + ", ".join(escape(n) for n in config["decoding"]) + ".",
        "- Runs:" if built else "- Runs: none has finished yet.", "",
    ]
    for name in built:
        edges = ", ".join(f"{k} {runs[name][k]}" for k in ("init", "teacher", "reference")
                          if runs[name].get(k))
        data_part = runs[name].get("data", "all")
        lines.append(f"  - {escape(run_label(name, runs[name]))}: method "
                     f"{escape(runs[name]['method'])}, data {escape(data_part)}"
                     + (f", {escape(edges)}" if edges else ""))
    waiting = [n for n in methods_first(runs) if n not in built]
    if waiting:
        lines += ["", f"- Not built (yet): {escape(', '.join(waiting))}."]
    return [*lines, ""]


def clip_origin(clip: dict, results: Path) -> str:
    """How this experiment got its CLIP: a named one, the weights shipped in assets/clip/, or
    trained here (results/clip/retrieval.json says which of the last two)."""
    if clip["pretrained"] != "train":
        return clip["pretrained"]
    path = results / "clip" / "retrieval.json"
    weights = read_json(path).get("weights", "") if path.is_file() else ""
    if weights.startswith("shipped"):
        return f"the weights shipped in assets/clip/ ({weights.split(' (')[0]}), not trained here"
    if weights == "trained":
        return f"trained here for {clip['train']['epochs']} epochs"
    return "not built yet (trained here, or the shipped weights when their fingerprint matches)"


def headline(results: Path, runs: dict) -> list[str]:
    path = results / "metrics" / "summary.csv"
    if not path.is_file():
        return ["**Headline.** No evaluation yet (results/metrics/summary.csv is missing): "
                "run ``snakemake`` (``make run``) to build it; this report shows what exists.", ""]
    summary = pd.read_csv(path)
    quality, diversity = pick_decodings(summary)
    runs = evaluated(runs, summary)
    headers, rows = front_table(summary, read_versus(results), runs, quality, diversity)
    cells = [[front_cell(*c) for c in row] for row in rows]
    return [f"**Headline** (test split; {escape(quality)} decoding, diversity over "
            f"{escape(diversity)}; best value of each column in bold; [ ]: the 95 % interval "
            "of the run's difference from the reference).", "",
            *rst_table(headers, cells, escaped=True),
            *dash_legend(results, [[c[0] for c in row] for row in rows], quality, diversity,
                         headline_quality(summary, "test", quality))]


def dash_legend(results: Path, rows: list[list[str]], quality: str, diversity: str,
                shown: Sequence[tuple] = HEADLINE_QUALITY) -> list[str]:
    """What a '-' in the headline table means, for each column that has one: the reason the
    evaluation recorded for skipping its metric (`skip_reason`), else that no evaluation has
    it yet. `rows`: the table's cell values, run label first; `shown`: its quality columns
    (`headline_quality`: with the judges' where evaluated)."""
    columns = [(h, c, quality) for h, c, _, _ in shown] + [
        (h, c, diversity) for h, c, _, _ in HEADLINE_DIVERSITY]
    said: dict[str, list[str]] = {}
    for j, (header, column, decoding) in enumerate(columns, start=1):
        if any(row[j] == "-" for row in rows):
            said.setdefault(skip_reason(results, column, decoding), []).append(header)
    if not said:
        return []
    return ["A - in the table is a metric with no value:", "",
            *(f"- {escape(' and '.join(headers))}: {escape(reason)}."
              for reason, headers in said.items()), ""]


def skip_reason(results: Path, column: str, decoding: str) -> str:
    """Why `column` has no value under `decoding` on the test split: the reason the evaluation
    wrote in a metrics table's `skipped` (summary.csv has none), else not evaluated yet."""
    for path in sorted((results / "metrics").glob(f"*/test-{decoding}.parquet")):
        for skipped in pd.read_parquet(path, columns=["skipped"]).skipped:
            reasons = json.loads(skipped)
            if column in reasons:
                return f"{reasons[column]} (decoding {decoding})"
    return "not evaluated yet"


def evaluated(runs: dict, summary: pd.DataFrame) -> dict:
    """The runs of `runs` that the summary has rows of: a config run this experiment never
    evaluated (another preset's, or not built yet) gets no row of dashes."""
    have = set(pooled_rows(summary, "test").index.get_level_values("run"))
    return {name: run for name, run in runs.items() if name in have}


def front_cell(value: str, interval: str, best: bool) -> str:
    text = f"**{escape(value)}**" if best else cell(value)
    return f"{text} {escape(interval)}" if interval else text


def verdicts(results: Path, runs: dict) -> list[str]:
    """One line per method: what it wins and loses against the reference (versus.csv)."""
    versus = read_versus(results)
    if versus is None or versus.empty:
        return []
    summary = results / "metrics" / "summary.csv"
    quality = pick_decodings(pd.read_csv(summary))[0] if summary.is_file() else "greedy"
    decoding = versus_decoding(versus, quality)
    lines = verdict_lines(versus, runs, decoding)
    if not lines:
        return []
    return [f"**Verdict** against the MLE reference, run {escape(reference_run(runs))} "
            f"({escape(decoding)}, test split; difference [paired bootstrap 95 % interval]; won "
            "or lost only where the interval excludes 0):", "",
            *(f"- {escape(line)}" for line in lines), ""]


def forest(results: Path) -> list[str]:
    """The forest plot of versus_reference (forest.png), inlined: the front page is one file."""
    path = results / "report" / "forest.png"
    if not path.is_file():
        return []
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    # in lines: docutils drops a line over 10,000 characters; a URL parser drops the newlines
    lines = [data[i:i + 76] for i in range(0, len(data), 76)]
    return [".. raw:: html", "",
            '   <img id="distinctcap-forest" alt="differences from the reference with their '
            '95 % intervals" style="max-width: 100%" src="data:image/png;base64,',
            *(f"   {line}" for line in lines[:-1]), f'   {lines[-1]}">', ""]


RECALLS = ("image_to_text_R@1", "image_to_text_R@5", "text_to_image_R@1", "text_to_image_R@5",
           "chance_R@1")  # the keys of results/clip/retrieval.json the sentence reads


def clip_retrieval(results: Path) -> list[str]:
    """The CLIP's retrieval on the validation split (results/clip/retrieval.json), in a
    sentence; how the CLIP was obtained is said under What was run."""
    path = results / "clip" / "retrieval.json"
    found = read_json(path) if path.is_file() else {}
    if not all(k in found for k in RECALLS):
        return []
    i2t1, i2t5, t2i1, t2i5, chance = (f"{100 * found[k]:.1f} %" for k in RECALLS)
    return [f"**The CLIP** on the validation split: for {i2t1} of the images one of their own "
            f"captions is the nearest of all captions ({i2t5} within the nearest five), and for "
            f"{t2i1} of the captions their image is the nearest of all images ({t2i5} within "
            f"five); chance is {chance}.", ""]


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
# Beside the text column (capped at 32rem) Snakemake puts the rule graph, a third of the
# width: the text column takes the whole row here (flex-basis 100%, the row wraps), so the
# verdicts, the table with its intervals and the forest plot get the width and the rule graph
# goes below the fold, after the front page. The style sits inside the front page, so it holds
# only while the front page is shown.
TOP_ALIGNED = """\
.. raw:: html

   <style>#app div.items-center.justify-center.h-screen.overflow-auto {align-items: flex-start}
   #app div.flex.gap-3.items-start:has(#rulegraph) {flex-wrap: wrap}
   #app div.py-2:has(> .prose.max-w-lg) {flex: 1 1 100%}
   #app .prose.max-w-lg {max-width: 72rem; width: 100%; min-width: min-content}
   #app .prose table {font-size: 0.7rem; line-height: 1.25}
   #app .prose :is(td, th) {padding: 0.2rem 0.2rem}</style>
"""


def front_page(config: dict, results: Path) -> str:
    title = f"distinctcap: distinctive captioning on {config['data']['source']}"
    lines = [
        title, "=" * len(title), "",
        *verdicts(results, config["runs"]), *headline(results, config["runs"]),
        *forest(results), HOW_TO_READ,
        *what_was_run(config, results), *clip_retrieval(results), *entropy_extremes(results),
        *links(results), TOP_ALIGNED,
    ]
    return "\n".join(lines)


def write_front_page(config: dict, results: Path, path: Path) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(front_page(config, results))
    return path
