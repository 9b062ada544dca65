"""Order statistics of samples: percentiles with linear interpolation, and their summary."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PERCENTILES = (50, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0 <= q <= 100) of non-empty `values`, linearly interpolated.

    Matches numpy's default method: rank `q/100 * (n-1)` between the sorted samples.
    Raises `ValueError` on an empty sequence or a `q` outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Summary:
    """Samples of one metric on one side (corral or baseline), in the metric's unit."""

    samples: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        """A summary of non-empty `values`; raises `ValueError` when there are none."""
        if not values:
            raise ValueError("a summary needs at least one sample")
        return cls(tuple(values))

    @property
    def n(self) -> int:
        return len(self.samples)

    def p(self, q: float) -> float:
        """The `q`-th percentile of the samples."""
        return percentile(self.samples, q)

    def to_dict(self, digits: int = 3) -> dict[str, Any]:
        """n, median, p50/p95/p99, mean, min, max and the raw samples, rounded to `digits`."""
        out: dict[str, Any] = {"n": self.n, "median": round(self.p(50), digits)}
        out.update({f"p{q}": round(self.p(q), digits) for q in PERCENTILES})
        out["mean"] = round(sum(self.samples) / self.n, digits)
        out["min"] = round(min(self.samples), digits)
        out["max"] = round(max(self.samples), digits)
        out["samples"] = [round(value, digits) for value in self.samples]
        return out


def ratio(numerator: float, denominator: float) -> float | None:
    """`numerator / denominator`, or None when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else None
