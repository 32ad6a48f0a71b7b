"""METEOR 1.5 of the COCO caption metrics: long-lived `-stdio` servers (the protocol of
pycocoevalcap's Meteor), started on first use, one per session for corpus scores and, for the
per-pair scores of many pairs, several side by side (`MeteorServers`).
"""

from __future__ import annotations

import math
import subprocess
import tempfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from distinctcap.core.errors import DistinctcapError
from distinctcap.evaluate.metrics.java import (
    JVM_WARNINGS_TO_STDERR,
    PYCOCOEVALCAP,
    Pair,
    java_executable,
    one_line,
)
from distinctcap.evaluate.metrics.parallel import chunk_bounds

METEOR_JAR = PYCOCOEVALCAP / "meteor" / "meteor-1.5.jar"
# A METEOR server per this many pairs at most, up to half the job's `workers` (the forked
# Python scorers use the other half): a server's start (its paraphrase table) is ~15 CPU s,
# a pair with 5 references ~1.1-2.3 CPU ms.
METEOR_PAIRS_PER_SERVER = 10_000
# METEOR's servers keep Java's default tiered compiler: C2 loads the paraphrase table in ~13
# instead of ~19 s and scores faster from a few hundred pairs on (docs/performance.md). The
# serial GC halves the resident memory of the paraphrase table load (~0.6 instead of ~1.1
# GiB) without changing any score.
METEOR_JVM_OPTIONS = ("-XX:+UseSerialGC",)
MAX_METEOR_SERVERS = 4  # ~1 GB resident each (the evaluate rule's mem_mb counts on it)


def pair_key(pair: Pair) -> tuple[str, tuple[str, ...]]:
    """A (candidate, references) pair as METEOR reads it: one key per distinct pair."""
    hypothesis, references = pair
    return one_line(hypothesis), tuple(one_line(r) for r in references)


class MeteorServer:
    """A METEOR 1.5 `-stdio` server (the protocol of pycocoevalcap's Meteor), stats cached."""

    def __init__(self, java: str, memory: str, jvm_options: Sequence[str] = METEOR_JVM_OPTIONS):
        self._stderr = tempfile.TemporaryFile()
        cmd = [  # pycocoevalcap's command
            java,
            *JVM_WARNINGS_TO_STDERR,
            *jvm_options,
            f"-Xmx{memory}",
            "-jar",
            str(METEOR_JAR),
            "-",
            "-",
            "-stdio",
            "-l",
            "en",
            "-norm",
        ]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self._stats: dict[tuple[str, tuple[str, ...]], str] = {}

    def _readline(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace")[-2000:]
            raise DistinctcapError(f"METEOR ({METEOR_JAR.name}) stopped: {tail}")
        return line.decode().strip()

    def _write(self, lines: Sequence[str]) -> None:
        self.proc.stdin.write("".join(line + "\n" for line in lines).encode())
        self.proc.stdin.flush()

    def stats(self, pairs: Sequence[Pair], chunk: int = 64) -> list[str]:
        """METEOR sufficient statistics per pair; chunks keep both pipes far below 64 KiB."""
        keys = [pair_key(pair) for pair in pairs]
        todo = list(dict.fromkeys(k for k in keys if k not in self._stats))
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            self._write([" ||| ".join(("SCORE", *refs, hyp)) for hyp, refs in part])
            for key in part:
                self._stats[key] = self._readline()
        return [self._stats[k] for k in keys]

    def score(self, pairs: Sequence[Pair]) -> tuple[float, list[float]]:
        """Corpus METEOR (from summed statistics) and the per-pair segment scores."""
        if not pairs:
            return math.nan, []
        self._write([" ||| ".join(("EVAL", *self.stats(pairs)))])
        per_item = [float(self._readline()) for _ in pairs]
        return float(self._readline()), per_item

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


class MeteorServers:
    """A session's METEOR servers, each started when first asked for (counted in
    `launches["meteor"]`), with `memory` of Java heap each; `close` stops them."""

    def __init__(self, memory: str, launches: Counter):
        self.memory, self.launches = memory, launches
        self.servers: list[MeteorServer] = []

    def server(self, k: int) -> MeteorServer:
        """Server `k`, started now with those before it if they are not running yet."""
        while len(self.servers) <= k:
            self.launches["meteor"] += 1
            self.servers.append(MeteorServer(java_executable(), self.memory))
        return self.servers[k]

    def segments(self, pairs: Sequence[Pair], workers: int) -> list[float]:
        """Per-pair METEOR of many pairs: each distinct pair once, cut over the servers of
        `meteor_server_count` side by side (a pair's score depends on its own statistics
        only, so neither the split nor the deduplication changes a digit)."""
        keys = [pair_key(pair) for pair in pairs]
        unique = list(dict.fromkeys(keys))
        bounds = chunk_bounds(len(unique), meteor_server_count(len(unique), workers))
        if len(bounds) <= 1:
            scores = self.server(0).score(unique)[1]
        else:
            servers = [self.server(k) for k in range(len(bounds))]  # they load side by side
            parts = [unique[a:b] for a, b in bounds]
            with ThreadPoolExecutor(len(bounds)) as pool:
                done = pool.map(lambda server, part: server.score(part)[1], servers, parts)
                scores = [s for part in done for s in part]
        by_key = dict(zip(unique, scores, strict=True))
        return [by_key[k] for k in keys]

    def close(self) -> None:
        for server in self.servers:
            server.close()
        self.servers = []


def meteor_server_count(pairs: int, workers: int) -> int:
    """METEOR servers for `pairs` distinct pairs on a job of `workers` cores: one per
    METEOR_PAIRS_PER_SERVER pairs, at most half the cores (they score beside the forked
    Python workers; a further server's ~15 CPU s start only pays where a core is free) and
    MAX_METEOR_SERVERS."""
    wanted = -(-pairs // METEOR_PAIRS_PER_SERVER)
    return max(1, min(wanted, -(-workers // 2), MAX_METEOR_SERVERS))
