"""Method plugins: installed packages that register a training method through the entry-point
group `distinctcap.methods` (docs/extending.md, "As a plugin"), found without importing them.

An entry point's name is the method's name (a run's `method:`), its value the "module:Class" of
the method's facts class (a distinctcap.methods.base.Objective subclass naming its objective by
`objective_class`). The method's options schema is package data of the plugin's top-level
package, laid out as distinctcap lays out its own: `<package>/schemas/methods/<name>.yaml`.

Finding a plugin imports nothing of it (`importlib.util.find_spec` of a top-level package only
locates it), so the schema (distinctcap.core.schema) reads its fragment while Snakemake parses;
its facts are loaded by distinctcap.methods.facts, which also says what is wrong with one.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

GROUP = "distinctcap.methods"


@dataclass(frozen=True)
class MethodPlugin:
    """One entry point of the group: the method `name`, its facts `value` ("module:Class"),
    the distribution `dist` that ships it."""

    name: str
    value: str
    dist: str

    @property
    def label(self) -> str:
        """How errors name it: "method plugin 'x' (package y)"."""
        return f"method plugin {self.name!r} (package {self.dist})"

    @property
    def package(self) -> str:
        """The top-level package of its facts module."""
        return self.value.partition(":")[0].split(".")[0]

    def schema_file(self) -> Path | None:
        """Its options schema, `<package>/schemas/methods/<name>.yaml`; None when the package
        cannot be found."""
        spec = importlib.util.find_spec(self.package)
        folders = list(spec.submodule_search_locations or []) if spec else []
        if not folders:
            return None
        return Path(folders[0]) / "schemas" / "methods" / f"{self.name}.yaml"


@functools.cache
def method_plugins() -> tuple[MethodPlugin, ...]:
    """The installed method plugins, by name (as importlib.metadata finds them on sys.path)."""
    found = []
    for entry in importlib.metadata.entry_points(group=GROUP):
        dist = entry.dist.name if entry.dist is not None else "unknown"
        found.append(MethodPlugin(entry.name, entry.value, dist))
    return tuple(sorted(found, key=lambda plugin: (plugin.name, plugin.dist)))
