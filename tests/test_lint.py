"""ruff and snakefmt are part of the test suite (snakemake --lint is in test_config.py)."""

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
