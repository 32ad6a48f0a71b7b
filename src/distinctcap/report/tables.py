"""Our runs in the papers' table layouts, each beside the paper's published numbers (rule
`report_tables`: tables.md and tables.html). How each run fares against the MLE reference,
with confidence intervals, is distinctcap.report.versus.

Tables follow UNKT Tables 1-3 (oracle quality, best-5 diversity, ablation layout), CL
Tables 1 and 4 (self-retrieval; quality of one caption), SMILE Table 1 (length, lexical
diversity, self-retrieval, CLIPScore, PPL) and the specificity paper's Tables 1 and 3
(diversity, novelty, vocabulary, R@k, mean rank; standard metrics), each in the paper's units.
Fractions of the metrics package (distinct, novelty, R@k, scene F1) are printed as %.
A skipped metric is NaN in the data and "skipped [n]" in a table, with its reason below it.
The published numbers themselves are transcribed in distinctcap.report.published.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from distinctcap.core.io import atomic_path
from distinctcap.report import published as P
from distinctcap.report.summary import latex, spread


@dataclass(frozen=True)
class Col:
    header: str
    metric: str
    scale: float = 1.0  # e.g. 100 for % of a fraction
    digits: int = 1


@dataclass
class Block:
    """One rendered table: title, headers, string cells and notes (footnotes, caveats)."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    labels: int = 3  # leading text columns (left-aligned)


@dataclass
class Section:
    title: str
    intro: str
    ours: Block
    published: list[Block]


def _cell(
    value: float, col: Col, reason: str | None, notes: dict[str, int], sd: float = math.nan,
    n_seeds: int = 1,
) -> str:
    """A metric's cell in the paper's units; a run over seeds (summary.pooled_metrics) shows
    mean ± sd (n seeds)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        if reason is None:
            return "n/a"
        notes.setdefault(reason, len(notes) + 1)
        return f"skipped [{notes[reason]}]"
    return spread(value * col.scale, sd * col.scale, n_seeds, col.digits)


def ours_block(title: str, metrics: pd.DataFrame, cols: Sequence[Col]) -> Block:
    """Our rows (run, decoding, split) in the given columns; skipped cells footnoted."""
    notes: dict[str, int] = {}
    rows = []
    for _, r in metrics.iterrows():
        cells = [_cell(r.get(c.metric, math.nan), c, r.skipped.get(c.metric), notes,
                       r.get(f"sd:{c.metric}", math.nan), int(r.get("n_seeds", 1)))
                 for c in cols]  # fmt: skip
        rows.append([str(r.run), str(r.decoding), str(r.split), *cells])
    block = Block(title, ["Run", "Decoding", "Split", *[c.header for c in cols]], rows)
    block.notes = [f"[{n}] {reason}" for reason, n in notes.items()]
    return block


def published_block(table: P.Published) -> Block:
    title = f"Published: {table.paper} {table.table}, {table.dataset}"
    notes = [table.note] if table.note else []
    return Block(title, ["Method", *table.columns], table.formatted(), notes, labels=1)


def paper_section(
    title: str,
    intro: str,
    rows: pd.DataFrame,
    cols: Sequence[Col],
    published: Sequence[P.Published] = (),
    ours: str = "Ours",
) -> Section:
    """A paper's layout: our `rows` in `cols` (block titled `ours`), then its published tables."""
    return Section(
        title, intro, ours_block(ours, rows, cols), [published_block(t) for t in published]
    )


# sources whose runs no published number describes -> how the markdown / HTML tables name them
OTHER_DATA = {"shapes": ("shapes-world", "shapes"), "folder": ("own-data", "own-data")}


def comparability(source: str) -> str:
    if source in ("shapes", "folder"):
        data = "the synthetic shapes world" if source == "shapes" else "your own data"
        return (
            f"Our runs are on {data}, so the published MS COCO / "
            "Flickr30K numbers are NOT comparable with ours: other data, other models, "
            "other CLIP and retrieval pools. They show each paper's layout and the "
            "direction of its effects, not targets."
        )
    same = "the same benchmark" if source == "coco" else (
        "the same benchmark where data.karpathy.file is COCO's or Flickr30K's split file"
    )
    return (
        f"Published numbers for reference: {same}, but other model sizes, "
        "features, retrieval models and pools; compare directions, not decimals."
    )


def source_label(data: dict) -> str:
    """The data a config runs on, in words (the report's front page)."""
    source = data["source"]
    if source == "shapes":
        s = data["shapes"]
        return (f"the generated shapes world ({s['n_train']} / {s['n_val']} / {s['n_test']} "
                "train / val / test images)")
    if source == "karpathy":
        return f"the Karpathy-format split file {data['karpathy']['file']}"
    if source == "folder":
        return f"the images of {data['folder']['images']} with {data['folder']['captions']}"
    return f"MS COCO ({data.get('coco', {}).get('split', 'karpathy')} split)"


def _suffix_ns(metrics: pd.DataFrame, prefix: str) -> list[int]:
    """The numbers n that end the columns named prefix..._n (oracle_cider_20, self_r_at_5)."""
    return sorted({int(c.rsplit("_", 1)[1]) for c in metrics.columns if c.startswith(prefix)})


def _multi(metrics: pd.DataFrame) -> pd.DataFrame:
    return metrics[metrics.n_samples > 1]


def _first_caption(metrics: pd.DataFrame) -> pd.DataFrame:
    """Rows of one-caption decodings when there are any (greedy, beam), else all rows."""
    single = metrics[metrics.n_samples == 1]
    return single if len(single) else metrics


def unkt_sections(metrics: pd.DataFrame) -> list[Section]:
    """UNKT Table 1 per oracle n, Table 2 (consensus best-k diversity), Table 3 layout."""
    out = []
    ns = _suffix_ns(metrics, "oracle_")
    q = [
        ("BLEU-4", "bleu4"),
        ("BLEU-3", "bleu3"),
        ("BLEU-2", "bleu2"),
        ("BLEU-1", "bleu1"),
        ("CIDEr", "cider"),
        ("ROUGE", "rouge_l"),
        ("METEOR", "meteor"),
        ("SPICE", "spice"),
    ]
    for n in ns:
        rows = _multi(metrics)
        rows = rows[rows.n_samples >= n]
        cols = [Col(h, f"oracle_{m}_{n}", 100) for h, m in q]
        ref = [P.UNKT_TABLE1[n]] if n in P.UNKT_TABLE1 else list(P.UNKT_TABLE1.values())
        out.append(
            paper_section(
                f"UNKT Table 1 layout: oracle quality over {n} samples",
                "Per image the best score "
                f"of each metric among its first {n} samples, averaged over images (x100).",
                rows,
                cols,
                ref,
                ours=f"Ours, oracle over {n} samples",
            )
        )
    div = [
        Col("Div-1", "consensus_div1", 1, 2),
        Col("Div-2", "consensus_div2", 1, 2),
        Col("SelfCIDEr", "consensus_self_cider", 1, 2),
        Col("mB. (lower is better)", "consensus_mbleu4", 1, 2),
    ]
    out.append(
        paper_section(
            "UNKT Table 2 layout: diversity of the best-5 after consensus re-ranking",
            "Samples re-ranked by their mean CIDEr-D against the captions of the image's nearest "
            "training images (CLIP image embedding); diversity of the best ones.",
            _multi(metrics),
            div,
            [P.UNKT_TABLE2],
            ours="Ours, consensus best-k",
        )
    )
    n = 20 if 20 in ns else (max(ns) if ns else 20)
    abl = [
        Col("B-4", f"oracle_bleu4_{n}", 100),
        Col("M", f"oracle_meteor_{n}", 100),
        Col("C", f"oracle_cider_{n}", 100),
        div[0],
        div[2],
        div[3],
    ]
    out.append(
        paper_section(
            "UNKT Table 3 layout (ablations; also Tables 4-6, 8)",
            f"Oracle B-4 / METEOR / CIDEr over {n} samples (x100) and the consensus best-k "
            "diversity; every run is a row, so the teachers on D- / D+ (Table 4) and UNKT "
            "variants (Tables 3, 5, 6, 8) appear here when configured.",
            _multi(metrics),
            abl,
            P.UNKT_ABLATIONS,
            ours=f"Ours (oracle n = {n})",
        )
    )
    return out


def cl_sections(metrics: pd.DataFrame) -> list[Section]:
    ks = _suffix_ns(metrics, "self_r_at_")
    retrieval = [Col(f"Self retrieval R@{k} (%)", f"self_r_at_{k}", 100, 2) for k in ks]
    t1 = [
        *retrieval,
        Col("Mean rank", "self_mean_rank", 1, 2),
        Col("ROUGE_L", "rouge_l", 1, 3),
        Col("CIDEr", "cider", 1, 3),
    ]
    t4 = [
        Col("B-1", "bleu1", 1, 3),
        Col("B-2", "bleu2", 1, 3),
        Col("B-3", "bleu3", 1, 3),
        Col("B-4", "bleu4", 1, 3),
        Col("METEOR", "meteor", 1, 3),
        Col("ROUGE_L", "rouge_l", 1, 3),
        Col("CIDEr", "cider", 1, 3),
    ]
    return [
        paper_section(
            "CL Table 1 layout: self retrieval with the captioner itself",
            "Each caption (sample 0) ranks the images of a pool (its own image plus "
            "`evaluate.self_retrieval_pool` - 1 others of the split) by the run's own log "
            "p(c | I) (CL §4.1). The paper's pool is all 5,000 test images.",
            metrics,
            t1,
            [P.CL_TABLE1],
        ),
        paper_section(
            "CL Table 4 layout: quality of one caption per image",
            "Sample 0 of each image: the greedy / best-beam caption (for a sampling "
            "decoding, its first sample).",
            metrics,
            t4,
            [P.CL_TABLE4],
        ),
    ]


def smile_sections(metrics: pd.DataFrame) -> list[Section]:
    hard = "hard_r_at_1" in metrics and metrics.hard_r_at_1.notna().any()
    prefix, pool = (
        ("hard_", "hard pool (split images plus their nearest training images)")
        if hard
        else ("", "the split's images (evaluate.hard_pool = 0)")
    )
    cols = [
        Col("Caption Length", "length", 1, 1),
        Col("Lexical Diversity (words)", "vocab", 1, 0),
        Col("R@1 (%)", f"{prefix}r_at_1", 100),
        Col("R@5 (%)", f"{prefix}r_at_5", 100),
        Col("CLIPScore (x100)", "clipscore", 100),
        Col("PPL", "ppl", 1, 1),
    ]
    return [
        paper_section(
            "SMILE Table 1 layout: descriptiveness, accuracy, fluency",
            f"CLIP self-retrieval of sample 0 in {pool}; CLIPScore = 100 x 2.5 max(cos, 0) with "
            "the prefix 'A photo depicts '; GPT-2 perplexity where local weights are configured. "
            "Lexical diversity is our vocabulary in words (the paper's unit is not stated).",
            _first_caption(metrics),
            cols,
            P.SMILE_TABLE1,
        )
    ]


def specificity_sections(metrics: pd.DataFrame) -> list[Section]:
    t1 = [
        Col("Diversity (%)", "distinct_corpus", 100, 2),
        Col("Novelty (%)", "novelty", 100, 2),
        Col("Vocab Size", "vocab", 1, 0),
        Col("R@1 (%)", "r_at_1", 100, 2),
        Col("R@5 (%)", "r_at_5", 100, 2),
        Col("R@10 (%)", "r_at_10", 100, 2),
        Col("Mean Rank", "mean_rank", 1, 2),
    ]
    t3 = [
        Col(h, m, 1, 3)
        for h, m in (
            ("B-1", "bleu1"),
            ("B-2", "bleu2"),
            ("B-3", "bleu3"),
            ("B-4", "bleu4"),
            ("R-L", "rouge_l"),
            ("M", "meteor"),
            ("C", "cider"),
            ("S", "spice"),
        )
    ]
    single = _first_caption(metrics)
    return [
        paper_section(
            "Specificity Table 1 layout: diversity and specificity",
            "Diversity = share of distinct captions among sample 0 of all images, novelty "
            "= share not found verbatim among the training captions; R@k / mean rank by "
            "CLIP self-retrieval among the split's images.",
            single,
            t1,
            [P.SPECIFICITY_TABLE1],
        ),
        paper_section(
            "Specificity Table 3 layout: standard text metrics",
            "One caption per image.",
            single,
            t3,
            [P.SPECIFICITY_TABLE3],
        ),
    ]


def scene_section(metrics: pd.DataFrame) -> list[Section]:
    if "scene_f1" not in metrics or metrics.scene_f1.isna().all():
        return []
    cols = [
        Col("Scene precision (%)", "scene_precision", 100),
        Col("Scene recall (%)", "scene_recall", 100),
        Col("Scene F1 (%)", "scene_f1", 100),
        Col("Caption Length", "length", 1, 1),
    ]
    return [
        paper_section(
            "Shapes world ground truth: talks much, errs much",
            "Each caption (sample 0) parsed into objects, attributes, relations and background, "
            "scored against the true scene graph: precision = correct claims / claims, recall = "
            "scene facts covered / facts (micro-averaged). No published counterpart exists.",
            metrics,
            cols,
        )
    ]


SECTIONS: tuple[Callable[[pd.DataFrame], list[Section]], ...] = (
    unkt_sections,
    cl_sections,
    smile_sections,
    specificity_sections,
    scene_section,
)


def report_sections(metrics: pd.DataFrame, reference: str | None = None) -> list[Section]:
    """The papers' sections; how each run fares against `reference` (with confidence
    intervals) is the versus_reference rule's table (distinctcap.report.versus)."""
    return [s for make in SECTIONS for s in make(metrics)]


def _md_table(block: Block) -> list[str]:
    lines = [
        f"**{block.title}**",
        "",
        "| " + " | ".join(block.headers) + " |",
        "|"
        + "|".join(":---" if i < block.labels else "---:" for i in range(len(block.headers)))
        + "|",
    ]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in block.rows]
    if not block.rows:
        lines.append("| (no run has this decoding) |" + " |" * (len(block.headers) - 1))
    lines += [""] + [f"{n}  " for n in block.notes]
    return lines


def tables_markdown(metrics: pd.DataFrame, source: str, reference: str | None = None) -> str:
    """All sections as one markdown document: ours, then the published reference blocks."""
    lines = ["# distinctcap: every run side by side", "", comparability(source), ""]
    for section in report_sections(metrics, reference):
        lines += [f"## {section.title}", "", section.intro, ""]
        lines += _md_table(section.ours) + [""]
        if section.published:
            caveat = (
                f" Not comparable with {OTHER_DATA[source][0]} runs." if source in OTHER_DATA
                else ""
            )
            lines += [f"> Reference block: the papers' published numbers.{caveat}", ""]
        for block in section.published:
            lines += _md_table(block) + [""]
    return "\n".join(lines).rstrip() + "\n"


def _html_table(block: Block, cls: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in block.headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block.rows
    )
    notes = "".join(f"<div class='note'>{html.escape(n)}</div>" for n in block.notes)
    return (
        f"<div class='{cls}'><h4>{html.escape(block.title)}</h4><table><tr>{head}</tr>"
        f"{body}</table>{notes}</div>"
    )


STYLE = """<style>body{font-family:sans-serif;font-size:13px}table{border-collapse:collapse}
td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}td:first-child{text-align:left}
.ours{background:#f4fbf4;padding:4px;margin:6px 0}.published{background:#f3f3f3;color:#444;
padding:4px;margin:6px 0;border-left:4px solid #999}.note{font-size:11px;color:#555}
.warn{border:1px solid #c90;padding:6px;background:#fff8e6}</style>"""


def tables_html(metrics: pd.DataFrame, source: str, reference: str | None = None) -> str:
    """The same sections as `tables_markdown`, as a standalone HTML page."""
    parts = [
        f"<html><head><meta charset='utf-8'>{STYLE}</head><body>",
        "<h2>distinctcap: every run side by side</h2>",
        f"<p class='warn'>{html.escape(comparability(source))}</p>",
    ]
    for section in report_sections(metrics, reference):
        parts += [
            f"<h3>{html.escape(section.title)}</h3><p>{html.escape(section.intro)}</p>",
            _html_table(section.ours, "ours"),
        ]
        if section.published:
            other = (
                f" (not comparable with {OTHER_DATA[source][1]} runs)" if source in OTHER_DATA
                else ""
            )
            parts.append(f"<p><b>Reference block: published numbers</b>{other}</p>")
        parts += [_html_table(b, "published") for b in section.published]
    return "\n".join(parts + ["</body></html>"])


def blocks(metrics: pd.DataFrame) -> list[tuple[str, str, Block]]:
    """(section, ours | published, block) of every table, in report order."""
    return [
        (section.title, kind, block)
        for section in report_sections(metrics)
        for kind, group in (("ours", [section.ours]), ("published", section.published))
        for block in group
    ]


def tables_latex(metrics: pd.DataFrame) -> str:
    """Every table as a LaTeX (booktabs) table, captioned with its section and block."""
    return "\n".join(
        latex(block.headers, block.rows, f"{section}: {block.title}", labels=block.labels)
        for section, _, block in blocks(metrics)
    )


def tables_csv(metrics: pd.DataFrame) -> pd.DataFrame:
    """Every table in long form: section, kind, table, row, column, value (as printed)."""
    rows = [
        (section, kind, block.title, r, header, cell)
        for section, kind, block in blocks(metrics)
        for r, row in enumerate(block.rows)
        for header, cell in zip(block.headers, row, strict=True)
    ]
    return pd.DataFrame(rows, columns=["section", "kind", "table", "row", "column", "value"])


def write_tables(
    metrics: pd.DataFrame,
    source: str,
    md_path: str | Path,
    html_path: str | Path,
    reference: str | None = None,
    tex_path: str | Path | None = None,
    csv_path: str | Path | None = None,
) -> None:
    """tables.md and tables.html, and every table as LaTeX and long-form CSV when asked."""
    with atomic_path(md_path) as tmp:
        tmp.write_text(tables_markdown(metrics, source, reference))
    with atomic_path(html_path) as tmp:
        tmp.write_text(tables_html(metrics, source, reference))
    if tex_path:
        with atomic_path(tex_path) as tmp:
            tmp.write_text(tables_latex(metrics))
    if csv_path:
        with atomic_path(csv_path) as tmp:
            tables_csv(metrics).to_csv(tmp, index=False)
