"""Reading config files: a YAML error named with its file, line and column; the files merged as
Snakemake merges --configfile; and which file (or --config) set a key, for the validation's
error message (distinctcap.core.validation).

Imports no torch: the Snakefile and the workflow read it while Snakemake parses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import yaml

from distinctcap.core.errors import DistinctcapError


def read_yaml(path: str | os.PathLike) -> object:
    """A config or preset file; a YAML syntax error is one line naming the file, line and
    column (Snakemake's own message names neither: "Config file is not valid JSON or YAML")."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DistinctcapError(f"cannot read the config file {path}: {error}") from error
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        raise DistinctcapError(f"{path}{_yaml_error_text(error)}") from error
    except yaml.YAMLError as error:
        raise DistinctcapError(f"{path}: not valid YAML: {error}") from error


def _yaml_error_text(error: yaml.MarkedYAMLError) -> str:
    """", line L, column C: not valid YAML: <problem> (<context> at line L', column C')"."""

    def at(mark) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    mark = error.problem_mark or error.context_mark
    text = f", {at(mark)}" if mark else ""
    text += f": not valid YAML: {error.problem or error.context}"
    if error.context and error.problem and error.context_mark:
        text += f" ({error.context} at {at(error.context_mark)})"
    return text


def read_configs(paths: list[str | os.PathLike]) -> dict:
    """The config files merged as Snakemake merges --configfile: later files override earlier
    ones key by key, sections merged recursively."""
    config: dict = {}
    for path in paths:
        content = read_yaml(path) or {}
        if not isinstance(content, dict):
            raise DistinctcapError(f"{path}: a config file holds keys at its top level")
        config = merge_configs(config, content)
    return config


def merge_configs(base: dict, extra: dict) -> dict:
    """`extra` over `base`, key by key, nested blocks merged (a new dict; neither changes)."""
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merge_configs(base[key], value) if both else value
    return out


def config_sources(
    paths: Sequence[str | os.PathLike], overrides: dict | None = None, repo: Path | None = None
) -> list[tuple[str, dict]]:
    """(name, content) of each config file in merge order (named by `shown_path` against
    `repo`), then Snakemake's --config overrides, for `validate` to name where a key came from."""
    repo = (repo or Path.cwd()).absolute()
    sources = [(shown_path(path, repo), read_yaml(path) or {}) for path in paths]
    return sources + ([("--config", dict(overrides))] if overrides else [])


def shown_path(path: str | os.PathLike, repo: Path) -> str:
    """A config file as errors, make and the experiment record name it: relative to the
    repository (`repo`, absolute) when under it, else absolute."""
    path = Path(path).absolute()
    return str(path.relative_to(repo)) if path.is_relative_to(repo) else str(path)


def key_origin(key: list[str], sources: Sequence[tuple[str, dict]]) -> str | None:
    """The name of the last source that sets `key` (a path of keys), or None."""
    return next((name for name, content in reversed(sources) if _sets(content, key)), None)


def _sets(content: object, key: list[str]) -> bool:
    for part in key:
        if not isinstance(content, dict) or part not in content:
            return False
        content = content[part]
    return bool(key)
