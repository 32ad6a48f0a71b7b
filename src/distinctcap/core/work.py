"""Work counts, taken where the work happens: the decoding loop counts the captions it decodes,
the scorers the captions they score, and a stage that wants the record opens `counting()`
around its work (the trainer around the run and, nested, around each validation pass; an
evaluate job around each metric). Outside any `counting()` block `count` does nothing, so the
counting sources cost nothing in code that records no work.

The records feed the work budget (distinctcap.runs.budget): a change that adds work changes a
count, with no clock involved. Nothing here imports torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_OPEN: ContextVar[tuple[Counter, ...]] = ContextVar("distinctcap_work", default=())


@contextmanager
def counting(counter: Counter | None = None) -> Iterator[Counter]:
    """`counter` (default a fresh one), receiving every `count` made inside the block (the
    innermost open block only: a validation pass inside a training run counts into its own)."""
    counter = Counter() if counter is None else counter
    token = _OPEN.set((*_OPEN.get(), counter))
    try:
        yield counter
    finally:
        _OPEN.reset(token)


def count(what: str, n: int = 1) -> None:
    """Add `n` to `what` in the innermost open `counting()` block, if any."""
    open_blocks = _OPEN.get()
    if open_blocks:
        open_blocks[-1][what] += int(n)
