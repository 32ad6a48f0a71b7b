"""The config schema, the one owner of every config key, default and allowed value: the files
merged into one JSON schema, and the defaults they declare, from which the settings classes
(distinctcap.core.settings) take their field defaults and each method's facts
(distinctcap.methods.facts) its options.

Files: config.schema.yaml (top-level keys), sections/<name>.yaml (top-level section <name>),
methods/<method>.yaml (the options of the runs with `method: <method>`). They ship inside the
package (src/distinctcap/schemas/, package data), so an installed distinctcap finds them;
workflow/schemas is a link to that folder, which the workflow reads. A method plugin's options
schema (distinctcap.core.plugins) joins them like a built-in's; a plugin whose name is a
built-in's, or without its file, is left out here and named by distinctcap.methods.facts'
registry check. Imports no torch: the workflow reads it while Snakemake parses.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import yaml

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.plugins import MethodPlugin, method_plugins

# The package's schema (package data; workflow/schemas links to its folder)
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
# libyaml's loader where installed: ten times faster, and every Snakemake parse loads the schema
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_schema(path: str | os.PathLike = SCHEMA_PATH) -> dict:
    """The main schema with each `sections/<name>.yaml` beside it as top-level property <name>,
    and each run block closed over its own method's options (`run_block`)."""
    path = Path(path)
    schema = _read(path)
    for section in sorted((path.parent / "sections").glob("*.yaml")):
        schema["properties"][section.stem] = _read(section)
    runs = schema["properties"]["runs"]
    runs["additionalProperties"] = run_block(runs["additionalProperties"], _methods(path.parent))
    return schema


def run_block(common: dict, methods: dict[str, dict]) -> dict:
    """The schema of a run block: the keys every run has (`common`), `method` one of `methods`,
    then that method's options and no others. Draft 7 has no unevaluatedProperties, so each
    method's branch lists the common keys again to close the block."""
    block = copy.deepcopy(common)
    block["properties"]["method"]["enum"] = list(methods)
    block["allOf"] = [
        {
            "if": {"properties": {"method": {"const": name}}, "required": ["method"]},
            "then": {
                "description": method.get("description", ""),
                "properties": {**block["properties"], **method["properties"]},
                "additionalProperties": False,
            },
        }
        for name, method in methods.items()
    ]
    return block


@functools.cache
def repo_schema() -> dict:
    """The package's merged schema, loaded once; read it, never change it."""
    if not SCHEMA_PATH.is_file():
        raise DistinctcapError(
            f"the config schema {SCHEMA_PATH} is missing from the installed package: "
            "reinstall distinctcap (its schemas/ folder is package data)"
        )
    return load_schema()


def schema_default(*keys: str) -> object:
    """The repository schema's default of the key at `keys` (e.g. "train", "steps"); a copy."""
    node = repo_schema()
    for key in keys:
        node = node["properties"][key]
    return copy.deepcopy(node["default"])


def method_options(method: str) -> Mapping[str, object]:
    """The options of `method` runs with their defaults, in the schema's order."""
    properties = _repo_methods()[method]["properties"]
    return MappingProxyType({key: prop["default"] for key, prop in properties.items()})


def method_names() -> list[str]:
    """The methods with an options schema (workflow/schemas/methods/<method>.yaml, sorted, then
    the plugins' in name order)."""
    return list(_repo_methods())


@functools.cache
def _repo_methods() -> dict[str, dict]:
    return _methods(SCHEMA_PATH.parent)


def _methods(folder: Path) -> dict[str, dict]:
    """The built-in methods' options schemas in `folder`/methods, then the usable plugins'."""
    methods = {f.stem: _read(f) for f in sorted((folder / "methods").glob("*.yaml"))}
    for plugin in usable_plugins(builtin_method_names()):
        methods[plugin.name] = _read(plugin.schema_file())
    return methods


@functools.cache
def builtin_method_names() -> tuple[str, ...]:
    """The methods whose options schema ships in this package, sorted."""
    return tuple(f.stem for f in sorted((SCHEMA_PATH.parent / "methods").glob("*.yaml")))


def usable_plugins(builtins: tuple[str, ...]) -> list[MethodPlugin]:
    """The plugins whose name no built-in and no other plugin has, with their schema file."""
    plugins = method_plugins()
    names = [plugin.name for plugin in plugins]
    return [
        plugin for plugin in plugins
        if plugin.name not in builtins and names.count(plugin.name) == 1
        and (plugin.schema_file() or Path()).is_file()
    ]  # fmt: skip


def _read(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_LOADER)
