"""The latency distributions of a run, drawn as one PNG with matplotlib's Agg renderer.

One panel per latency metric (unit "ms"): the empirical CDF of corral's samples beside its
baseline's, on a log time axis, with corral's aim as a dotted line where it has one. Figures
are built with the object API (`matplotlib.figure.Figure`), so nothing global is touched.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from bench.report import Metric
from bench.stats import Summary

COLUMNS = 2
PANEL_INCHES = (6.4, 3.0)
DPI = 110


class PlainLogFormatter(LogFormatter):
    """Labels the ticks `LogFormatter` labels (minor ones only over few decades), as plain
    numbers ("0.3", "2000") rather than "3e-01"."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def latency_metrics(metrics: list[Metric]) -> list[Metric]:
    """The metrics drawn: every one measured in milliseconds, in report order."""
    return [metric for metric in metrics if metric.unit == "ms"]


def _cdf(axes: Axes, summary: Summary, label: str, style: dict[str, Any]) -> None:
    ordered = sorted(summary.samples)
    shares = [(index + 1) / len(ordered) for index in range(len(ordered))]
    median = summary.p(50)
    text = f"{label}: p50 {median:.0f} ms" if median >= 100 else f"{label}: p50 {median:.3g} ms"
    text += f" (n={summary.n})"
    axes.step(ordered, shares, where="post", label=text, **style)


def _panel(axes: Axes, metric: Metric) -> None:
    """One metric's two distributions, its corral aims, labelled with the table's sides."""
    _cdf(axes, metric.corral, metric.sides[0], {"color": "C0"})
    _cdf(axes, metric.baseline, metric.sides[1], {"color": "C1", "linestyle": "--"})
    for aim in metric.aims:
        if aim.of == "corral":
            label = f"aim: {metric.aim_text(aim)}"
            axes.axvline(aim.limit, color="C3", linestyle=":", label=label)
    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(PlainLogFormatter())
    axes.xaxis.set_minor_formatter(
        PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4))
    )
    axes.set_ylim(0, 1.02)
    axes.set_title(metric.title.replace("`", ""), fontsize=10)
    axes.set_xlabel("ms (log scale)", fontsize=8)
    axes.set_ylabel("share of samples", fontsize=8)
    axes.tick_params(labelsize=7)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")


def _title(system: dict[str, Any], config: dict[str, Any]) -> str:
    mode = config["mode"]
    return (
        f"corral latency distributions (empirical CDF), {system['date']}, {mode} run\n"
        f"{system['uname']}, {system['cpu_model']}, {system['cpu_cores']} cores"
    )


def draw_latencies(
    system: dict[str, Any], config: dict[str, Any], metrics: list[Metric], path: Path
) -> Path:
    """Draw every latency metric of `metrics` into the PNG `path`; returns `path`.

    Raises `ValueError` when there is no latency metric to draw.
    """
    drawn = latency_metrics(metrics)
    if not drawn:
        raise ValueError("no latency metric to draw")
    rows = math.ceil(len(drawn) / COLUMNS)
    size = (PANEL_INCHES[0] * COLUMNS, PANEL_INCHES[1] * rows + 0.8)
    figure = Figure(figsize=size, layout="constrained")
    grid = figure.subplots(rows, COLUMNS, squeeze=False)
    for index, metric in enumerate(drawn):
        _panel(grid[index // COLUMNS][index % COLUMNS], metric)
    for index in range(len(drawn), rows * COLUMNS):
        grid[index // COLUMNS][index % COLUMNS].set_visible(False)
    figure.suptitle(_title(system, config), fontsize=11)
    figure.savefig(path, dpi=DPI)
    return path
