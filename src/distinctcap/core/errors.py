"""The one exception users see: a clear message, no traceback needed."""


class DistinctcapError(ValueError):
    """Bad config or bad input, with a message naming the key or item and what is allowed."""
