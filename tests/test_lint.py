"""ruff, snakefmt and the size limits are part of the test suite (snakemake --lint is in
test_config.py)."""

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

BIN = Path(sys.executable).parent


def test_ruff_is_clean():
    paths = [p for p in ("src", "tests", "bench", "workflow/scripts") if (ROOT / p).exists()]
    result = subprocess.run([str(BIN / "ruff"), "check", *paths], cwd=ROOT, capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_snakefile_and_rule_files_are_snakefmt_formatted():
    """snakefmt (pyproject.toml's [tool.snakefmt]: ruff's line length) leaves them as they are;
    `snakefmt Snakefile workflow/rules` formats them."""
    rules = sorted((ROOT / "workflow" / "rules").glob("*.smk"))
    files = ["Snakefile", *(p.relative_to(ROOT).as_posix() for p in rules)]
    check = subprocess.run([str(BIN / "snakefmt"), "--check", *files], cwd=ROOT,
                           capture_output=True, text=True)  # fmt: skip
    if check.returncode != 0:
        diff = subprocess.run([str(BIN / "snakefmt"), "--diff", *files], cwd=ROOT,
                              capture_output=True, text=True)  # fmt: skip
        raise AssertionError(check.stderr + diff.stdout[-5000:])


# ---------------------------------------------------------------------------------------------
# Sizes (ARCHITECTURE.md: one small function for one idea)

PACKAGE = ROOT / "src" / "distinctcap"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 80
# Files allowed over MAX_FILE_LINES, each with its reason; none today. The test fails on an
# entry that is no longer needed, so one cannot stay by accident.
ALLOWED_LONG_FILES: set[str] = set()


def sizes_over_limits(package: Path) -> tuple[dict[str, int], dict[str, int]]:
    """({file: lines} over MAX_FILE_LINES, {"file:line name": lines} of the functions and
    methods over MAX_FUNCTION_LINES, counted from the `def` line to the last line) under
    `package`, by path relative to it."""
    files, functions = {}, {}
    for path in sorted(package.rglob("*.py")):
        name, text = path.relative_to(package).as_posix(), path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES:
            files[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    functions[f"{name}:{node.lineno} {node.name}"] = length
    return files, functions


def test_no_source_file_over_600_lines_and_no_function_over_80():
    files, functions = sizes_over_limits(PACKAGE)
    assert set(files) - ALLOWED_LONG_FILES == set(), files
    assert functions == {}, functions
    still_long = ALLOWED_LONG_FILES & set(files)
    assert still_long == ALLOWED_LONG_FILES, (
        f"{sorted(ALLOWED_LONG_FILES - still_long)} no longer over {MAX_FILE_LINES} lines: "
        "drop them from ALLOWED_LONG_FILES"
    )


def test_the_size_check_counts_files_functions_and_methods(tmp_path):
    def function(name: str, lines: int, indent: str = "") -> str:  # a def of `lines` lines
        return f"{indent}def {name}():\n" + f"{indent}    x = 1\n" * (lines - 1)

    limit = MAX_FUNCTION_LINES
    (tmp_path / "long.py").write_text(
        function("long", limit + 1) + function("fits", limit) + "\n" * MAX_FILE_LINES
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").write_text(
        "class C:\n" + function("method", limit + 1, "    ") + function("fits", limit, "    ")
    )
    files, functions = sizes_over_limits(tmp_path)
    assert files == {"long.py": 2 * limit + 1 + MAX_FILE_LINES}
    assert functions == {"long.py:1 long": limit + 1, "sub/c.py:2 method": limit + 1}
