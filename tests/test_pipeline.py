"""End to end: the whole DAG on the tiny config with `snakemake --cores 2`, as users run it."""

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from conftest import ROOT, snakemake

pytestmark = pytest.mark.slow


def test_every_run_is_trained_decoded_and_evaluated(tiny_dag):
    workdir, config = tiny_dag
    summary = pd.read_csv(workdir / "results/metrics/summary.csv")
    assert set(summary.run) == set(config["runs"])
    for column in ("bleu4", "cider", "r_at_1", "clipscore", "scene_f1"):
        assert summary[column].notna().all(), column
    sampled = summary.decoding == "sample5"
    for column in ("div1", "self_cider"):  # diversity needs several captions per image
        assert summary.loc[sampled, column].notna().all(), column
        assert summary.loc[~sampled, column].isna().all(), column
    greedy = pd.read_parquet(workdir / "results/metrics/reference/test-greedy.parquet")
    assert "div1" in greedy.skipped[0]  # the recorded reason
    assert summary.spice.isna().all()  # SPICE jars are not on this machine: skipped, never 0
    assert set(summary.decoding) == set(config["decoding"])
    for name in config["runs"]:
        assert (workdir / f"logs/train/{name}.log").stat().st_size > 0


def test_versus_has_intervals_for_retrieval_from_the_per_image_tables(tiny_dag):
    workdir, config = tiny_dag
    summary = pd.read_csv(workdir / "results/metrics/summary.csv").set_index(["run", "decoding"])
    per_image = pd.read_parquet(workdir / "results/metrics/unkt/test-greedy-per_image.parquet")
    assert len(per_image) == config["data"]["shapes"]["n_test"]
    assert per_image.clip_rank.mean() == pytest.approx(summary.loc[("unkt", "greedy"), "mean_rank"])
    versus = pd.read_csv(workdir / "results/report/versus.csv")
    assert {"cider", "r_at_1", "mean_rank", "clipscore", "scene_f1"} <= set(versus.metric)
    assert set(versus.run) == set(config["runs"]) - {"reference"}
    clip = versus[versus.metric.isin(["r_at_1", "mean_rank", "clipscore"])]
    assert clip[["ci_low", "ci_high"]].notna().all().all()


def test_a_deleted_metrics_table_is_regenerated(tiny_dag):
    workdir, _ = tiny_dag
    lost = workdir / "results/metrics/smile/test-greedy.parquet"
    lost.unlink()
    result = snakemake(workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert lost.exists()


def test_rerun_does_nothing(tiny_dag):
    workdir, _ = tiny_dag
    again = snakemake(workdir, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_entropy_fraction_edit_reruns_only_the_split_and_dependents(tiny_dag):
    workdir, config = tiny_dag
    edited = {**config, "entropy": {**config.get("entropy", {}), "fraction": 0.4}}
    planned = snakemake(workdir, "-n", "--quiet", "rules", config=edited)
    snakemake(workdir, "-n", config=config)  # restore the config for the other checks
    text = planned.stdout + planned.stderr
    assert "split_entropy" in text
    for upstream in ("prepare_data", "train_clip", "extract_features", "retrieval_entropy"):
        assert upstream not in text, upstream


def test_html_report_builds(tiny_report):
    assert tiny_report.stat().st_size > 10_000


@pytest.fixture(scope="module")
def chromium() -> None:
    """Skipped without a Chromium, unless DISTINCTCAP_REQUIRE_CHROMIUM=1 (CI), where it fails."""
    from distinctcap.core.errors import DistinctcapError
    from distinctcap.report.browser import find_chromium

    try:
        find_chromium()
    except DistinctcapError as err:
        if os.environ.get("DISTINCTCAP_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"DISTINCTCAP_REQUIRE_CHROMIUM=1 but {err}")
        pytest.skip(str(err))


def test_the_report_opens_on_the_verdicts_and_the_headline_table_in_chromium(
    tiny_dag, tiny_report, chromium, tmp_path
):
    """Issues 20 and 32: the report as a researcher opens it, in headless Chromium. The front
    page opens on one verdict line per method against the reference, then the headline table
    of summary.csv (the arrowed headers, the reference, the methods, then the teachers; the
    intervals of versus.csv beside the numbers), then the forest plot, before how to read it;
    in a 1400 x 1000 window the title, the verdicts, the whole table and the forest plot are
    in sight, unscrolled, with the rule graph below them; tools/report_screenshot.py writes a
    PNG of the asked size."""
    from PIL import Image

    from distinctcap.report.browser import layout, parse_page, render_dom
    from distinctcap.report.summary import pick_decodings
    from distinctcap.report.verdicts import front_table, verdict_lines

    workdir, config = tiny_dag
    page = parse_page(render_dom(tiny_report))
    assert page.tables, page.text[:3000]
    first = page.tables[0]
    summary = pd.read_csv(workdir / "results/metrics/summary.csv")
    versus = pd.read_csv(workdir / "results/report/versus.csv")
    runs = yaml.safe_load((workdir / "config.yaml").read_text())["runs"]  # as snakemake read it
    quality, diversity = pick_decodings(summary)
    headers, rows = front_table(summary, versus, runs, quality, diversity)
    shown = [[f"{value} {interval}".strip() for value, interval, _ in row] for row in rows]
    assert first.rows == [headers, *shown], page.text[:3000]
    assert first.rows[0][:2] == ["run", "BLEU-4 ↑"] and "mean rank ↓" in first.rows[0]
    assert first.rows[1][0] == "reference (MLE)" and len(first.rows) == 1 + len(config["runs"])
    methods = [name for name, run in runs.items() if run.get("method", "mle") != "mle"]
    assert [r[0] for r in first.rows[2:6]] == methods  # in config order, before the teachers
    assert "[" in first.rows[2][headers.index("CIDEr ↑")]  # an interval beside the number
    before = page.text[: first.at]
    assert "distinctcap: distinctive captioning on shapes" in before and "Headline" in before
    assert "How to read it" not in before and "What was run" not in before
    lines = verdict_lines(versus, runs, quality)
    assert len(lines) == 4 and all(line in before for line in lines), before[-3000:]

    # Snakemake centres the front page in a window-high box: unless report.front top-aligns
    # it, a page taller than the window starts above the window, out of reach of scrolling.
    at = layout(tiny_report, {"title": "#app .document h1", "verdicts": "#app .document ul",
                              "table": "#app .document table", "forest": "#distinctcap-forest",
                              "graph": "#rulegraph"}, width=1400, height=1000)  # fmt: skip
    title, verdicts, table, forest, graph = (at[k] for k in
                                             ("title", "verdicts", "table", "forest", "graph"))
    assert at["window"] == {"width": 1400, "height": 1000}
    assert 0 <= title["top"] < title["bottom"] <= verdicts["top"] < verdicts["bottom"], at
    assert verdicts["bottom"] <= table["top"] < table["bottom"] <= forest["top"], at
    assert forest["bottom"] - forest["top"] > 100 and forest["bottom"] <= 1000, at
    assert table["right"] <= 1400 and forest["right"] <= 1400, at
    assert graph["top"] >= forest["bottom"], at  # out of the way, below the front page

    png = tmp_path / "front.png"
    tool = [sys.executable, str(ROOT / "tools/report_screenshot.py"), str(tiny_report), str(png)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([*tool, "--width", "1200", "--height", "900"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        assert image.size == (1200, 900)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # text and the sidebar, not a blank page


def test_a_trained_run_folder_captions_new_images(tiny_dag, tmp_path):
    """The pipeline's run folders are self-contained: the command and load_run caption images
    that are not in the data (copies of test images under new names, and a JPEG)."""
    import os
    import subprocess
    import sys

    from PIL import Image

    from distinctcap import load_run

    workdir, config = tiny_dag
    for name in config["runs"]:
        assert (workdir / f"results/runs/{name}/run.json").is_file(), name
    images = pd.read_parquet(workdir / "results/data/images.parquet")
    files = images[images.split == "test"].file.head(3).tolist()
    for k, file in enumerate(files):
        shutil.copy(workdir / file, tmp_path / f"mine{k}.png")
    Image.open(workdir / files[0]).convert("RGB").save(tmp_path / "mine.jpg")
    run = load_run(workdir / "results/runs/smile", device="cpu")
    results = run.caption([tmp_path])
    assert len(results) == 4 and all(r["caption"] for r in results)
    generated = pd.read_parquet(workdir / "results/generated/smile/test-greedy.parquet")
    first = images[images.file == files[0]].image_id.item()
    # the same image gives the pipeline's own greedy caption
    assert results[1]["caption"] == generated[generated.image_id == first].text.item()
    done = subprocess.run(
        [sys.executable, "-m", "distinctcap", "caption", "results/runs/smile", str(tmp_path)],
        cwd=workdir, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 4
