"""What the COCO caption metrics' Java tools share (the PTB tokenizer, METEOR and SPICE): a
`java` that starts, the JVM's own warnings kept off the tools' output, the folder of
pycocoevalcap's jars, and a caption as the one line each tool reads.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pycocoevalcap.tokenizer import ptbtokenizer

from distinctcap.core.errors import DistinctcapError

# pycocoevalcap is a namespace package (no __init__.py): locate it through a module file.
PYCOCOEVALCAP = Path(ptbtokenizer.__file__).resolve().parents[1]
JAVA_INSTALL = "install Java 17, e.g. `apt-get install openjdk-17-jre-headless`"

Pair = tuple[str, Sequence[str]]  # (candidate, references)
# The JVM writes its own warnings (unified logging, Java 9+) to stdout by default, where PTB
# and METEOR write their answers; a forced warning gives the tokenizer one line too many, the
# failure a loaded CI run hit (242 lines for 241 captions). These options send them to
# stderr; `check_java` tries them.
JVM_WARNINGS_TO_STDERR = ("-Xlog:disable", "-Xlog:all=warning:stderr")


def java_executable() -> str:
    """Path of `java`; the COCO tools need a JRE (9 or newer: JVM_WARNINGS_TO_STDERR)."""
    java = shutil.which("java")
    if java is None:
        raise DistinctcapError(
            f"the COCO caption metrics need `java` on PATH (a JRE 9 or newer); {JAVA_INSTALL}"
        )
    return java


def check_java() -> str:
    """Path of a `java` that starts with the tools' options (`java <options> -version`), else a
    DistinctcapError saying how to install one; the workflow calls it before any job when the
    run evaluates captions."""
    java = java_executable()
    try:
        subprocess.run(
            [java, *JVM_WARNINGS_TO_STDERR, "-version"],
            capture_output=True,
            check=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise DistinctcapError(
            f"`{java} -version` fails ({error}); the COCO caption metrics need a working "
            f"JRE 9 or newer: {JAVA_INSTALL}"
        ) from error
    return java


def one_line(text: str) -> str:
    """One line, single spaces: PTB and METEOR read one caption per line."""
    return " ".join(text.replace("|||", " ").split())
