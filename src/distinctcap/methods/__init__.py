"""Training objectives, one per run `method`, looked up by name in `METHODS`.

A method is its facts (distinctcap.methods.facts, one class per method, torch-free) and its
loss (one module here subclassing them); the contract is distinctcap.methods.base.Objective.
A new method is a facts class in `facts.FACTS`, a module here, and one entry below.

`METHODS` is built on first access (PEP 562 module `__getattr__`): the method modules import
torch, and this package is also imported, through `facts`, while the workflow is parsed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distinctcap.methods.base import Objective

    METHODS: dict[str, type[Objective]]


def __getattr__(name: str) -> dict[str, type[Objective]]:
    if name != "METHODS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from distinctcap.methods.cl import ContrastiveLearning
    from distinctcap.methods.mle import MLE
    from distinctcap.methods.scst import SCST
    from distinctcap.methods.smile import SMILE
    from distinctcap.methods.specificity import Specificity
    from distinctcap.methods.unkt import UNKT

    methods = {
        "mle": MLE,
        "unkt": UNKT,
        "cl": ContrastiveLearning,
        "smile": SMILE,
        "specificity": Specificity,
        "scst": SCST,
    }
    globals()["METHODS"] = methods  # later lookups find the dict itself
    return methods
