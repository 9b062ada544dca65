"""Aims: a figure of a metric that a run should reach, and whether it did."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Of = Literal["corral", "ratio", "difference"]


@dataclass(frozen=True)
class Aim:
    """`of` at percentile `q` should be below `limit` (above it, when `above`).

    `of` is "corral" (the measured side's own figure, in the metric's unit), "ratio"
    (corral / baseline) or "difference" (corral - baseline, in the unit). An aim that is not
    checked has `unchecked` say why (the run measured less than the aim is about, say 8
    sessions of 64): it is reported with its value but neither met nor missed.
    """

    q: int
    limit: float
    of: Of = "corral"
    above: bool = False
    unchecked: str | None = None

    def describe(self, unit: str, label: str | None = None) -> str:
        """The aim in words, e.g. "p50 < 20 ms" or "ratio at p50 > 0.8×".

        `label` names the percentile (default "p50" for 50), e.g. "median" or "total".
        """
        label = label or f"p{self.q}"
        what = label if self.of == "corral" else f"{self.of} at {label}"
        limit = f"{self.limit:g}×" if self.of == "ratio" else f"{self.limit:g} {unit}"
        return f"{what} {'>' if self.above else '<'} {limit}"

    def met(self, value: float | None) -> bool | None:
        """Whether `value` (this aim's figure) reaches the limit; None when not checked."""
        if self.unchecked is not None or value is None:
            return None
        return value > self.limit if self.above else value < self.limit

    def to_dict(self, unit: str, value: float | None, label: str | None = None) -> dict[str, Any]:
        """Machine-readable form, with the run's `value` and the verdict."""
        return {
            "aim": self.describe(unit, label),
            "of": self.of,
            "percentile": self.q,
            "limit": self.limit,
            "above": self.above,
            "value": None if value is None else round(value, 4),
            "met": self.met(value),
            "unchecked": self.unchecked,
        }


def verdict(aim: Aim, value: float | None) -> str:
    """ "met", "missed", or "not checked" and why."""
    met = aim.met(value)
    if met is None:
        return f"not checked ({aim.unchecked or 'no value'})"
    return "met" if met else "missed"
