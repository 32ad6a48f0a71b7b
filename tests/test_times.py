"""The per-rule time table (distinctcap.report.times) and the benchmark file of every rule."""

import re

import pandas as pd
from conftest import ROOT
from snakemake.benchmark import BenchmarkRecord, write_benchmark_records

from distinctcap.report.timeline import idle_spells, plot_timeline, read_jobs, summary
from distinctcap.report.timeline import main as timeline_main
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


# A Snakemake 9 log as it writes one (`--cores 2`): a 2-thread job, then two 1-thread jobs
# side by side, one of them beside an idle core; a job still running at the end.
SNAKEMAKE_LOG = """\
Provided cores: 2
Rules claiming more threads will be scaled down.
[Sat Nov 28 10:35:13 2026]
localrule prepare_data:
    output: results/data/images.parquet
    jobid: 1
    resources: tmpdir=/tmp
[Sat Nov 28 10:35:21 2026]
Finished jobid: 1 (Rule: prepare_data)
1 of 5 steps (20%) done
[Sat Nov 28 10:35:21 2026]
rule retrieval_entropy:
    jobid: 3
    threads: 2
[Sat Nov 28 10:35:31 2026]
Finished jobid: 3 (Rule: retrieval_entropy)
[Sat Nov 28 10:35:31 2026]
rule train_run:
    jobid: 4
    wildcards: run=reference
[Sat Nov 28 10:35:31 2026]
rule train_run:
    jobid: 5
    wildcards: run=teacher_neg
[Sat Nov 28 10:35:51 2026]
Finished jobid: 5 (Rule: train_run)
[Sat Nov 28 10:36:11 2026]
Finished jobid: 4 (Rule: train_run)
[Sat Nov 28 10:36:11 2026]
rule evaluate:
    jobid: 6
    wildcards: run=reference
"""


def test_the_timeline_reads_each_job_and_the_idle_cores(tmp_path):
    log = tmp_path / "run.snakemake.log"
    log.write_text(SNAKEMAKE_LOG)

    jobs, cores = read_jobs(log)

    assert cores == 2
    assert jobs[["rule", "wildcards", "threads", "start_s"]].values.tolist() == [
        ["prepare_data", "", 1, 0.0], ["retrieval_entropy", "", 2, 8.0],
        ["train_run", "run=reference", 1, 18.0], ["train_run", "run=teacher_neg", 1, 18.0],
        ["evaluate", "run=reference", 1, 58.0]]
    assert jobs["end_s"].tolist()[:4] == [8.0, 18.0, 58.0, 38.0] and pd.isna(jobs["end_s"].iloc[4])
    # 0-8 s one of two cores, 8-38 s both, 38-58 s one: 2 x 58 core-s, 28 of them idle
    stats = summary(jobs, cores)
    assert stats["wall_s"] == 58.0 and stats["core_s_idle"] == 28.0
    assert stats["busy_fraction"] == (116 - 28) / 116
    spells = idle_spells(jobs, cores, min_s=10)
    assert spells[["from_s", "to_s", "running"]].values.tolist() == [[38.0, 58.0, "train_run"]]
    plot_timeline(jobs, cores, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_the_timeline_command_names_a_folder_without_a_log(tmp_path, capsys):
    assert timeline_main([str(tmp_path)]) == 2
    assert "no Snakemake log under" in capsys.readouterr().err


def test_the_timeline_command_reads_the_newest_log_that_ran_jobs(tmp_path, capsys):
    """`make run` ends with the report's build, whose Snakemake log is newer and has no job."""
    logs = tmp_path / ".snakemake" / "log"
    logs.mkdir(parents=True)
    (logs / "2026-11-28T115050.snakemake.log").write_text(SNAKEMAKE_LOG)
    report = "Building DAG of jobs...\nCreating report...\n"
    (logs / "2026-11-28T120232.snakemake.log").write_text(report)

    assert timeline_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2026-11-28T115050.snakemake.log: 5 jobs on 2 cores, 58 s wall" in out
