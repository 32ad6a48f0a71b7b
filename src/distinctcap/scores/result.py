"""The one return shape of every multi-metric function: flat values plus what was skipped."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

KEYS = ("run", "split", "decoding")  # one metrics-table row per evaluation


@dataclass
class MetricResult:
    """Metric name -> float (one metrics-table column each) and name -> reason for skipped ones.

    A skipped metric is still present in `values`, as NaN, so every run's table has the same
    columns; it is never reported as 0.
    """

    values: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def skip(self, name: str, reason: str) -> MetricResult:
        """Record `name` as NaN with the reason it could not be computed."""
        self.values[name] = math.nan
        self.skipped[name] = reason
        return self

    def merge(self, other: MetricResult, prefix: str = "") -> MetricResult:
        """Add `other`'s values and skips (names prefixed with `prefix`) into this result."""
        self.values.update({prefix + k: v for k, v in other.values.items()})
        self.skipped.update({prefix + k: v for k, v in other.skipped.items()})
        return self

    def __getitem__(self, name: str) -> float:
        return self.values[name]
