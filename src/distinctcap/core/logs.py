"""Per-rule logging: everything a stage logs (and its warnings) goes to the rule's log file,
and so does an error that stops it: a one-line reason, then the traceback.

It also owns the progress policy (`progress`): a tqdm bar only for a process that has the
terminal to itself (stderr a terminal, and not a pipeline job, which Snakemake may run beside
others on one console); otherwise a log line every `PROGRESS_SECONDS`, so jobs sharing a
console write whole lines instead of interleaving bars."""

from __future__ import annotations

import atexit
import logging
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.usage import log_usage, process_start

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("distinctcap")
# progress lines (LogProgress): a child of `log`, so a command can show them alone
progress_log = logging.getLogger("distinctcap.progress")
PROGRESS_SECONDS = 30.0  # between progress lines when no bar is drawn
QUICK_SECONDS = 10.0  # a loop done sooner says nothing
_job_log: str | None = None  # the rule's log file once `setup` was given one (a pipeline job)
FILE_ONLY = {"console": False}  # `extra=` of a record that goes to the log file, not stderr
SNAKEMAKE_LOGS = Path(".snakemake/log")  # one file per Snakemake invocation, in its workdir


def setup(log_file: str | None = None, level: int = logging.INFO, fmt: str = FORMAT) -> None:
    """Log to `log_file` (the rule's `log:`, emptied first) and to stderr, where progress bars
    also go; an uncaught error is logged too (`log_uncaught`), and the job's use of the machine
    at its exit (`core.usage`)."""
    if log_file:
        Path(log_file).write_text("")
    setup_append(log_file, level, fmt)
    if log_file:
        atexit.register(log_usage, process_start())


def setup_append(log_file: str | None, level: int = logging.INFO, fmt: str = FORMAT) -> None:
    """As `setup`, appending to `log_file`. Every process writing one log appends (O_APPEND),
    so the lines of torchrun's workers and of the job's own process never overwrite each other."""
    global _job_log
    _job_log = log_file
    console = logging.StreamHandler(sys.stderr)
    console.addFilter(lambda record: getattr(record, "console", True))
    handlers: list[logging.Handler] = [console]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="a"))
    logging.basicConfig(level=level, handlers=handlers, force=True, format=fmt)
    progress_log.handlers.clear()  # a command's own progress handler (runs.cli.show_progress)
    progress_log.propagate = True
    logging.captureWarnings(True)
    sys.excepthook = log_uncaught


RANDOM_INIT = "No pretrained weights loaded for model"


class QuietOpenClip(logging.Filter):
    """open_clip logs every step of building a model and its tokenizer on the root logger at
    INFO (~10 lines a load), and warns "No pretrained weights loaded ... initialized randomly"
    whenever it builds a model without weights. The INFO lines say nothing a user needs; the
    warning is dropped only where weights are loaded afterwards (`weights_follow`), where it is
    not true."""

    def __init__(self, weights_follow: bool):
        super().__init__()
        self.weights_follow = weights_follow

    def filter(self, record: logging.LogRecord) -> bool:
        if "open_clip" not in record.pathname:
            return True
        if record.levelno < logging.WARNING:
            return False
        return not (self.weights_follow and record.getMessage().startswith(RANDOM_INIT))


@contextmanager
def quiet_open_clip(weights_follow: bool = False) -> Iterator[None]:
    """Around open_clip's model and tokenizer creation: its INFO lines dropped, and its
    random-initialisation warning too when `weights_follow` (QuietOpenClip)."""
    root = logging.getLogger()
    quiet = QuietOpenClip(weights_follow)
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def reason(error: BaseException) -> str:
    """The one-line reason of `error`: a DistinctcapError's message is written for users, any
    other error is named by its type."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else ""
    if isinstance(error, DistinctcapError):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def log_uncaught(kind: type[BaseException], error: BaseException, tb) -> None:
    """sys.excepthook: the reason goes to every handler (stderr and the log file), the
    traceback only to the file handlers; without a log file stderr gets the traceback."""
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, tb)
        return
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    record = log.makeRecord(log.name, logging.ERROR, "", 0, reason(error), None, None)
    log.handle(record)
    text = "".join(traceback.format_exception(kind, error, tb))
    for handler in files:
        handler.stream.write(text)
        handler.flush()
    if not files:
        sys.stderr.write(text)


def first_this_run(key: str) -> bool:
    """Is this the first job of the current Snakemake invocation to say `key`? Outside a
    pipeline job (no rule log, or no Snakemake log folder in the working directory) always.
    The invocation is the newest file in .snakemake/log/; a marker beside it remembers `key`."""
    runs = sorted(SNAKEMAKE_LOGS.glob("*.snakemake.log")) if _job_log else []
    if not runs:
        return True
    marker = runs[-1].with_name(f"{runs[-1].name}.{key}")
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def progress(iterable=None, *, desc: str = "", unit: str = "it", **options):
    """The progress of a loop (module docstring): a tqdm bar (`options` are tqdm's) where the
    process has the terminal to itself, else `LogProgress`, which has the same update /
    set_postfix / close / iteration and writes a log line every PROGRESS_SECONDS."""
    if _job_log is None and sys.stderr.isatty():
        return tqdm(iterable, desc=desc, unit=unit, **options)
    keep = {k: options[k] for k in ("total", "initial", "disable") if k in options}
    return LogProgress(iterable, desc=desc, unit=unit, **keep)


class LogProgress:
    """Progress as log lines: "desc: n/total unit (rate/s), postfix" every PROGRESS_SECONDS
    and once at the end of a loop that took longer than QUICK_SECONDS."""

    def __init__(self, iterable=None, desc="", unit="it", total=None, initial=0, disable=False):
        self.iterable, self.desc, self.unit, self.disable = iterable, desc, unit, disable
        self.total = len(iterable) if total is None and hasattr(iterable, "__len__") else total
        self.n, self.initial, self.postfix, self.closed = initial, initial, "", False
        self.start = self.said = time.monotonic()

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.said >= PROGRESS_SECONDS:
            self._say()

    def set_postfix(self, refresh: bool = True, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if not self.closed and time.monotonic() - self.start >= QUICK_SECONDS:
            self._say()
        self.closed = True

    def _say(self) -> None:
        self.said = time.monotonic()
        if self.disable:
            return
        rate = (self.n - self.initial) / max(self.said - self.start, 1e-9)
        total = f"/{self.total}" if self.total is not None else ""
        tail = f", {self.postfix}" if self.postfix else ""
        progress_log.info("%s: %d%s %s (%.1f/s)%s", self.desc, self.n, total, self.unit, rate,
                          tail)  # fmt: skip


def warn_if_capped(logger: logging.Logger, key: str, value: int, limit: int, data: str) -> None:
    """A size larger than the data is capped to it (the schema says so); one warning names the
    key and the limit (`data`, e.g. "the 240 train images"), so a typo of a few zeros is seen."""
    if value > limit:
        logger.warning("%s = %d exceeds %s; capped to %d", key, value, data, limit)
