"""The per-rule time table (distinctcap.report.times) and the benchmark file of every rule."""

import re

import pandas as pd
from conftest import ROOT
from snakemake.benchmark import BenchmarkRecord, write_benchmark_records

from distinctcap.report.times import markdown, read_benchmarks, rule_table


def rules_and_blocks() -> dict[str, str]:
    rules = {}
    for path in (ROOT / "workflow" / "rules").glob("*.smk"):
        for block in re.split(r"^rule ", path.read_text(), flags=re.MULTILINE)[1:]:
            rules[block.split(":")[0]] = block
    return rules


def test_every_rule_writes_a_benchmark_named_after_it():
    for rule, block in rules_and_blocks().items():
        found = re.search(r'benchmark:\s*\n\s*"benchmarks/([^"]+)\.tsv"', block)
        assert found, f"rule {rule} has no benchmark"
        assert found.group(1).split("/")[0] == rule, f"rule {rule}: {found.group(1)}"


def write_record(path, wall, cpu, rss):
    record = BenchmarkRecord(running_time=wall, max_rss=rss, cpu_time=cpu)
    record.data_collected = True
    path.parent.mkdir(parents=True, exist_ok=True)
    write_benchmark_records([record], str(path), False)


def test_the_table_sums_and_maxes_each_rules_jobs(tmp_path):
    write_record(tmp_path / "train_clip.tsv", 300.0, 590.0, 900.0)
    write_record(tmp_path / "evaluate/a/test-greedy.tsv", 10.0, 12.0, 700.0)
    write_record(tmp_path / "evaluate/b/test-greedy.tsv", 20.0, 25.0, 800.0)
    short = BenchmarkRecord(running_time=0.2)  # ended before Snakemake could sample it
    write_benchmark_records([short], str(tmp_path / "summarize.tsv"), False)

    table = rule_table(read_benchmarks(tmp_path)).set_index("rule")

    assert list(table.index) == ["train_clip", "evaluate", "summarize", "total"]
    assert table.loc["evaluate", ["jobs", "wall_sum_s", "wall_max_s", "cpu_sum_s"]].tolist() == [
        2, 30.0, 20.0, 37.0]
    assert table.loc["evaluate", "max_rss_mb"] == 800.0
    assert pd.isna(table.loc["summarize", "cpu_sum_s"]) or table.loc["summarize", "cpu_sum_s"] == 0
    assert table.loc["total", "jobs"] == 4 and table.loc["total", "wall_sum_s"] == 330.2
    text = markdown(table.reset_index())
    assert "| evaluate | 2 | 30.0 | 20.0 | 37.0 | 25.0 | 800 |" in text
