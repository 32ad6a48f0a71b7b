"""Per-rule logging: everything a stage logs (and its warnings) goes to the rule's log file,
and so does an error that stops it: a one-line reason, then the traceback."""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

from distinctcap.core.errors import DistinctcapError

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("distinctcap")


def setup(log_file: str | None = None, level: int = logging.INFO, fmt: str = FORMAT) -> None:
    """Log to `log_file` (the rule's `log:`, emptied first) and to stderr, where progress bars
    also go; an uncaught error is logged too (`log_uncaught`)."""
    if log_file:
        Path(log_file).write_text("")
    setup_append(log_file, level, fmt)


def setup_append(log_file: str | None, level: int = logging.INFO, fmt: str = FORMAT) -> None:
    """As `setup`, appending to `log_file`. Every process writing one log appends (O_APPEND),
    so the lines of torchrun's workers and of the job's own process never overwrite each other."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="a"))
    logging.basicConfig(level=level, handlers=handlers, force=True, format=fmt)
    logging.captureWarnings(True)
    sys.excepthook = log_uncaught


RANDOM_INIT = "No pretrained weights loaded for model"


class ExplainRandomInit(logging.Filter):
    """open_clip warns "No pretrained weights loaded ... initialized randomly" whenever it
    builds a model without weights; where the pipeline trains a CLIP from scratch that is
    the plan, so the line is logged at INFO with the reason instead of alarming newcomers."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.getMessage().startswith(RANDOM_INIT):
            record.msg = (
                f"{record.getMessage()} (expected: clip.pretrained = train, so the pipeline "
                "trains this CLIP from random weights)"
            )
            record.args, record.levelno, record.levelname = (), logging.INFO, "INFO"
        return True


def expect_random_init() -> None:
    """Explain open_clip's random-initialisation warning on every handler (ExplainRandomInit);
    called where the pipeline builds a CLIP to train it (clip.train_clip)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, ExplainRandomInit) for f in handler.filters):
            handler.addFilter(ExplainRandomInit())


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


def warn_if_capped(logger: logging.Logger, key: str, value: int, limit: int, data: str) -> None:
    """A size larger than the data is capped to it (the schema says so); one warning names the
    key and the limit (`data`, e.g. "the 240 train images"), so a typo of a few zeros is seen."""
    if value > limit:
        logger.warning("%s = %d exceeds %s; capped to %d", key, value, data, limit)
