"""Live training curves for TensorBoard: every curve.csv row, as it is made, written as scalars
to `<run folder>/tensorboard/` (`make tensorboard EXPERIMENT=dir`; docs/pipeline.md, "Watching
training"). Only the main process writes; the numbers are the curve's, so nothing the run
computes changes. A resumed run hides the events its checkpoint does not hold (`purge_step`),
a fresh one starts from an empty folder. Without the tensorboard package (requirements.txt)
the run trains the same, with one warning and no event files.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

BOARD_DIR = "tensorboard"  # beside curve.csv in the run folder
log = logging.getLogger(__name__)


def open_board(run_dir: Path, resumed_step: int | None) -> CurveBoard | None:
    """The run's board, or None (one warning) where tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:
        log.warning("no TensorBoard curves (%s): pip install tensorboard==2.21.0", error)
        return None
    folder = Path(run_dir) / BOARD_DIR
    if resumed_step is None:
        shutil.rmtree(folder, ignore_errors=True)  # a fresh run's curve only
    purge = None if resumed_step is None else resumed_step + 1
    writer = SummaryWriter(str(folder), purge_step=purge)
    # the job's log says where to point TensorBoard (a cluster job's folder, too)
    log.info("live curves: tensorboard --logdir %s", folder.resolve())
    return CurveBoard(writer)


class CurveBoard:
    """The event files of one run's curve, through `writer` (a SummaryWriter)."""

    def __init__(self, writer):
        self.writer = writer

    def add(self, row: dict) -> None:
        """The curve row `row` (its `step` and each number, by its curve.csv column)."""
        step = int(row["step"])
        for name, value in row.items():
            if name != "step" and isinstance(value, int | float):
                self.writer.add_scalar(name, float(value), step)
        self.writer.flush()  # live: each row is on disk when the log line is

    def close(self) -> None:
        self.writer.close()
