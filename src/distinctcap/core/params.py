"""What a rule records for Snakemake's params trigger: only what changes its result (issue 47).

Snakemake reruns a job whose recorded params differ from the new ones, comparing the `repr` of
each param. A rule that passed a whole config section reran whenever a release added a key with
a default, though nothing about its result changed. So each rule records a canonical form of
its settings (`canonical_params`): every key whose value equals its schema default is left out
(recursively) and keys are sorted, so a new key at its default, or a key set explicitly to its
default, records the same value. The full settings still reach the script, as a param derived
from the rule's input, which Snakemake does not record (common.smk `unrecorded`).

A default is a fact about results too: a release that changes one, or changes what a stage
computes on purpose, raises that stage's entry in STAGE_VERSIONS (the one owner) and names it
in CHANGELOG.md. The version enters the stage's params only when it is not 1, so introducing
it retrained nothing. Imports no torch (the workflow reads it while Snakemake parses).
"""

from __future__ import annotations

import copy

from distinctcap.core.validation import DefaultFilling

# stage (rule) -> version of what it computes from the same inputs and settings; raise it when
# a release changes a stage's results on purpose (or a default it reads), and say so in
# CHANGELOG.md. Every job of the stage and everything downstream reruns once.
STAGE_VERSIONS = {
    "prepare_data": 1,
    "train_clip": 1,
    "extract_features": 1,
    "train_run": 1,
    "run_card": 1,
    "decode": 1,
    "evaluate": 3,
    "summarize": 2,  # summary.csv keeps CIDErBtw and DisWordRate (issue 58)
}


def stage_version(stage: str) -> dict:
    """The version param of `stage`: none at version 1. Snakemake records params by value,
    not by name, so the value names the stage (a bare 2 would equal another param's 2)."""
    version = STAGE_VERSIONS[stage]
    return {} if version == 1 else {"stage_version": f"{stage} version {version}"}


def canonical_params(value: object, defaults: object) -> object:
    """`value` without the keys of its dicts (at any depth) whose value equals the same key's
    in `defaults`, with every dict's keys sorted, so that its repr is the same whatever
    defaulted keys a release adds and whatever order the config lists its keys in."""
    if isinstance(value, dict):
        known = defaults if isinstance(defaults, dict) else {}
        return {
            key: canonical_params(value[key], known.get(key))
            for key in sorted(value, key=str)
            if not (key in known and _same(value[key], known[key]))
        }
    if isinstance(value, (list, tuple)):
        return type(value)(canonical_params(v, None) for v in value)
    return value


def _same(value: object, default: object) -> bool:
    return (
        type(value) is type(default)
        and value == default
        or (
            isinstance(value, (int, float))
            and isinstance(default, (int, float))
            and not isinstance(value, bool)
            and not isinstance(default, bool)
            and value == default
        )
    )


def filled(instance: object, part: dict, schema: dict) -> object:
    """`instance` with the defaults of schema `part` filled in (at any depth, in the branches
    its values select); values that do not validate are left as they are."""
    instance = copy.deepcopy(instance)
    for _ in DefaultFilling({**part, "definitions": schema.get("definitions", {})}).iter_errors(
        instance
    ):
        pass
    return instance


class Defaults:
    """The schema defaults each rule's settings are compared against, from the merged schema."""

    def __init__(self, schema: dict):
        self.schema = schema
        self.config = filled({}, schema, schema)  # every section at its defaults

    def section(self, *keys: str) -> object:
        """The defaults of the config at `keys` (e.g. "clip", "train")."""
        value = self.config
        for key in keys:
            value = value.get(key, {}) if isinstance(value, dict) else {}
        return value

    def run_block(self, block: dict) -> dict:
        """The defaults of a `runs:` block of `block`'s method (the method's own options)."""
        part = self.schema["properties"]["runs"]["additionalProperties"]
        defaults = filled({"method": block.get("method")}, part, self.schema)
        return {k: v for k, v in defaults.items() if k != "method"}  # no default: kept

    def effective_run(self, effective: dict) -> dict:
        """The defaults of an effective run config (config.rungraph.effective_run_config)."""
        return {
            **self.run_block(effective),
            "seed": self.config.get("seed"),
            "captioner": self.section("captioner"),
            "train": self.section("train"),
        }

    def judge(self) -> dict:
        """The defaults of an evaluate.judge block (every key but `arch`, which has none)."""
        return filled({"evaluate": {"judge": {}}}, self.schema, self.schema)["evaluate"]["judge"]

    def decoding(self, setting: dict) -> dict:
        """The defaults of a `decoding:` entry of `setting`'s kind."""
        part = self.schema["properties"]["decoding"].get("additionalProperties", {})
        defaults = filled({"kind": setting.get("kind")}, part, self.schema)
        return {k: v for k, v in defaults.items() if k != "kind"}  # no default: kept

    def runs(self, runs: dict) -> dict:
        """A `runs:` mapping in canonical form, each block against its method's defaults."""
        return {
            name: canonical_params(block, self.run_block(block)) for name, block in runs.items()
        }

    def decodings(self, decodings: dict) -> dict:
        """A `decoding:` mapping in canonical form."""
        return {
            name: canonical_params(setting, self.decoding(setting))
            for name, setting in decodings.items()
        }
