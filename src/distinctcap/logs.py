"""Per-rule logging: everything a stage logs (and its warnings) goes to the rule's log file."""

from __future__ import annotations

import logging
import sys


def setup(log_file: str | None = None, level: int = logging.INFO) -> None:
    """Log to `log_file` (the rule's `log:`) and to stderr, where progress bars also go."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(level=level, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)
