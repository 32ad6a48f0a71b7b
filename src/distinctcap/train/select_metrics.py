"""The names `train.select_metric` may take and which way each is better, read without torch
(the config checks run while Snakemake parses the workflow).

This is the one list: the trainer keys its metric functions by it
(distinctcap.train.selection.VAL_METRICS), the config checker validates a run's
`train.select_metric` against `select_metrics_of(method)` and fills the schema's enum from
`all_select_metrics()` (distinctcap.config.check). A method's own metrics, computed by its
objective, are its facts' `val_metrics` (distinctcap.methods.facts).
"""

from __future__ import annotations

from distinctcap.methods.facts import FACTS

# Metrics every method has: name -> "min" | "max", the better direction
SELECT_METRICS: dict[str, str] = {
    "val_loss": "min",
    "self_retrieval": "max",
    "cider": "max",
    "oracle_cider": "max",
    "sample_cider": "max",
}


def select_metrics_of(method: str) -> dict[str, str]:
    """The metrics a run of `method` may select on: every method's and its own."""
    own = FACTS[method].val_metrics if method in FACTS else {}
    return {**SELECT_METRICS, **own}


def all_select_metrics() -> list[str]:
    """Every name `train.select_metric` may take for some method (the schema's enum)."""
    names = dict.fromkeys(SELECT_METRICS)
    for facts in FACTS.values():
        names.update(dict.fromkeys(facts.val_metrics))
    return list(names)
