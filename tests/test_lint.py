"""ruff is part of the test suite (snakemake --lint is in test_config.py)."""

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_ruff_is_clean():
    ruff = Path(sys.executable).with_name("ruff")
    paths = [p for p in ("src", "tests", "bench", "workflow/scripts") if (ROOT / p).exists()]
    result = subprocess.run([str(ruff), "check", *paths], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
