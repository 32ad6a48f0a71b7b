"""The one exception users see: a clear message, no traceback needed."""


class DistinctcapError(ValueError):
    """Bad config or bad input, with a message naming the key or item and what is allowed."""


def first_line(error: BaseException) -> str:
    """A library's exception as one short line (its first), for a DistinctcapError."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
