"""SPICE of the COCO caption metrics: one Java run over a batch of (candidate, references)
pairs, with `-threads` and a `-cache`. It runs only where its Stanford CoreNLP 3.6.0 jars are
already installed (pycocoevalcap downloads them on first use, which this setup never does;
they are not on the dev box, so the SPICE run path is exercised only where they are).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from distinctcap.core.errors import DistinctcapError
from distinctcap.evaluate.metrics.java import PYCOCOEVALCAP, Pair, java_executable

SPICE_JAR = PYCOCOEVALCAP / "spice" / "spice-1.0.jar"
# pycocoevalcap's spice/get_stanford_models.py downloads these two on first use; we only look.
SPICE_CORENLP_JARS = tuple(
    PYCOCOEVALCAP / "spice" / "lib" / f"stanford-corenlp-3.6.0{suffix}.jar"
    for suffix in ("", "-models")
)


def spice_unavailable_reason() -> str | None:
    """Why SPICE cannot run here, or None. Never downloads anything."""
    missing = [p.name for p in SPICE_CORENLP_JARS if not p.is_file()]
    if missing:
        return (
            f"SPICE needs Stanford CoreNLP 3.6.0 ({', '.join(missing)}) in "
            f"{SPICE_JAR.parent / 'lib'}"
            "; pycocoevalcap downloads them on first use, which this setup does not do "
            "(run pycocoevalcap/spice/get_stanford_models.py once where the internet is reachable)"
        )
    if shutil.which("java") is None:
        return "SPICE needs `java` on PATH"
    return None


class SpiceScores:
    """A session's SPICE F-scores by (candidate, references), each pair scored once; a run
    of SPICE is counted in `launches["spice"]`. `memory`: its Java heap; `cache_dir`: where
    its parse cache lives (`spice_speed_options`)."""

    def __init__(self, memory: str, cache_dir: Path | None, launches: Counter):
        self.memory, self.cache_dir, self.launches = memory, cache_dir, launches
        self.scores: dict[tuple[str, tuple[str, ...]], float] = {}

    def of(self, pairs: Sequence[Pair], workers: int) -> list[float]:
        """Per-pair SPICE F-scores (one Java run, on `workers` threads, for the pairs not
        seen yet)."""
        keys = [(h, tuple(refs)) for h, refs in pairs]
        todo = list(dict.fromkeys(k for k in keys if k not in self.scores))
        if todo:
            self.scores.update(zip(todo, self._run(todo, workers), strict=True))
        return [self.scores[k] for k in keys]

    def _run(self, pairs: Sequence[tuple[str, tuple[str, ...]]], workers: int) -> list[float]:
        items = [{"image_id": i, "test": h, "refs": list(r)} for i, (h, r) in enumerate(pairs)]
        with tempfile.TemporaryDirectory(prefix="distinctcap-spice-") as tmp:
            src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
            src.write_text(json.dumps(items))
            cmd = [
                java_executable(),
                f"-Xmx{self.memory}",
                "-jar",
                str(SPICE_JAR),
                str(src),
                "-out",
                str(dst),
                "-subset",
                "-silent",
                *spice_speed_options(workers, self.cache_dir, tmp),
            ]
            self.launches["spice"] += 1
            proc = subprocess.run(cmd, capture_output=True, cwd=tmp, env=_spice_env())
            if proc.returncode != 0:
                raise DistinctcapError(
                    f"SPICE failed: {proc.stderr.decode(errors='replace')[-2000:]}"
                )
            results = json.loads(dst.read_text())
        f_by_id = {r["image_id"]: r["scores"]["All"]["f"] for r in results}
        return [math.nan if f_by_id[i] is None else float(f_by_id[i]) for i in range(len(pairs))]


def spice_speed_options(workers: int, cache_dir: Path | None, tmp: str) -> list[str]:
    """SPICE's `-threads` (its parser on the job's cores, not the machine's) and `-cache`
    (SPICE's own store of each sentence's parse: under `cache_dir`, so later jobs and runs
    parse a reference set once, else in the call's temporary folder)."""
    cache = Path(cache_dir) / "spice" if cache_dir is not None else Path(tmp) / "spice-cache"
    cache.mkdir(parents=True, exist_ok=True)
    return ["-threads", str(max(1, workers)), "-cache", str(cache)]


def _spice_env() -> dict[str, str]:
    """SPICE's FST serialiser reflects into java.base, which Java >= 16 forbids unless opened
    ("InaccessibleObjectException ... does not opens java.lang"). JDK_JAVA_OPTIONS is read by
    the launcher of Java 9+ only, so Java 8 runs the jar unchanged."""
    packages = ("lang", "lang.reflect", "util", "util.concurrent", "math", "text", "net", "io")
    opens = " ".join(f"--add-opens=java.base/java.{p}=ALL-UNNAMED" for p in packages)
    current = os.environ.get("JDK_JAVA_OPTIONS", "")
    return {**os.environ, "JDK_JAVA_OPTIONS": f"{current} {opens}".strip()}
