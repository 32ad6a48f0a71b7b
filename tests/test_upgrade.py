"""Results survive upgrades (issue 47): on a copy of the shared tiny run, a release that adds
keys with defaults plans nothing, and one run's edited lr reruns that run and what reads it,
as `snakemake -n` and `distinctcap plan` both say. Dry runs only."""

import copy
import re
import shutil

import pytest
import yaml
from conftest import snakemake

from distinctcap.core.params import STAGE_VERSIONS, canonical_params, stage_version
from distinctcap.runs.plan import plan


def jobs_planned(result) -> dict[str, int]:
    """Rule -> count from the `Job stats` table of a snakemake dry run (none: {})."""
    if "Job stats:" not in result.stdout:
        return {}
    table = result.stdout.split("Job stats:")[1].split("\n\n")[0]
    return {
        m[1]: int(m[2])
        for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)
        if m[1] not in ("total", "all")
    }


def add_key(schema_file, key: str, spec: dict, *where: str) -> None:
    """Add property `key` to the part of a schema file at keys `where` (none: its top)."""
    schema = yaml.safe_load(schema_file.read_text())
    part = schema
    for name in where:
        part = part[name]
    part.setdefault("properties", {})[key] = spec
    schema_file.write_text(yaml.safe_dump(schema, sort_keys=False))


def test_canonical_params_drop_defaults_and_order():
    defaults = {"train": {"lr": 0.001, "steps": 1500}, "seed": 0}
    assert canonical_params({"seed": 0, "train": {"steps": 20, "lr": 0.001}}, defaults) == {
        "train": {"steps": 20}
    }
    # a key explicitly at its default, or a new defaulted one: the same record
    a = canonical_params({"train": {"steps": 20}}, defaults)
    b = canonical_params({"train": {"lr": 1e-3, "steps": 20, "new": None}}, {**defaults,
                         "train": {**defaults["train"], "new": None}})  # fmt: skip
    assert repr(a) == repr(b)
    assert canonical_params({"a": True}, {"a": 1}) == {"a": True}  # True is not 1
    assert repr(canonical_params({"b": 1, "a": 2}, {})) == "{'a': 2, 'b': 1}"


def test_stage_version_enters_params_only_past_one(monkeypatch):
    assert all(stage_version(s) == {} for s, v in STAGE_VERSIONS.items() if v == 1)
    assert stage_version("evaluate") == {"stage_version": "evaluate version 3"}  # CIDErBtw
    assert stage_version("summarize") == {"stage_version": "summarize version 2"}  # its columns
    monkeypatch.setitem(STAGE_VERSIONS, "train_run", 2)
    assert stage_version("train_run") == {"stage_version": "train_run version 2"}


@pytest.mark.slow
def test_upgrades_rerun_nothing_and_edits_rerun_their_runs(tiny_dag, tmp_path):
    """A release that adds defaulted keys (a data option, an mle option) to a finished tiny
    run's workflow plans nothing; then teacher_neg's lr reruns teacher_neg, unkt (its
    teacher edge), their decodes, cards and evaluations, and the reports: nothing else."""
    shared, config = tiny_dag
    workdir = shutil.copytree(shared, tmp_path / "run", symlinks=True)
    config = copy.deepcopy(config)
    schemas = workdir / "workflow" / "schemas"
    spec = {"type": ["number", "null"], "default": None, "description": "a new option"}
    sections = schemas / "sections"
    add_key(sections / "data.yaml", "new_data_option", spec)
    add_key(sections / "data.yaml", "new_shapes_option", spec, "properties", "shapes")
    add_key(schemas / "methods" / "mle.yaml", "new_mle_option", {**spec, "default": 0.5})
    add_key(sections / "captioner.yaml", "new_captioner_option", spec)
    add_key(sections / "decoding.yaml", "new_decoding_option", spec, "additionalProperties")
    add_key(sections / "evaluate.yaml", "new_metric_option", spec)
    # the keys really are in the copy's schema: a wrong value of one is refused
    bad = {**config, "data": {**config["data"], "new_data_option": "not a number"}}
    refused = snakemake(workdir, "-n", config=bad)
    assert refused.returncode != 0 and "new_data_option" in refused.stderr, refused.stderr
    upgraded = snakemake(workdir, "-n", config=config)
    assert upgraded.returncode == 0, upgraded.stderr[-3000:]
    assert "Nothing to be done" in upgraded.stdout, upgraded.stdout[-3000:]
    assert plan(workdir) == ["nothing to redo"]
    # a key set explicitly to its default is no change either
    config["train"] = {**config["train"], "lr": 0.001}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    assert plan(workdir) == ["nothing to redo"]

    config["runs"]["teacher_neg"] = {**config["runs"]["teacher_neg"], "train": {"lr": 0.002}}
    edited = snakemake(workdir, "-n", config=config)
    per_run = {"train_run": 2, "decode": 2, "run_card": 2, "evaluate": 2}
    reports = ["summarize", "report_tables", "versus_reference", "report_plots"]
    reports += ["report_gallery", "report_times"]
    assert jobs_planned(edited) == per_run | dict.fromkeys(reports, 1), edited.stdout[-4000:]
    lines = plan(workdir)
    trainings = next(line for line in lines if line.startswith("2 trainings:"))
    assert "train.lr changed in run teacher_neg" in trainings, lines
    assert "unkt" in trainings, lines


DRY_RUN = """
[Sat Nov 28 05:27:54 2026]
rule train_run:
    input: results/data/captions.parquet, results/runs/reference/model.pt
    output: results/runs/cl/model.pt
    jobid: 7
    reason: {reason}
    wildcards: run=cl
    resources: tmpdir=/tmp

[Sat Nov 28 05:27:54 2026]
rule neighbours:
    output: results/neighbours/train_top1pct.parquet
    reason: Missing output files: results/neighbours/train_top1pct.parquet
    wildcards: pct=1
"""


def test_plan_names_changed_keys_and_older_records():
    from distinctcap.config.check import load_schema
    from distinctcap.core.params import Defaults
    from distinctcap.runs.plan import PARAMS, describe, parse_jobs

    full = {"name": "cl", "method": "cl", "init": "reference", "seed": 0,
            "captioner": {"width": 128}, "train": {"lr": 0.001, "steps": 20}}  # fmt: skip
    record = {"init": "reference", "method": "cl", "name": "cl", "train": {"steps": 20}}

    def lines(before, now):
        reason = f"{PARAMS}before: {before!r} now: {now!r} "
        return describe(parse_jobs(DRY_RUN.format(reason=reason)), Defaults(load_schema()))

    edited = {**record, "train": {"lr": 0.002, "steps": 20}}
    assert lines(record, edited) == [
        "1 training: train.lr changed in run cl",
        "1 neighbours job: outputs missing (pct=1)",
    ]
    # a record of an older release (the full settings, a key at its default included), same
    # settings
    older = {**full, "train": {**full["train"], "checkpoint_minutes": 5}}
    assert lines(older, record)[0] == (
        "1 training: settings unchanged, recorded by an older release in run cl"
    )
    assert lines("/abs/path/clip.pt", "")[0].startswith("1 training: other settings changed")
    # only the records' form changed: plan says so last, and --adopt may touch
    assert lines(older, record)[-1].startswith("no setting changed, only the form")
    assert not lines(record, edited)[-1].startswith("no setting changed")
