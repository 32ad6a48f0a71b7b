"""Config validation: JSON schema with defaults, then the run graph (DESIGN.md, "Runs are data").

`validate(config, schema_path)` fills defaults from the schema and raises one DistinctcapError
that names the key and what is allowed: a wrong type, an unknown key, an unknown run method,
a run naming a missing `init`/`teacher`/`reference`, or a cycle among runs.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import yaml

from distinctcap.errors import DistinctcapError

RUN_EDGES = ("init", "teacher", "reference")
REQUIRED_EDGES = {"mle": (), "unkt": ("teacher",), "cl": ("init", "reference"),
                  "smile": ("init",), "specificity": ("init",)}


def _fill_defaults(validator_class):
    """A validator that sets each missing property's schema default before validating it."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


DefaultFilling = _fill_defaults(jsonschema.Draft7Validator)


def load_schema(path: str | os.PathLike) -> dict:
    """The main schema with each `sections/<name>.yaml` beside it as top-level property <name>."""
    path = Path(path)
    schema = yaml.safe_load(path.read_text())
    for section in sorted((path.parent / "sections").glob("*.yaml")):
        schema["properties"][section.stem] = yaml.safe_load(section.read_text())
    return schema


def validate(config: dict, schema: dict) -> dict:
    """Return a copy of `config` with defaults filled; raise DistinctcapError if it is invalid."""
    config = copy.deepcopy(config)
    errors = sorted(DefaultFilling(schema).iter_errors(config), key=_error_depth)
    if errors:
        raise DistinctcapError(describe(errors[0]))
    check_runs(config.get("runs", {}))
    check_values(config)
    return config


def _error_depth(error: jsonschema.ValidationError) -> tuple:
    """Deepest key first; an empty section (e.g. no runs yet) only when nothing else is wrong."""
    return (error.validator == "minProperties", -len(error.absolute_path), str(error.absolute_path))


def describe(error: jsonschema.ValidationError) -> str:
    """One line: the key's dotted path, what is wrong and what is allowed."""
    key = ".".join(str(p) for p in error.absolute_path) or "<top level>"
    schema = error.schema
    if error.validator == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        where = f"{key}." if error.absolute_path else ""
        return f"unknown key {where}{extra[0]}; allowed keys here: {', '.join(allowed)}"
    if error.validator == "enum":
        return f"{key} = {error.instance!r} is not allowed; choose one of {schema['enum']}"
    if error.validator == "type":
        return f"{key} = {error.instance!r} has the wrong type; expected {schema['type']}"
    if error.validator == "pattern" and "propertyNames" in error.schema_path:
        return (
            f"{key}: name {error.instance!r} is not allowed; names are used as folder names, "
            f"so use letters, digits, '_' and '-' only"
        )
    if error.validator == "minProperties" and not error.instance:
        return f"{key} is empty; define at least one entry"
    if error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{key} = {error.instance!r}: {error.message}"
    return f"{key}: {error.message}"


def check_runs(runs: dict) -> None:
    """Every init/teacher/reference names a defined run, and the runs form no cycle."""
    for name, run in runs.items():
        for edge in REQUIRED_EDGES.get(run.get("method"), ()):
            if not run.get(edge):
                raise DistinctcapError(
                    f"runs.{name}.{edge} is required for method {run['method']!r}: "
                    f"name one of the runs {', '.join(sorted(runs))}"
                )
        for edge in RUN_EDGES:
            target = run.get(edge)
            if target is not None and target not in runs:
                raise DistinctcapError(
                    f"runs.{name}.{edge} = {target!r} names no run; defined runs: "
                    f"{', '.join(sorted(runs))}"
                )
    for name in runs:
        cycle = _find_cycle(runs, name, [])
        if cycle:
            raise DistinctcapError(f"runs form a cycle: {' -> '.join(cycle)}")


def _find_cycle(runs: dict, name: str, path: list[str]) -> list[str] | None:
    if name in path:
        return path[path.index(name):] + [name]
    for target in run_dependencies(runs[name]):
        cycle = _find_cycle(runs, target, path + [name])
        if cycle:
            return cycle
    return None


def run_dependencies(run: dict) -> Iterator[str]:
    """The runs this run needs trained first (its DAG edges)."""
    for edge in RUN_EDGES:
        if run.get(edge):
            yield run[edge]


def check_values(config: dict) -> None:
    """Checks the schema cannot express."""
    fraction = config.get("entropy", {}).get("fraction")
    if fraction is not None and not 0 < fraction < 1:
        raise DistinctcapError(
            f"entropy.fraction = {fraction} leaves D- or D+ empty; choose 0 < fraction < 1"
        )


def load(config_path: str | os.PathLike, schema_path: str | os.PathLike) -> dict:
    with open(config_path) as f:
        return validate(yaml.safe_load(f) or {}, load_schema(schema_path))
