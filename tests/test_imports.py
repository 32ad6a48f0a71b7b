"""The package has no import cycle, counting every `import` / `from` anywhere in a module (inside
functions too): a cycle hidden by a function-level import still ties the modules together, and
the folder tree is only the architecture while dependencies point one way (ARCHITECTURE.md)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "src" / "distinctcap"


def module_names() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its __init__)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement in `module` names (modules, or names defined in
    one), relative imports resolved. A parent package that Python runs on the way is not an
    edge: `from distinctcap.methods.facts import FACTS` depends on facts, not on every method."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
        base = ".".join([*parts, base] if base else parts)
    return [f"{base}.{alias.name}" for alias in node.names]


def owner(name: str, modules: dict[str, Path]) -> str | None:
    """The package module that `name` (a module, or a name defined in one) belongs to."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                is_package = path.name == "__init__.py"
                targets |= {owner(n, modules) for n in imported(node, module, is_package)}
        graph[module] = targets - {None, module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = "done"
        stack.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_through_a_function_level_import_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_counts_imports_inside_functions():
    graph = import_graph()
    # evaluate.loaded loads the CLIP inside a function (open_clip stays out of its import time)
    assert "distinctcap.clip.load" in graph["distinctcap.evaluate.loaded"]
    assert "distinctcap.core.errors" in graph["distinctcap.core.config"]


BLOCKED_FOR_TRAINING = ("pycocoevalcap", "distinctcap.report", "distinctcap.evaluate.stage",
                        "distinctcap.evaluate.device", "distinctcap.evaluate.metrics.coco",
                        "distinctcap.evaluate.metrics.java", "distinctcap.evaluate.metrics.ptb",
                        "distinctcap.evaluate.metrics.meteor", "distinctcap.evaluate.metrics.spice",
                        "snakemake")  # fmt: skip
TRAINING_MODULES = ("distinctcap.train.trainer", "distinctcap.train.launch",
                    "distinctcap.methods.mle", "distinctcap.methods.unkt", "distinctcap.methods.cl",
                    "distinctcap.methods.smile", "distinctcap.methods.specificity")  # fmt: skip


def test_training_imports_no_evaluation_java_or_report():
    """A GPU node may lack pycocoevalcap, Java and snakemake (issue 42): the trainer and every
    method import with those modules blocked, so the metrics that need them load lazily."""
    blocker = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith({BLOCKED_FOR_TRAINING!r}):
            raise ImportError(f"blocked for training: {{name}}")
sys.meta_path.insert(0, Block())
for module in {TRAINING_MODULES!r}:
    importlib.import_module(module)
"""
    done = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
