"""Report: summary columns, paper-layout tables with their published blocks, plots, gallery."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, snakemake, tiny_config
from evaluate_world import build

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_table, write_table
from distinctcap.core.settings import EvalSettings
from distinctcap.evaluate.stage import metric_columns
from distinctcap.report import published
from distinctcap.report.gallery import write_gallery
from distinctcap.report.plots import plot_cider_vs_n, plot_metric_bars, plot_training_curves
from distinctcap.report.summary import (
    SUMMARY_BASE,
    evaluation_keys,
    headline_markdown,
    read_metrics,
    reference_run,
    sampled_quality_markdown,
    seeds_markdown,
    summary_columns,
    summary_table,
    write_summary,
)
from distinctcap.report.tables import tables_html, tables_markdown
from distinctcap.scores.result import KEYS

SETTINGS = EvalSettings(oracle_ns=[20])
SPICE_WHY = "SPICE needs Stanford CoreNLP 3.6.0 (jars absent)"
PNG = b"\x89PNG"


def metrics_row(run: str, decoding: str, n_samples: int, cider: float) -> dict:
    """A metrics row as the evaluate stage writes it, with hand-picked values."""
    row = {"run": run, "split": "test", "decoding": decoding, "n_images": 200}
    row["n_samples"] = n_samples
    row |= {c: 0.25 for c in metric_columns(SETTINGS)}
    row |= {"cider": cider, "oracle_cider_20": 2 * cider, "spice": math.nan, "r_at_1": 0.125}
    skipped = {"spice": SPICE_WHY, "oracle_spice_20": SPICE_WHY, "consensus_spice": SPICE_WHY}
    row["oracle_spice_20"] = row["consensus_spice"] = math.nan
    if n_samples == 1:
        for c in metric_columns(SETTINGS):
            if c.startswith(("oracle_", "consensus_")) or c in ("div1", "div2", "distinct"):
                row[c] = math.nan
                skipped[c] = "one caption per image"
    row["skipped"] = skipped
    return row


@pytest.fixture
def metrics() -> pd.DataFrame:
    rows = [
        metrics_row(run, dec, n, c)
        for run, c in (("reference", 0.9), ("unkt", 1.1))
        for dec, n in (("greedy", 1), ("sample20", 20))
    ]
    return pd.DataFrame(rows)


def test_evaluation_keys_follow_each_decodings_splits():
    decoding = {"greedy": {"splits": ["test"]}, "sample20": {"splits": ["val", "test"]}}
    assert evaluation_keys(["a"], decoding) == [
        ("a", "test", "greedy"),
        ("a", "val", "sample20"),
        ("a", "test", "sample20"),
    ]


def test_the_summary_module_imports_neither_torch_nor_matplotlib():
    """report.summary is imported at DAG-parse time, which must stay light."""
    code = (
        "import sys, distinctcap.report.summary; "
        "print(sorted({'torch', 'matplotlib'} & set(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"


def test_summary_has_one_row_per_key_and_exactly_the_named_columns(metrics, tmp_path):
    oracle = [
        f"oracle_{m}_20"
        for m in ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge_l", "cider", "spice")
    ]
    consensus = [
        f"consensus_{m}"
        for m in (
            "bleu1",
            "bleu2",
            "bleu3",
            "bleu4",
            "meteor",
            "rouge_l",
            "cider",
            "spice",
            "div1",
            "div2",
            "mbleu4",
            "self_cider",
            "distinct",
        )
    ]
    ks = (1, 5, 10)
    judges = [*(f"judge_r_at_{k}" for k in ks), "judge_mean_rank", "judge_clipscore",
              "judge_refclipscore"]  # fmt: skip
    scene = [*(f"scene_r_at_{k}" for k in ks), "scene_mean_rank"]
    expected = [
        *SUMMARY_BASE,
        *judges,  # the tiny config's judge CLIP, after refclipscore
        "cider_btw",  # the field's, by the judge CLIP's similar images, then the scenes'
        "dis_word_rate",
        "cider_btw_scene",
        "dis_word_rate_scene",
        *oracle,
        *consensus,
        "ppl",
        "scene_precision",
        "scene_recall",
        "scene_f1",
        *scene,
    ]
    assert SUMMARY_BASE[-1] == "refclipscore"
    assert summary_columns(metrics) == expected
    assert SUMMARY_BASE[:6] == ("run", "split", "decoding", "bleu1", "bleu2", "bleu3")
    write_summary(metrics, tmp_path / "summary.csv")
    table = pd.read_csv(tmp_path / "summary.csv")
    assert list(table.columns) == [expected[0], "seed", *expected[1:]]  # seed: issue 34
    assert len(table) == 4 and len(table[list(KEYS)].drop_duplicates()) == 4
    assert table.spice.isna().all()  # skipped stays empty (NaN), never 0
    with pytest.raises(DistinctcapError, match="several metrics rows"):
        summary_table(pd.concat([metrics, metrics.iloc[:1]]))


def test_markdown_tables_hold_our_rows_and_the_published_blocks(metrics):
    text = tables_markdown(metrics, "shapes")
    for table in (
        "UNKT Table 1",
        "UNKT Table 2",
        "UNKT Table 3",
        "CL Table 1",
        "CL Table 4",
        "SMILE Table 1",
        "Specificity Table 1",
        "Specificity Table 3",
    ):
        assert f"## {table}" in text, table
    assert "NOT comparable" in text and "Not comparable with shapes-world runs" in text
    # oracle CIDEr of unkt/sample20 = 2.2 -> 220.0 in UNKT Table 1 (x100); CL Table 4 in 0.xxx
    assert "| unkt | sample20 | test | 25.0 | 25.0 | 25.0 | 25.0 | 220.0 |" in text
    assert (
        "| reference | greedy | test | 0.250 | 0.250 | 0.250 | 0.250 | 0.250 | 0.250 | 0.900 |"
        in text
    )
    assert "12.50" in text  # R@1 0.125 as % in the specificity layout
    assert "skipped [1]" in text and f"[1] {SPICE_WHY}" in text
    # the published block of each layout, transcribed from the papers
    assert "Published: UNKT Table 1 (20 samples)" in text
    assert "| UNKT | 54.5 | 68.5 | 80.0 | 92.0 | 174.2 | 73.8 | 41.9 | 33.0 |" in text
    assert "| Base + CL(Full) | 0.755 | 0.598 | 0.460 | 0.353 | 0.271 | 0.559 | 1.142 |" in text
    assert "| BLIP-L_SMILE | 22.3 | 4.5 | 10.0 | 24.5 | 75.0 | 95.6 |" in text
    assert "| CCos | 84.37 | 77.29 | 1052 | 12.53 | 36.19 | 50.00 | 32.30 |" in text
    assert "| Adv-samp | - | - | - | - | - | 0.236 | - | 0.166 |" in text
    assert "NOT comparable" not in tables_markdown(metrics, "coco")


def test_published_tables_are_rectangular_and_as_printed():
    tables = [
        *published.UNKT_TABLE1.values(),
        published.UNKT_TABLE2,
        *published.UNKT_ABLATIONS,
        published.CL_TABLE1,
        published.CL_TABLE4,
        *published.SMILE_TABLE1,
        published.SPECIFICITY_TABLE1,
        published.SPECIFICITY_TABLE3,
    ]
    for t in tables:
        assert all(len(v) == len(t.columns) for _, v in t.rows)
    assert dict(published.UNKT_TABLE1[100].rows)["UNKT w/ memory"][6] == 48.7
    assert dict(published.SPECIFICITY_TABLE3.rows)["Baseline"][6] == 1.036


def test_html_tables_mark_ours_and_the_reference_blocks(metrics):
    page = tables_html(metrics, "shapes")
    assert page.count("class='ours'") == page.count("<h3>") == 9
    assert "class='published'" in page and "not comparable with shapes runs" in page
    assert "skipped [1]" in page and "unkt" in page


def test_metric_panels_leave_out_noise():
    from distinctcap.report.plots import informative

    assert not informative(pd.Series([3.1e-10, 3.01e-10]))  # BLEU-4 of runs matching nothing
    assert not informative(pd.Series([np.nan, np.nan]))
    assert informative(pd.Series([0.0, 0.31]))


def test_plots_are_written(metrics, tmp_path):
    curves = {}
    for run in ("reference", "unkt"):
        curves[run] = tmp_path / f"{run}.csv"
        pd.DataFrame(
            {"step": [25, 50, 75], "loss": [3.0, 2.5, 2.2], "val_loss": [np.nan, 2.6, np.nan]}
        ).to_csv(curves[run], index=False)
    cider = tmp_path / "cider.csv"
    pd.DataFrame(
        {
            "run": "unkt",
            "split": "test",
            "decoding": "sample20",
            "n": [1, 5, 20],
            "cider": [0.9, 1.4, 1.8],
        }
    ).to_csv(cider, index=False)
    empty = tmp_path / "empty.csv"
    pd.DataFrame(columns=["run", "split", "decoding", "n", "cider"]).to_csv(empty, index=False)
    plot_training_curves(curves, tmp_path / "training.png")
    plot_metric_bars(metrics, tmp_path / "bars.png")
    plot_cider_vs_n([cider, empty], tmp_path / "cider.png")
    for name in ("training.png", "bars.png", "cider.png"):
        assert (tmp_path / name).read_bytes()[:4] == PNG


def test_gallery_shows_every_run_for_the_chosen_images(tmp_path_factory, tmp_path):
    world = build(tmp_path_factory.getbasetemp() / "evaluate-world")
    generated = [world.generated(r, d) for r in ("perfect", "generic") for d in ("greedy",)]
    images, captions = read_table(world.images), world.captions
    runs = {"generic": {"method": "mle"}, "perfect": {"method": "smile"}}
    write_gallery(images, captions, generated, "test", tmp_path / "g.html", count=5, runs=runs)
    page = (tmp_path / "g.html").read_text()
    assert page.count("<div class='card'>") == 5 and page.count("<img") == 5
    assert page.count("<span class='who'>human</span>") == 5  # never "reference"
    assert page.count("perfect (SMILE)</span>, greedy") == 5
    # the MLE run comes first, before the methods, on every card
    assert page.index("generic (MLE)") < page.index("perfect (SMILE)")
    assert page.count("a picture of some shapes") >= 5  # the generic run's caption each time


def test_gallery_marks_claims_and_hides_samples_and_the_showcase_is_chosen(
    tmp_path_factory, tmp_path
):
    from distinctcap.report.gallery import write_showcase

    world = build(tmp_path_factory.getbasetemp() / "evaluate-world")
    generated = [world.generated(r, d) for r in ("perfect", "generic")
                 for d in ("greedy", "sample4")]  # fmt: skip
    images, captions = read_table(world.images), world.captions
    runs = {"generic": {"method": "mle"}, "perfect": {"method": "smile"}}
    decoding = {"greedy": {"kind": "greedy"}, "sample4": {"kind": "sample", "n": 4}}
    write_gallery(images, captions, generated, "test", tmp_path / "g.html", count=5, runs=runs,
                  decoding=decoding)  # fmt: skip
    page = (tmp_path / "g.html").read_text()
    cards = page.split("<div class='cards'>")[1]
    shown, hidden = cards.split("<details>")[0], cards.split("<details>")[1]
    assert "sample4" not in shown and "sample4" in hidden and page.count("<details>") == 5
    assert "perfect (SMILE)</span>, greedy:" in shown
    assert "class='wrong'" not in cards  # the perfect run says its reference: every claim right
    assert cards.count("class='right'") >= 5 and "(claims nothing)" in cards  # generic
    write_showcase(images, generated, tmp_path / "showcase.md", runs=runs, decoding=decoding)
    lines = (tmp_path / "showcase.md").read_text().splitlines()[2:]
    assert lines[0].startswith("- generic (MLE), greedy, image ") and "0 of 0 claims" in lines[0]
    assert lines[1].startswith("- perfect (SMILE), greedy, image ")
    right, claims = re.search(r"(\d+) of (\d+) claims right", lines[1]).groups()
    assert right == claims != "0"


def test_read_metrics_decodes_skips(metrics, tmp_path):
    paths = []
    for i, row in metrics.iterrows():
        paths.append(tmp_path / f"{i}.parquet")
        flat = {**row.to_dict(), "skipped": json.dumps(row.skipped)}
        write_table(pd.DataFrame([flat]), paths[-1])
    table = read_metrics(paths)
    assert table.skipped[0]["spice"] == SPICE_WHY and len(table) == 4


def test_the_paper_tables_claim_no_wins_and_the_reference_is_found(metrics):
    """Wins against the reference are the versus_reference rule's, only with an interval
    excluding 0 (test_versus); the paper tables list values only."""
    text = tables_markdown(metrics, "shapes", reference=reference_run({"reference": {}}))
    assert "better than" not in text and "Versus" not in text
    assert reference_run({"a": {"method": "unkt"}, "b": {"method": "mle"}}) == "b"
    assert reference_run({"b": {"method": "mle", "data": "D-"}}) is None


@pytest.mark.slow
def test_report_rules_run_and_the_html_report_builds(tiny_dag, tiny_report):
    """The real rules on the shared tiny DAG, then --report: the summary, tables, plots,
    gallery and front page are all in the report."""
    workdir, config = tiny_dag
    summary = pd.read_csv(workdir / "results/metrics/summary.csv")
    keys = {tuple(row) for row in summary[list(KEYS)].values.tolist()}
    assert keys == {(run, "test", d) for run in config["runs"] for d in config["decoding"]}
    assert "oracle_cider_5" in summary and summary.spice.isna().all()
    tables = (workdir / "results/report/tables.md").read_text()
    assert "| reference | sample5 | test |" in tables and "Published: CL Table 4" in tables
    page = tiny_report.read_text()
    for name in (
        "summary.csv",
        "tables.html",
        "training.png",
        "metric_bars.png",
        "cider_vs_n.png",
        "gallery.html",
        "versus.csv",
        "headline.csv",
    ):
        assert name in page, name
    # the front page opens on the headline table; R@1 is never a mailto: link
    front = (workdir / ".snakemake/distinctcap/front.rst").read_text()
    assert front.index("**Headline**") < front.index("How to read it")
    assert "   * - reference (MLE)" in front and "- smile: " in front
    assert front.index("**Verdict**") < front.index("**Headline**") < front.index("forest")
    assert "forest.png" in page
    assert "<strong>Headline</strong>" in page and 'href=\\"mailto:' not in page


def test_a_report_of_an_unfinished_run_shows_what_exists(workdir):
    """`make report` before (or during) a run: the report builds from what exists."""
    config = {**tiny_config(), "data": {"source": "shapes",
                                        "shapes": {"n_train": 20, "n_val": 4, "n_test": 4}}}
    data = snakemake(workdir, "results/data/images.parquet", config=config, timeout=300)
    assert data.returncode == 0, data.stderr[-3000:]
    html = workdir / "results/report.html"
    report = snakemake(workdir, "--report", str(html))
    assert report.returncode == 0, report.stderr[-3000:]
    assert "No evaluation yet" in (workdir / ".snakemake/distinctcap/front.rst").read_text()
    assert html.stat().st_size > 0


def test_the_readme_headline_table_is_rendered_from_the_summary():
    """The README's results table comes from summary.csv (`make readme-table`), never by hand."""
    rows = []
    for run, base in (("reference", 0.4), ("smile", 0.5)):
        rows.append({"run": run, "split": "test", "decoding": "greedy", "bleu4": base,
                     "meteor": 0.3, "cider": 1.0765, "r_at_1": 0.3, "mean_rank": 45.64,
                     "clipscore": 0.934, "scene_f1": float("nan"), "div2": 0.1, "distinct": 0.2})
        rows.append({"run": run, "split": "test", "decoding": "sample20", "div2": 0.352,
                     "distinct": 0.76})
    runs = {"reference": {"method": "mle", "data": "all"}, "smile": {"method": "smile"},
            "missing": {"method": "mle", "data": "D-"}}
    lines = headline_markdown(pd.DataFrame(rows), runs).splitlines()
    assert lines[0].startswith("| run | BLEU-4 ↑ | METEOR ↑ | CIDEr ↑ | R@1 ↑ | mean rank ↓ |")
    assert lines[0].endswith("| Div-2 (20 samples) ↑ | distinct (20 samples) ↑ |")
    assert lines[2] == (
        "| reference (MLE) | 0.400 | 0.300 | 1.077 | 0.300 | 45.6 | 0.93 | - | 0.352 | 0.760 |"
    )
    # rows: the reference, the other MLE runs (teachers), then the methods
    assert lines[3] == "| missing (MLE on D-) |" + " - |" * 9
    assert lines[4].startswith("| smile | 0.500 |")


def test_the_unkt_sampled_quality_table_has_the_reference_and_the_unkt_runs():
    rows = [{"run": run, "split": "test", "decoding": dec, "cider": c, "r_at_1": 0.3,
             "oracle_cider_20": 2.6, "div2": 0.35}
            for run in ("reference", "unkt", "cl")
            for dec, c in (("greedy", 1.0), ("beam3", 1.1), ("sample20", 0.9))]  # fmt: skip
    runs = {"reference": {"method": "mle", "data": "all"}, "unkt": {"method": "unkt"},
            "cl": {"method": "cl"}}
    lines = sampled_quality_markdown(pd.DataFrame(rows), runs).splitlines()
    assert lines[0] == ("| run | greedy CIDEr ↑ | greedy R@1 ↑ | beam-3 CIDEr ↑ | beam-3 R@1 ↑ | "
                        "sampled CIDEr ↑ | oracle CIDEr@20 ↑ | Div-2 (20 samples) ↑ |")
    assert lines[2:] == [
        "| reference (MLE) | 1.000 | 0.300 | 1.100 | 0.300 | 0.900 | 2.600 | 0.350 |",
        "| unkt | 1.000 | 0.300 | 1.100 | 0.300 | 0.900 | 2.600 | 0.350 |",
    ]  # cl is not a UNKT arm


def test_the_seeds_table_pools_each_arm_over_its_seeds():
    """reference and reference_s1 pool into one arm (mean ± sample sd); an arm with one
    evaluated seed shows its value alone; missing columns are '-'."""
    cider = {"reference": 1.0, "reference_s1": 1.2, "unkt_teacher": 0.9}
    rows = [{"run": run, "split": "test", "decoding": dec, "cider": c, "mbleu4": 0.5}
            for run, c in cider.items() for dec in ("greedy", "beam3", "sample20")]  # fmt: skip
    runs = {"reference": {"method": "mle", "data": "all"},
            "reference_s1": {"method": "mle", "data": "all", "seed": 1},
            "unkt_teacher": {"method": "unkt", "negative_captions": "teacher"}}  # fmt: skip
    lines = seeds_markdown(pd.DataFrame(rows), runs).splitlines()
    assert lines[0].startswith("| arm | seeds | greedy CIDEr ↑ |")
    assert lines[0].endswith("| mBLEU-4 (20 samples) ↓ |")
    assert lines[2].startswith("| reference | 2 | 1.100 ± 0.141 | - |")
    assert lines[2].endswith("| 0.500 ± 0.000 |")
    assert lines[3].startswith("| unkt_teacher | 1 | 0.900 | - |")


def test_every_paper_table_exports_to_latex_and_csv(metrics, tmp_path):
    from distinctcap.report.tables import blocks, write_tables

    write_tables(metrics, "shapes", tmp_path / "t.md", tmp_path / "t.html",
                 tex_path=tmp_path / "t.tex", csv_path=tmp_path / "t.csv")
    tex, table = (tmp_path / "t.tex").read_text(), pd.read_csv(tmp_path / "t.csv")
    every = blocks(metrics)
    assert tex.count("\\begin{tabular}") == len(every)
    with_rows = {(s, k, b.title) for s, k, b in every if b.rows}
    assert set(map(tuple, table[["section", "kind", "table"]].values)) == with_rows
    assert "skipped [1]" in set(table.value)


def test_the_rendered_page_is_read_as_a_reader_sees_it():
    """parse_page: visible text and tables in order; scripts and hidden elements left out."""
    from distinctcap.report.browser import parse_page

    dom = (
        "<html><head><title>t</title></head><body>"
        '<div style="display: none"><p>Loading...</p></div>'
        "<script>x = '<table><tr><td>code</td></tr></table>'</script>"
        "<h1>Title</h1><p><strong>Headline</strong> (test)<br></p>"
        "<table><thead><tr><th>run</th><th>BLEU-4 ↑</th></tr></thead>"
        "<tbody><tr><td><p>reference (MLE)</p></td><td>0.250</td></tr></tbody></table>"
        "<p>How to read it.</p><table><tr><td>second</td></tr></table></body></html>"
    )
    page = parse_page(dom)
    assert page.text.startswith("Title Headline (test) run BLEU-4 ↑")
    assert "Loading" not in page.text and "code" not in page.text
    assert [t.rows for t in page.tables] == [
        [["run", "BLEU-4 ↑"], ["reference (MLE)", "0.250"]], [["second"]]
    ]
    assert page.text[page.tables[0].at :].startswith("run BLEU-4")


def test_no_chromium_says_what_to_install(monkeypatch, tmp_path):
    from distinctcap.report import browser

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("DISTINCTCAP_CHROMIUM", raising=False)
    (tmp_path / "report.html").write_text("<html></html>")
    with pytest.raises(DistinctcapError, match="install Debian's `chromium` package"):
        browser.render_dom(tmp_path / "report.html")
    with pytest.raises(DistinctcapError, match="no report at"):
        browser.screenshot(tmp_path / "missing.html", tmp_path / "front.png")


def test_front_page_table_cells_render_as_written():
    """A missing value ("-") stays a dash in the report, not an empty bullet list; R@1 and
    snake_case names stay as written (docutils, as snakemake --report renders the page)."""
    from docutils.core import publish_parts
    from docutils.writers.html4css1 import Writer

    from distinctcap.report.browser import parse_page
    from distinctcap.report.front import rst_table

    headers = ["run", "R@1 ↑", "difference"]
    rows = [["teacher_neg (MLE on D-)", "-", "-0.125"], ["+x", "*a*", "0.5"]]
    html = publish_parts("\n".join(rst_table(headers, rows)), writer=Writer())["body"]
    assert "<li>" not in html
    assert parse_page(html).tables[0].rows == [headers, *rows]


VERSUS_ROWS = [  # run, decoding, metric, difference, ci_low, ci_high, verdict (test split)
    ("smile", "greedy", "cider", 0.2, 0.1, 0.3, "better"),
    ("smile", "greedy", "r_at_1", 0.1, -0.05, 0.2, "no significant difference"),
    ("smile", "greedy", "mean_rank", 1.0, 0.5, 1.5, "worse"),
    ("smile", "sample20", "cider", -0.5, -0.6, -0.4, "worse"),
    ("teacher_neg", "greedy", "cider", -0.2, -0.3, -0.1, "worse"),
]
FRONT_RUNS = {"reference": {"method": "mle"}, "teacher_neg": {"method": "mle", "data": "D-"},
              "smile": {"method": "smile"}}  # fmt: skip


@pytest.fixture
def versus() -> pd.DataFrame:
    rows = [{"run": r, "decoding": d, "split": "test", "metric": m, "value": 1.0,
             "reference_value": 1.0 - diff, "difference": diff, "ci_low": lo, "ci_high": hi,
             "verdict": v} for r, d, m, diff, lo, hi, v in VERSUS_ROWS]  # fmt: skip
    return pd.DataFrame(rows)


def front_summary() -> pd.DataFrame:
    """Headline columns of three runs: smile best on CIDEr, the reference on mean rank."""
    rows = []
    for run, cider, rank in (("reference", 1.0, 2.0), ("teacher_neg", 0.8, 9.0),
                             ("smile", 1.2, 3.0)):
        rows.append({"run": run, "split": "test", "decoding": "greedy", "bleu4": 0.3,
                     "meteor": 0.3, "cider": cider, "r_at_1": 0.4, "mean_rank": rank,
                     "clipscore": 0.9, "scene_f1": 0.5, "div2": np.nan, "distinct": np.nan})
    return pd.DataFrame(rows)


def test_each_method_gets_one_verdict_line_with_its_intervals(versus):
    """Issue 32: what each method wins and loses against the reference, with the interval;
    teachers (MLE runs) get no verdict line, and only the asked decoding is read."""
    from distinctcap.report.verdicts import verdict_lines

    assert verdict_lines(versus, FRONT_RUNS, "greedy") == [
        "smile: wins CIDEr +0.200 [+0.100, +0.300]; loses mean rank +1.000 [+0.500, +1.500]; "
        "no clear difference on R@1"
    ]


def test_the_front_table_has_methods_before_teachers_intervals_and_the_best_marked(versus):
    from docutils.core import publish_parts
    from docutils.writers.html4css1 import Writer

    from distinctcap.report.front import front_cell, rst_table
    from distinctcap.report.verdicts import front_table, methods_first

    assert methods_first(FRONT_RUNS) == ["reference", "smile", "teacher_neg"]
    headers, rows = front_table(front_summary(), versus, FRONT_RUNS, "greedy", "greedy")
    assert [row[0][0] for row in rows] == ["reference (MLE)", "smile", "teacher_neg (MLE on D-)"]
    cider, rank = headers.index("CIDEr ↑"), headers.index("mean rank ↓")
    assert rows[1][cider] == ("1.200", "[+0.100,+0.300]", True)  # best, with its interval
    assert rows[0][rank] == ("2.0", "", True)  # lowest is best under ↓; no interval for itself
    assert rows[2][cider] == ("0.800", "[-0.300,-0.100]", False)
    cells = [[front_cell(*c) for c in row] for row in rows]
    html = publish_parts("\n".join(rst_table(headers, cells, escaped=True)), writer=Writer())
    assert "<strong>1.200</strong> [+0.100,+0.300]" in html["body"]


def test_the_front_table_shows_the_field_metrics_bare(versus):
    """CIDErBtw and DisWordRate are in the front table where measured, lowest CIDErBtw best,
    without the interval of their difference: with it the tiny run's table overran the
    1400 px window (their intervals are in versus.md and the verdict lines)."""
    from distinctcap.report.verdicts import front_table

    summary = front_summary().assign(cider_btw=[0.7, 0.8, 0.6], dis_word_rate=[0.01, 0.0, 0.02])
    field = [{"run": "smile", "decoding": "greedy", "split": "test", "metric": metric,
              "value": 1.0, "reference_value": 1.0, "difference": -0.1, "ci_low": -0.2,
              "ci_high": -0.05, "verdict": "better"}
             for metric in ("cider_btw", "dis_word_rate")]  # fmt: skip
    headers, rows = front_table(summary, pd.concat([versus, pd.DataFrame(field)]), FRONT_RUNS,
                                "greedy", "greedy")  # fmt: skip
    assert headers.index("CIDErBtw ↓") < headers.index("DisWordRate ↑")
    assert rows[1][headers.index("CIDErBtw ↓")] == ("0.600", "", True)
    assert rows[1][headers.index("DisWordRate ↑")] == ("0.020", "", True)
    assert rows[1][headers.index("CIDEr ↑")][1] == "[+0.100,+0.300]"  # the others keep theirs


def test_the_forest_plot_and_the_bars_with_intervals_are_written(versus, tmp_path):
    from distinctcap.report.plots import interval_errors, plot_forest
    from distinctcap.report.versus import HEADERS

    plot_forest(versus, ["smile", "teacher_neg"], "greedy", HEADERS, tmp_path / "forest.png")
    assert (tmp_path / "forest.png").read_bytes()[:4] == PNG
    errors = interval_errors(versus, ["reference", "smile"], "test/greedy", "cider",
                             np.array([1.0, 1.2]))  # fmt: skip
    assert np.allclose(errors, [[0.0, 0.1], [0.0, 0.1]])  # the interval around smile's value
    metrics = front_summary().assign(n_samples=1)
    plot_metric_bars(metrics, tmp_path / "bars.png", order=["reference", "smile", "teacher_neg"],
                     versus=versus)  # fmt: skip
    assert (tmp_path / "bars.png").read_bytes()[:4] == PNG


def test_without_results_the_commands_say_where_results_are(tmp_path, monkeypatch):
    """`distinctcap runs/compare` take the newest results folder with what they need; `make
    report` with nothing to report names the folders that hold results, in one line."""
    from distinctcap.runs.experiments import find_results, report_check

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DistinctcapError, match="run make quick first"):
        find_results(None, need_summary=True)
    assert "run make quick or make run first" in report_check(Path("."))
    quick = Path("experiments/quick/results")
    (quick / "runs/smile").mkdir(parents=True)
    (quick / "runs/smile/run.json").write_text("{}")
    assert find_results(None, need_summary=False) == quick
    with pytest.raises(DistinctcapError, match="experiments/quick/results"):
        find_results(None, need_summary=True)
    (quick / "metrics").mkdir()
    (quick / "metrics/summary.csv").write_text("run\n")
    assert find_results(None, need_summary=True) == quick
    said = report_check(Path("."))
    assert said.count("\n") == 0 and "results/ does not exist" in said and str(quick) in said
    assert report_check(Path("experiments/quick")) is None
    assert find_results("elsewhere", need_summary=True) == Path("elsewhere")


# Issue 48 item 8: the front page's CLIP line, forest ticks and "-" cells, as a newcomer read them.
SHIPPED_RETRIEVAL = {  # results/clip/retrieval.json of make quick (the shipped weights)
    "n_images": 200, "n_captions": 1000, "chance_R@1": 0.005,
    "text_to_image_R@1": 0.40799999237060547, "image_to_text_R@1": 0.9449999928474426,
    "text_to_image_R@5": 0.5180000066757202, "image_to_text_R@5": 1.0, "train_seconds": 3.2,
    "epochs": 240, "logit_scale": 35.497, "arch": "shapes-rn-tiny",
    "fingerprint": {"arch": "shapes-rn-tiny", "seed": 0}, "weights": "shipped shapes-rn-tiny.pt",
}


def test_the_front_page_says_the_clips_retrieval_in_a_sentence(tmp_path):
    """It was a raw key dump: `logit_scale 35.497, train_seconds 3.200` for shipped weights."""
    from distinctcap.report.front import clip_retrieval

    (tmp_path / "clip").mkdir()
    (tmp_path / "clip" / "retrieval.json").write_text(json.dumps(SHIPPED_RETRIEVAL))
    said = " ".join(clip_retrieval(tmp_path))
    assert said.startswith("**The CLIP** on the validation split: for 94.5 % of the images one "
                           "of their own captions is the nearest of all captions"), said
    assert "40.8 % of the captions" in said and "chance is 0.5 %." in said
    assert not re.search(r"logit_scale|train_seconds|fingerprint|_R@", said), said


def test_a_dash_in_the_headline_table_says_why(tmp_path):
    """make quick decodes greedily, so Div-2 and distinct are '-': the page says why, from the
    reason the evaluation recorded."""
    from distinctcap.report.front import dash_legend, escape

    why = "diversity compares the captions of one image: needs >= 2 per image"
    (tmp_path / "metrics" / "smile").mkdir(parents=True)
    pd.DataFrame({"skipped": [json.dumps({"div2": why, "distinct": why})]}).to_parquet(
        tmp_path / "metrics" / "smile" / "test-greedy.parquet")
    rows = [["reference (MLE)", "0.4", "0.3", "1.0", "0.3", "43.2", "0.96", "0.2", "-", "-"],
            ["smile", "0.5", "0.4", "1.4", "0.9", "1.1", "1.2", "0.6", "-", "-"]]
    assert dash_legend(tmp_path, rows, "greedy", "greedy") == [
        "A - in the table is a metric with no value:", "",
        f"- Div-2 and distinct: {escape(why)} (decoding greedy).", ""]  # escaped for rst
    rows[0][1] = "-"  # a metric nobody evaluated (yet)
    assert "- BLEU-4: not evaluated yet." in dash_legend(tmp_path, rows, "greedy", "greedy")
    assert dash_legend(tmp_path, rows[1:], "greedy", "sample20") == [
        "A - in the table is a metric with no value:", "",
        "- Div-2 and distinct: not evaluated yet.", ""]


def test_the_forest_plots_tick_labels_stand_apart():
    """The scene-precision panel's labels (-0.05 ... 0.01 in 2.3 inches) ran together: every
    panel's neighbouring x tick labels are at least one font size apart."""
    from distinctcap.report.plots import forest_figure
    from distinctcap.report.versus import HEADERS

    differences = {"bleu4": (0.012, -0.01, 0.035), "meteor": (0.08, 0.06, 0.1),
                   "cider": (0.31, 0.2, 0.42), "r_at_1": (0.5, 0.42, 0.58),
                   "mean_rank": (-30.0, -36.0, -24.0), "clipscore": (0.21, 0.19, 0.23),
                   "scene_f1": (0.3, 0.26, 0.34), "scene_precision": (-0.0213, -0.0437, 0.0061)}
    versus = pd.DataFrame([{"run": "smile", "decoding": "greedy", "split": "test", "metric": m,
                            "difference": d, "ci_low": lo, "ci_high": hi, "verdict": "none"}
                           for m, (d, lo, hi) in differences.items()])
    fig = forest_figure(versus, ["smile"], "greedy", HEADERS)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in labels]
        em = labels[0].get_fontsize() * fig.dpi / 72
        gaps = [b.x0 - a.x1 for a, b in zip(boxes, boxes[1:], strict=False)]
        assert min(gaps) >= em, (ax.get_title(), [t.get_text() for t in labels], gaps)


def judged_summary(judge_r_at_1, scene_r_at_1, judge_clipscore) -> pd.DataFrame:
    """`front_summary` with the independent judges' columns (issue 45), the same on each run."""
    return front_summary().assign(judge_r_at_1=judge_r_at_1, scene_r_at_1=scene_r_at_1,
                                  judge_clipscore=judge_clipscore)


def test_the_headline_shows_the_judges_beside_the_trainers_clip_where_evaluated():
    """Issue 45: judge R@1 and scene R@1 right after R@1, judge CLIPScore after CLIPScore; a
    judge every row of which is NaN (a config without it) leaves today's headline exactly."""
    today = headline_markdown(front_summary(), FRONT_RUNS)
    assert headline_markdown(judged_summary(np.nan, np.nan, np.nan), FRONT_RUNS) == today
    lines = headline_markdown(judged_summary(0.25, 0.5, 0.81), FRONT_RUNS).splitlines()
    assert lines[0] == ("| run | BLEU-4 ↑ | METEOR ↑ | CIDEr ↑ | R@1 ↑ | judge R@1 ↑ | scene R@1 ↑ "
                        "| mean rank ↓ | CLIPScore ↑ | judge CLIPScore ↑ | scene F1 ↑ "
                        "| Div-2 (20 samples) ↑ | distinct (20 samples) ↑ |")
    assert lines[2] == ("| reference (MLE) | 0.300 | 0.300 | 1.000 | 0.400 | 0.250 | 0.500 "
                        "| 2.0 | 0.90 | 0.81 | 0.500 | - | - |")
    coco = headline_markdown(judged_summary(0.25, np.nan, 0.81), FRONT_RUNS)  # no scene judge
    assert "judge R@1 ↑ | mean rank ↓" in coco and "scene R@1" not in coco


def test_the_summary_keeps_the_judges_columns_where_the_evaluation_wrote_them(metrics):
    judge_columns = [c for c in metrics if c.startswith(("judge_", "scene_r_at_"))
                     or c == "scene_mean_rank"]  # fmt: skip
    metrics = metrics.drop(columns=judge_columns)  # as a config without judges writes them
    judged = metrics.assign(judge_r_at_1=0.2, judge_mean_rank=3.0, judge_clipscore=0.7,
                            judge_refclipscore=0.75, scene_r_at_1=0.4, scene_mean_rank=2.5)
    columns = summary_columns(judged)
    assert columns == list(dict.fromkeys(columns))
    base = columns.index("refclipscore")
    assert columns[base + 1:base + 5] == ["judge_r_at_1", "judge_mean_rank", "judge_clipscore",
                                          "judge_refclipscore"]
    assert columns[-3:] == ["scene_f1", "scene_r_at_1", "scene_mean_rank"]
    assert summary_columns(metrics) == [c for c in columns if "judge_" not in c
                                        and c not in ("scene_r_at_1", "scene_mean_rank")]


JUDGED_ROWS = [  # a gain under the trainer's CLIP that the judge CLIP barely shares
    ("smile", "greedy", "r_at_1", 0.3, 0.2, 0.4, "better"),
    ("smile", "greedy", "judge_r_at_1", 0.02, -0.01, 0.05, "no significant difference"),
    ("smile", "greedy", "scene_r_at_1", 0.2, 0.1, 0.3, "better"),
]


def test_a_gain_under_half_of_the_clips_is_flagged_on_the_verdict_line(versus):
    """Issue 45's words on the front page and in `distinctcap compare` (verdict_lines); a
    judge gain of at least half the CLIP's, its interval above 0, confirms it instead."""
    from distinctcap.report.verdicts import front_table, verdict_lines

    rows = [{"run": r, "decoding": d, "split": "test", "metric": m, "value": 1.0,
             "reference_value": 1.0 - diff, "difference": diff, "ci_low": lo, "ci_high": hi,
             "verdict": v} for r, d, m, diff, lo, hi, v in JUDGED_ROWS]  # fmt: skip
    judged = pd.concat([versus[versus.metric != "r_at_1"], pd.DataFrame(rows)])
    line = verdict_lines(judged, FRONT_RUNS, "greedy")[0]
    assert line.endswith(
        "; gain measured mainly by the CLIP it was tuned on (R@1 +0.300: judge R@1 +0.020 "
        "[-0.010, +0.050])")
    assert "wins CIDEr +0.200 [+0.100, +0.300], R@1 +0.300 [+0.200, +0.400], scene R@1" in line
    judged.loc[judged.metric == "judge_r_at_1", ["difference", "ci_low", "verdict"]] = [
        0.15, 0.05, "better"]
    assert verdict_lines(judged, FRONT_RUNS, "greedy")[0].endswith(
        "; the judges confirm its CLIP gains (R@1 +0.300: judge R@1 +0.150 [+0.050, +0.050]; "
        "R@1 +0.300: scene R@1 +0.200 [+0.100, +0.300])")
    headers, table = front_table(judged_summary(0.25, 0.5, 0.81), judged, FRONT_RUNS, "greedy",
                                 "greedy")  # fmt: skip
    # the judges' intervals are on the verdict line, not beside their numbers in the table
    assert table[1][headers.index("judge R@1 ↑")] == ("0.250", "", False)
    assert table[1][headers.index("scene R@1 ↑")] == ("0.500", "", False)
