"""Turning the samples into the results: a JSON document and a Markdown report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import PERCENTILES, Summary, ratio

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Table:
    """One table of the Markdown report: its heading (none for the first) and column names."""

    key: str
    heading: str | None
    sides: tuple[str, str]


# The first table compares sandboxed corral with the unsandboxed baseline; the second, corral
# reached through its server with corral called in-process; the third, connections through the
# egress proxy with the same connections made directly on the host.
TABLES = (
    Table("main", None, ("corral", "baseline")),
    Table("served", "Through the server", ("through the server", "in-process")),
    Table("egress", "Egress", ("through the proxy", "direct on the host")),
)


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

    def ratio(self, q: int) -> float | None:
        """corral / baseline at percentile `q` (None if the baseline is not positive)."""
        return ratio(self.corral.p(q), self.baseline.p(q))

    def difference(self, q: int) -> float:
        """corral - baseline at percentile `q`, in `unit`."""
        return self.corral.p(q) - self.baseline.p(q)

    def to_dict(self) -> dict[str, Any]:
        """Machine-readable form: both summaries, and ratio and difference per percentile."""
        ratios = {f"p{q}": _rounded(self.ratio(q), 4) for q in PERCENTILES}
        return {
            "title": self.title,
            "unit": self.unit,
            "description": self.description,
            "corral": self.corral.to_dict(),
            "baseline": self.baseline.to_dict(),
            "ratio": ratios,
            "difference": {f"p{q}": round(self.difference(q), 3) for q in PERCENTILES},
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
        "metrics": {metric.key: metric.to_dict() for metric in metrics},
    }


def markdown_table(metrics: list[Metric], table: Table = TABLES[0]) -> str:
    """`table`: one row per shown percentile of each of its metrics that is `in_table`."""
    lines = [
        f"| metric | {table.sides[0]} | {table.sides[1]} | ratio | difference |",
        "| --- | ---: | ---: | ---: | ---: |",
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
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _signed(value: float, digits: int) -> str:
    """`value` with a sign and `digits` decimals; what rounds to zero prints as +0."""
    rounded = round(value, digits) or 0.0
    return f"{rounded:+.{digits}f}"


def _format_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}×"


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
        f"- Machine: `{system['uname']}`, {system['cpu_model']}, {core_text}",
        f"- Python: {system['python']}",
        f"- Mode: {'quick' if config['quick'] else 'full'}; total run {config['total_s']:.0f} s",
        "",
    ]
    body: list[str] = []
    for table in TABLES:
        if not any(metric.in_table and metric.table == table.key for metric in metrics):
            continue
        if table.heading is not None:
            body += [f"## {table.heading}", ""]
        body += [markdown_table(metrics, table), ""]
    body += [*(f"- {note}" for note in notes), ""]
    return "\n".join(header + body)


def write_results(directory: Path, document: dict[str, Any], markdown: str) -> list[Path]:
    """Write `latest.json` and `latest.md` into `directory` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / "latest.json"
    md_path = directory / "latest.md"
    json_path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    md_path.write_text(markdown)
    return [json_path, md_path]
