"""The work budget (issue 46): each training run records its work in summary.json, each
evaluate job in work.json, and the shared tiny run's records must equal tests/work_budget.json;
a deliberately added validation pass fails the comparison, one line per differing entry."""

from __future__ import annotations

import json

import pytest
from test_train import tiny_cfg, tiny_data
from train_job import fit

from distinctcap.core import work
from distinctcap.core.errors import DistinctcapError
from distinctcap.runs.budget import (
    BUDGET,
    budget_message,
    differences,
    read_budget,
    updated_budget,
    work_record,
)
from distinctcap.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_counts_go_to_the_innermost_open_block_and_nowhere_outside_one():
    work.count("decoded", 5)  # no block open: nothing to count into, no error
    with work.counting() as run:
        work.count("steps")
        with work.counting() as validation:
            work.count("decoded", 3)
        work.count("decoded", 2)
    assert run == {"steps": 1, "decoded": 2} and validation == {"decoded": 3}


def test_a_training_run_records_its_work_where_it_is_done(tmp_path):
    # 32 captions of 8 images, batches of 8 (2 images x 4 captions): 12 steps are 3 epochs,
    # each caption 3 times. Caption (i, j) has 2 + (i + j) % 4 tokens and an eos: 14 + 4 label
    # tokens an image, 144 an epoch. Validation every 4 steps on the 8 validation captions.
    result = fit(tiny_cfg(tmp_path, steps=12, val_every=4, select_metric="cider"), tiny_data())
    assert result.work == {
        "examples": 96,
        "steps": 12,
        "tokens": 432,
        "validations": [
            # val_loss teacher-forces the 8 captions; cider decodes the 2 images greedily
            {"step": s, "metrics": ["val_loss", "cider"], "teacher_forced": 8, "decoded": 2,
             "cider_scored": 2}
            for s in (4, 8, 12)
        ],
    }  # fmt: skip
    assert json.loads((tmp_path / "summary.json").read_text())["work"] == result.work


def budget_run(tmp_path, name: str) -> dict:
    """A tiny MLE run written as an experiment folder's results/runs/tiny, and its record."""
    out = tmp_path / name / "results" / "runs" / "tiny"
    fit(tiny_cfg(out, steps=12, val_every=6), tiny_data())
    return work_record(tmp_path / name)


def test_a_deliberately_added_validation_pass_fails_the_budget(tmp_path, monkeypatch):
    budget = updated_budget(budget_run(tmp_path, "before"), {}, "the first record")
    assert differences(budget_run(tmp_path, "again"), budget) == []

    due = Trainer._due

    def one_more_validation(self):  # the change a careless commit could make
        do_val, do_log, do_checkpoint = due(self)
        extra = self.state.step == 1
        return do_val or extra, do_log or extra, do_checkpoint

    monkeypatch.setattr(Trainer, "_due", one_more_validation)
    lines = differences(budget_run(tmp_path, "after"), budget)
    assert lines == [
        "train.tiny.validation.passes: 3, budget 2",
        "train.tiny.validation.steps: '1,6,12', budget '6,12'",
        "train.tiny.validation.teacher_forced: 24, budget 16",
    ]
    message = budget_message(lines)
    assert "update the budget in the same commit with its reason" in message
    assert "--write-budget" in message


def test_rewriting_the_budget_keeps_the_reasons_of_unchanged_entries():
    budget = {"a": {"value": 1, "reason": "old"}, "b": {"value": 2, "reason": "old"}}
    record = {"a": 1, "b": 3, "c": 4}
    assert updated_budget(record, budget, "issue 46: more work") == {
        "a": {"value": 1, "reason": "old"},
        "b": {"value": 3, "reason": "issue 46: more work"},
        "c": {"value": 4, "reason": "issue 46: more work"},
    }
    with pytest.raises(DistinctcapError, match="give --reason"):
        updated_budget(record, budget, None)
    assert differences({"a": 1}, budget) == ["b: not done, budget 2"]


def test_the_shared_tiny_run_does_exactly_the_budgeted_work(tiny_dag):
    workdir, _ = tiny_dag
    lines = differences(work_record(workdir), read_budget(BUDGET))
    assert not lines, budget_message(lines, workdir)
