"""Training objectives, one per run `method`, looked up by name in `METHODS`.

A method is three files: its facts (a class in distinctcap.methods.facts, registered once in
`facts.FACTS`, torch-free), its objective (a module here subclassing them, which the facts name
by `objective_class`) and its options' schema (workflow/schemas/methods/<method>.yaml); the contract
is distinctcap.methods.base.Objective.

`METHODS` is derived from `FACTS` on first access (PEP 562 module `__getattr__`): the method
modules import torch, and this package is also imported, through `facts`, while the workflow
is parsed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distinctcap.methods.base import Objective

    METHODS: dict[str, type[Objective]]


def __getattr__(name: str) -> dict[str, type[Objective]]:
    if name != "METHODS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from distinctcap.methods.facts import FACTS

    methods = {method: facts.trainable() for method, facts in FACTS.items()}
    globals()["METHODS"] = methods  # later lookups find the dict itself
    return methods
