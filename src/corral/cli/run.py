"""`corral doctor`, `corral run` and `corral fetch`: one-off checks, code and pages."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from corral import offline
from corral.cli.base import (
    EXIT_FOR_STATUS,
    current_settings,
    err,
    guarded,
    main,
    out,
    run_async,
    running_server,
)
from corral.doctor import run_checks, status_markup
from corral.kernels.results import ExecutionResult
from corral.server.operation import wire
from corral.server.schemas import ExecutionResultModel, PageModel


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(as_json: bool) -> None:
    """Check that this host can run sandboxes, and say how to fix what is missing."""
    checks = run_checks(current_settings())
    if as_json:
        click.echo(json.dumps([check.__dict__ for check in checks], indent=2))
    else:
        table = Table(title="corral doctor")
        for column in ("check", "status", "detail"):
            table.add_column(column)
        for check in checks:
            status = status_markup(check)
            detail = check.detail + (f"\n[yellow]→ {check.fix}[/yellow]" if check.fix else "")
            table.add_row(check.name, status, detail)
        out.print(table)
    if not all(check.ok for check in checks):
        sys.exit(1)


@main.command()
@click.argument("code", required=False)
@click.option(
    "-f",
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Run this file instead of CODE.",
)
@click.option("-l", "--language", type=click.Choice(["python", "bash"]), default="python")
@click.option("-t", "--timeout", "timeout_s", type=float, default=None, help="Seconds allowed.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
def run(
    code: str | None, path: Path | None, language: str, timeout_s: float | None, as_json: bool
) -> None:
    """Run CODE (or a file) in a one-off sandbox and print what it produced.

    The exit code follows the outcome: 0 ok, 1 the code raised, 3 timeout, 4 interrupted or
    the kernel died, 5 corral itself failed.
    """
    if (code is None) == (path is None):
        raise click.UsageError("give either CODE or --file, not both or neither")
    source = path.read_text() if path is not None else str(code)
    remote = running_server()
    if remote is not None:
        result = guarded(lambda: remote.run_once(source, language, timeout_s))
    else:
        result = run_async(offline.run_once(current_settings(), source, language, timeout_s))
    if as_json:
        click.echo(json.dumps(wire(ExecutionResultModel, result), indent=2))
    else:
        _print_result(result)
    sys.exit(EXIT_FOR_STATUS[result.status])


@main.command()
@click.argument("url")
@click.option("--screenshot", type=click.Path(dir_okay=False, path_type=Path), help="Save a PNG.")
@click.option("-t", "--timeout", "timeout_s", type=float, default=None, help="Page timeout (s).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole page result as JSON.")
def fetch(url: str, screenshot: Path | None, timeout_s: float | None, as_json: bool) -> None:
    """Load URL in a sandboxed browser (browsing policy applies) and print its visible text."""
    remote = running_server()
    if remote is not None:
        page = guarded(lambda: remote.fetch_page(url, screenshot is not None, timeout_s))
    else:
        page = run_async(
            offline.fetch_once(current_settings(), url, screenshot is not None, timeout_s)
        )
    if screenshot is not None and page.screenshot_png is not None:
        screenshot.write_bytes(page.screenshot_png)
    if as_json:
        click.echo(json.dumps(wire(PageModel, page), indent=2))
        return
    click.echo(f"{page.title} <{page.url}>\n")
    click.echo(page.text)
    for note in page.notes():
        err.print(f"[corral] {note}", markup=False, highlight=False)


def _print_result(result: ExecutionResult) -> None:
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    for bundle in result.results:
        _print_bundle(bundle)
    if result.error is not None:
        err.print(
            "\n".join(result.error.traceback) or f"{result.error.ename}: {result.error.evalue}",
            markup=False,
            highlight=False,
        )
    if result.message:
        err.print(f"[corral] {result.message}", markup=False, highlight=False)


def _print_bundle(bundle: dict[str, Any]) -> None:
    images = [mime for mime in bundle if mime.startswith("image/")]
    if "text/plain" in bundle and not images:
        click.echo(bundle["text/plain"])
    for mime in images:
        size = len(base64.b64decode(bundle[mime])) if mime != "image/svg+xml" else len(bundle[mime])
        click.echo(f"[{mime}, {size} bytes]")
