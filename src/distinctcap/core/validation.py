"""Validation against the config schema (distinctcap.core.schema) and its messages: every error
is one line that names the dotted key, what is wrong and what is allowed.

`schema_checked(config, schema, sources)` fills the schema's defaults and raises the first
error (the deepest key first), starting with the file that set the key; `check_against` checks
one section or run block against its part of the schema; `check_finite` refuses NaN and
infinities, which pass the schema's bounds. What the schema cannot express about runs, seeds
and other stages' facts is checked above (distinctcap.config.check).

Imports no torch: the workflow calls it while Snakemake parses.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Iterable, Sequence

import jsonschema

from distinctcap.core.configfile import key_origin
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.schema import method_names, method_options

# what the schema's definitions/name (config.schema.yaml) allows, in words
NAME_RULE = "a letter or digit, then letters, digits, '_' and '-' (at most 64 characters)"


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


def schema_checked(config: dict, schema: dict, sources: Sequence[tuple[str, dict]] = ()) -> dict:
    """A copy of `config` with the schema's defaults filled; a DistinctcapError if it breaks the
    schema or holds a number that is not finite. `sources` are the (file name, content) pairs
    `config` was merged from, in order: the error then starts with the name of the last one
    that sets the key (distinctcap.core.configfile.config_sources)."""
    config = copy.deepcopy(config)
    errors = sorted(DefaultFilling(schema).iter_errors(config), key=_error_depth)
    if errors:
        origin = key_origin(error_key(errors[0]), sources)
        raise DistinctcapError((f"{origin}: " if origin else "") + describe(errors[0]))
    check_finite(config)
    return config


def check_finite(value: object, key: str = "") -> None:
    """Every number in the config is finite: YAML's .nan and .inf pass the schema's bounds
    (NaN compares false with all of them) and would fail a job later, naming no key."""
    if isinstance(value, dict):
        for name, item in value.items():
            check_finite(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_finite(item, f"{key}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise DistinctcapError(f"{key} = {value!r} is not a finite number; give a number")


def check_section(values: dict, schema: dict, path: list[str]) -> None:
    """Validate `values` against the section of `schema` at `path` (run blocks use the
    top-level section of their last key), with the error naming the full dotted key."""
    check_against(values, schema["properties"][path[-1]], schema, path)


def check_against(values: dict, part: dict, schema: dict, path: list[str]) -> None:
    """Validate `values` against `part` of `schema`, the error naming the dotted key from
    `path` on."""
    part = {**part, "definitions": schema.get("definitions", {})}
    errors = sorted(jsonschema.Draft7Validator(part).iter_errors(values), key=str)
    if errors:
        errors[0].path.extendleft(reversed(path))
        raise DistinctcapError(describe(errors[0]))


def error_key(error: jsonschema.ValidationError) -> list[str]:
    """The key path an error is about: the unknown key itself for additionalProperties."""
    path = [str(p) for p in error.absolute_path]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = error.schema.get("properties", {})
        extra = sorted(set(error.instance) - set(allowed))
        return path + extra[:1]
    return path


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
        in_run = len(error.absolute_path) == 2 and error.absolute_path[0] == "runs"
        foreign = _foreign_option(key, extra[0], error.instance) if in_run else None
        return foreign or unknown_key(key if error.absolute_path else "", extra, allowed)
    if error.validator == "enum":
        text = f"{key} = {error.instance!r} is not allowed; choose one of {schema['enum']}"
        run_method = list(error.absolute_path)[::2] == ["runs", "method"]
        plugin = " (a plugin's method is listed once its package is installed in this Python)"
        return text + (plugin if run_method else "")
    if error.validator == "type":
        return f"{key} = {error.instance!r} has the wrong type; expected {schema['type']}"
    if "propertyNames" in error.schema_path:
        return (
            f"{key}: name {error.instance!r} is not allowed; names are used in file and folder "
            f"names, so use {NAME_RULE}"
        )
    if error.validator == "minProperties" and not error.instance:
        return f"{key} is empty; define at least one entry"
    if error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{key} = {error.instance!r}: {error.message}"
    return f"{key}: {error.message}"


def unknown_key(where: str, extra: list[str], allowed: list[str]) -> str:
    """Key `extra[0]` is not one of `allowed` at `where` (a dotted key, or "" at the top)."""
    prefix = f"{where}." if where else ""
    suggestion = did_you_mean(extra[0], allowed)
    return f"unknown key {prefix}{extra[0]}; {suggestion}allowed keys here: {', '.join(allowed)}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """"did you mean X? " for the closest of `choices` to a misspelt `word`, else ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"did you mean {close[0]}? " if close else ""


def _foreign_option(where: str, key: str, run: dict) -> str | None:
    """Run block `where` sets `key`, an option of other methods than its own: name them (each
    method's options are its schema's, workflow/schemas/methods/<method>.yaml)."""
    owners = [method for method in method_names() if key in method_options(method)]
    if not owners:
        return None
    method = run["method"]
    own = ", ".join(sorted(method_options(method))) or "none"
    name = where.removeprefix("runs.")
    return (
        f"{where}.{key} is an option of {' / '.join(owners)} runs; run {name!r} has method "
        f"{method!r}, whose options are: {own}"
    )
