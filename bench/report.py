"""Turning the samples into the results: a JSON document and a Markdown report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.aims import Aim, verdict
from bench.stats import PERCENTILES, Summary, ratio

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class Table:
    """One table of the Markdown report: its heading and the names of its two columns."""

    key: str
    heading: str | None
    sides: tuple[str, str]


# The first table compares sandboxed corral with the unsandboxed baseline; the second, a
# session start from the warm pool with a cold one; the third, corral reached through its
# server with corral called in-process; a new session's first result and churn against the
# same on plain jupyter_client; then many sessions at once and memory, each against
# the baseline; the last, connections through the egress proxy with the same connections made
# directly on the host.
TABLES = (
    Table("main", "Against the unsandboxed kernel", ("corral", "baseline")),
    Table("pool", "Session start from the warm pool", ("from the pool", "cold")),
    Table("served", "Through the server", ("through the server", "in-process")),
    Table("fresh", "A new session through the server", ("corral", "baseline")),
    Table("concurrency", "Concurrent sessions", ("corral", "baseline")),
    Table("memory", "Memory per session", ("corral", "baseline")),
    Table("egress", "Egress", ("through the proxy", "direct on the host")),
    Table("disk", "Past the workspace limit", ("written past it", "written in one tick")),
)
TABLE_BY_KEY = {table.key: table for table in TABLES}


@dataclass(frozen=True)
class Metric:
    """One measured figure on both sides, in `unit`.

    `shown` lists the (percentile, label) pairs that get a row in the Markdown table;
    `digits` is how many decimals the table prints; `table` is the key of its `Table`, whose
    `sides` name what `corral` and `baseline` hold.
    """

    key: str
    title: str
    unit: str
    description: str
    corral: Summary
    baseline: Summary
    shown: tuple[tuple[int, str], ...]
    digits: int
    in_table: bool = True
    table: str = "main"
    aims: tuple[Aim, ...] = ()

    @property
    def sides(self) -> tuple[str, str]:
        """What `corral` and `baseline` hold, as the metric's table names them."""
        return TABLE_BY_KEY[self.table].sides

    def label(self, q: int) -> str:
        """What the table calls percentile `q` of this metric ("p95", "median", "total")."""
        return dict(self.shown).get(q, f"p{q}")

    def aim_text(self, aim: Aim) -> str:
        """`aim` in words, its percentile named as in the table."""
        return aim.describe(self.unit, self.label(aim.q))

    def ratio(self, q: int) -> float | None:
        """corral / baseline at percentile `q` (None if the baseline is not positive)."""
        return ratio(self.corral.p(q), self.baseline.p(q))

    def difference(self, q: int) -> float:
        """corral - baseline at percentile `q`, in `unit`."""
        return self.corral.p(q) - self.baseline.p(q)

    def figure(self, aim: Aim) -> float | None:
        """The run's value of what `aim` is about."""
        if aim.of == "ratio":
            return self.ratio(aim.q)
        if aim.of == "difference":
            return self.difference(aim.q)
        return self.corral.p(aim.q)

    def met(self) -> bool | None:
        """False if an aim was missed, True if every checked aim was met, else None."""
        verdicts = [aim.met(self.figure(aim)) for aim in self.aims]
        if False in verdicts:
            return False
        return True if True in verdicts else None

    def to_dict(self) -> dict[str, Any]:
        """Machine-readable form: both summaries, ratio and difference per percentile, aims."""
        ratios = {f"p{q}": _rounded(self.ratio(q), 4) for q in PERCENTILES}
        return {
            "title": self.title,
            "unit": self.unit,
            "description": self.description,
            "sides": {"corral": self.sides[0], "baseline": self.sides[1]},
            "corral": self.corral.to_dict(),
            "baseline": self.baseline.to_dict(),
            "ratio": ratios,
            "difference": {f"p{q}": round(self.difference(q), 3) for q in PERCENTILES},
            "aims": [
                aim.to_dict(self.unit, self.figure(aim), self.label(aim.q)) for aim in self.aims
            ],
            "met": self.met(),
        }


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def results_document(
    system: dict[str, Any], config: dict[str, Any], metrics: list[Metric]
) -> dict[str, Any]:
    """The whole JSON document of a run: schema version, system, config and metrics."""
    return {
        "schema": SCHEMA_VERSION,
        **system,
        "config": config,
        "aims": [
            {
                "metric": metric.key,
                **aim.to_dict(metric.unit, metric.figure(aim), metric.label(aim.q)),
            }
            for metric in metrics
            for aim in metric.aims
        ],
        "metrics": {metric.key: metric.to_dict() for metric in metrics},
    }


def markdown_table(metrics: list[Metric], table: Table = TABLES[0]) -> str:
    """`table`: one row per shown percentile of each of its metrics that is `in_table`."""
    lines = [
        f"| metric | {table.sides[0]} | {table.sides[1]} | ratio | difference | aim |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for metric in metrics:
        if not metric.in_table or metric.table != table.key:
            continue
        for q, label in metric.shown:
            cells = [
                f"{metric.title}, {label} ({metric.unit})",
                f"{metric.corral.p(q):.{metric.digits}f}",
                f"{metric.baseline.p(q):.{metric.digits}f}",
                _format_ratio(metric.ratio(q)),
                f"{_signed(metric.difference(q), metric.digits)} {metric.unit}",
                _aim_cell(metric, q),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _aim_cell(metric: Metric, q: int) -> str:
    """The aims about percentile `q` of `metric`, each with its verdict."""
    return "; ".join(
        f"{metric.aim_text(aim)}: **{verdict(aim, metric.figure(aim))}**"
        for aim in metric.aims
        if aim.q == q
    )


def aims_table(metrics: list[Metric]) -> str:
    """Every aim of the run: what it asks, the run's figure, and the verdict."""
    lines = ["| aim | measured | verdict |", "| --- | ---: | --- |"]
    for metric in metrics:
        for aim in metric.aims:
            value = metric.figure(aim)
            shown = "n/a" if value is None else _aim_value(aim, value, metric)
            lines.append(
                f"| {metric.title}: {metric.aim_text(aim)} | {shown} | {verdict(aim, value)} |"
            )
    return "\n".join(lines)


def _aim_value(aim: Aim, value: float, metric: Metric) -> str:
    if aim.of == "ratio":
        return f"{value:.2f}×"
    if aim.of == "difference":
        return f"{_signed(value, metric.digits)} {metric.unit}"
    return f"{value:.{metric.digits}f} {metric.unit}"


def _signed(value: float, digits: int) -> str:
    """`value` with a sign and `digits` decimals; what rounds to zero prints as +0."""
    rounded = round(value, digits) or 0.0
    return f"{rounded:+.{digits}f}"


def _format_ratio(value: float | None) -> str:
    """Two decimals, or two significant digits below 0.1 (a pool start is ~0.005×)."""
    if value is None:
        return "n/a"
    return f"{value:.2f}×" if value >= 0.1 else f"{value:.2g}×"


def markdown_report(
    system: dict[str, Any], config: dict[str, Any], metrics: list[Metric], notes: list[str]
) -> str:
    """The Markdown report: header with date and machine, the tables, then `notes`."""
    cores = system["cpu_cores"]
    physical = system.get("cpu_cores_physical")
    core_text = f"{cores} cores" + (f" ({physical} physical)" if physical else "")
    header = [
        "# corral benchmark",
        "",
        f"- Date: {system['date']}",
        f"- Machine: `{system['uname']}`, {system['cpu_model']}, {core_text}, "
        f"{system['memory_gib']:g} GiB",
        f"- Python: {system['python']}",
        f"- Mode: {config['mode']}; total run {config['total_s']:.0f} s",
        f"- Load average (1, 5, 15 min): {_loads(system['load_average_start'])} at the start, "
        f"{_loads(config['load_average_end'])} at the end",
        "",
    ]
    body: list[str] = []
    if any(metric.aims for metric in metrics):
        body += ["## Aims", "", aims_table(metrics), ""]
    for table in TABLES:
        if not any(metric.in_table and metric.table == table.key for metric in metrics):
            continue
        if table.heading is not None:
            body += [f"## {table.heading}", ""]
        body += [markdown_table(metrics, table), ""]
    body += [*(f"- {note}" for note in notes), ""]
    return "\n".join(header + body)


def _loads(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def write_results(directory: Path, document: dict[str, Any], markdown: str) -> list[Path]:
    """Write `latest.json` and `latest.md` into `directory` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / "latest.json"
    md_path = directory / "latest.md"
    json_path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    md_path.write_text(markdown)
    return [json_path, md_path]
