"""What a pipeline job used, as the kernel counted it: wall and CPU seconds, peak resident
memory and bytes written, its own and its finished children's (DataLoader workers, torchrun's
workers, METEOR's and the PTB tokenizer's JVMs).

`logs.setup` registers `log_usage` to run at the job's exit, so every job's log ends with one
`usage: {...}` line; `read_usage` reads it back (bench/rehearsal.py's per-stage table).
Snakemake's benchmark files sample memory every 30 s after a job's first 30 and miss
short-lived children's CPU; getrusage's peak and /proc's byte counts miss nothing.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import time
from pathlib import Path

MB = 1024 * 1024
USAGE = "usage: "
log = logging.getLogger("distinctcap.usage")
MARK = f"{log.name}: {USAGE}"  # as logs.FORMAT writes the line


def process_start() -> float:
    """This process's start as a time.time() value (Linux's /proc), else now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def bytes_written() -> int | None:
    """Bytes this process and its reaped children caused to be written to storage (Linux's
    /proc/self/io write_bytes), or None where the kernel does not say."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def usage(started: float) -> dict:
    """The job's use so far: wall since `started`, CPU of itself and its reaped children, peak
    RSS of itself and of its largest child (ru_maxrss, kB on Linux), MB written."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN
    )
    written = bytes_written()
    return {
        "wall_s": round(time.time() - started, 2),
        "cpu_s": round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 2),
        "peak_rss_mb": round(own.ru_maxrss / 1024, 1),
        "children_peak_rss_mb": round(children.ru_maxrss / 1024, 1),
        "written_mb": None if written is None else round(written / MB, 1),
    }


def log_usage(started: float) -> None:
    """One `usage: {json}` line in the job's log file (not on the console)."""
    log.info(USAGE + json.dumps(usage(started)), extra={"console": False})


def read_usage(log_file: str | Path) -> dict | None:
    """The last `usage:` line of a job's log (its main process exits last), or None."""
    found = None
    try:
        with open(log_file, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                at = line.find(MARK)
                if at >= 0:
                    found = json.loads(line[at + len(MARK) :])
    except (OSError, ValueError):
        return None
    return found
