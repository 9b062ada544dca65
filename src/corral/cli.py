"""The `corral` command line: doctor, run, sessions and serve.

A thin caller of `Service`: it parses arguments, calls, and prints; corral errors become a
message on stderr and a non-zero exit code.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from corral import __version__
from corral.config import Settings
from corral.doctor import run_checks
from corral.errors import CorralError, InvalidInput
from corral.kernels.results import ExecutionResult
from corral.service import Service
from corral.store import Store

EXIT_FOR_STATUS = {"ok": 0, "error": 1, "timeout": 3, "interrupted": 4, "died": 4}
EXIT_CORRAL_ERROR = 5

out = Console()
err = Console(stderr=True)


@click.group()
@click.version_option(__version__, prog_name="corral")
def main() -> None:
    """corral: a local sandbox where AI agents run code."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(as_json: bool) -> None:
    """Check that this host can run sandboxes, and say how to fix what is missing."""
    checks = run_checks(_settings())
    if as_json:
        click.echo(json.dumps([check.__dict__ for check in checks], indent=2))
    else:
        table = Table(title="corral doctor")
        for column in ("check", "status", "detail"):
            table.add_column(column)
        for check in checks:
            status = "[green]ok[/green]" if check.ok else "[red]FAILED[/red]"
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
    with tempfile.TemporaryDirectory(prefix="corral-run-") as tmp:
        settings = replace(_settings(), state_dir=Path(tmp) / "state")
        result = _call(_run_once(settings, source, language, timeout_s))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print_result(result)
    sys.exit(EXIT_FOR_STATUS[result.status])


async def _run_once(
    settings: Settings, code: str, language: str, timeout_s: float | None
) -> ExecutionResult:
    async with Service(settings) as service:
        await service.create_session("run")
        return await service.execute(code, session_id="run", language=language, timeout_s=timeout_s)


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


@main.group()
def sessions() -> None:
    """List, stop and delete stored sessions."""


@sessions.command("list")
@click.option("--json", "as_json", is_flag=True)
def sessions_list(as_json: bool) -> None:
    """List the sessions stored under the state directory."""
    records = _store().all()
    if as_json:
        click.echo(json.dumps([record.__dict__ for record in records], indent=2))
        return
    table = Table(title=f"sessions in {_settings().state_dir}")
    for column in ("id", "state", "created", "last used"):
        table.add_column(column)
    for record in records:
        table.add_row(record.id, record.state, _when(record.created_at), _when(record.last_used_at))
    out.print(table)


@sessions.command("stop")
@click.argument("session_id")
def sessions_stop(session_id: str) -> None:
    """Stop a session's kernels; its workspace and packages stay."""
    info = _call(_with_service(lambda service: service.stop_session(session_id)))
    click.echo(f"{info.id}: {info.state}")


@sessions.command("delete")
@click.argument("session_id")
@click.confirmation_option(prompt="Delete the session's workspace and packages?")
def sessions_delete(session_id: str) -> None:
    """Stop a session and delete its workspace, packages and record."""
    _call(_with_service(lambda service: service.delete_session(session_id)))
    click.echo(f"{session_id}: deleted")


@main.command()
def serve() -> None:
    """Check the host, then run a demo execution (the server arrives with the server issue)."""
    settings = _settings()
    checks = run_checks(settings)
    for check in checks:
        mark = "ok" if check.ok else "FAILED"
        click.echo(f"{mark:>6}  {check.name}: {check.detail}")
    if not all(check.ok for check in checks):
        sys.exit(1)
    result = _call(
        _run_once(
            replace(settings, state_dir=settings.state_dir / "demo"),
            "import sys, platform\nprint('corral sandbox:', platform.node(), "
            "sys.version.split()[0])\n1 + 1",
            "python",
            None,
        )
    )
    _print_result(result)


async def _with_service(action: Any) -> Any:
    async with Service(_settings()) as service:
        return await action(service)


def _call(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except CorralError as exc:
        err.print(f"corral: {exc}", markup=False, highlight=False)
        sys.exit(EXIT_CORRAL_ERROR)


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except InvalidInput as exc:
        raise click.UsageError(str(exc)) from exc


def _store() -> Store:
    return Store(_settings().db_path)


def _when(epoch: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")
