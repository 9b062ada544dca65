"""`corral sessions`, `corral audit` and `corral limits`: what sessions are, did and may use."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from corral import offline
from corral.audit import KINDS
from corral.cli.base import (
    as_admin,
    current_settings,
    guarded,
    main,
    out,
    run_async,
    running_server,
    when,
)
from corral.sandbox.limits import format_size
from corral.server import admin, rest


@main.group()
def sessions() -> None:
    """List, stop and delete stored sessions."""


@sessions.command("list")
@click.option("--json", "as_json", is_flag=True)
def sessions_list(as_json: bool) -> None:
    """List the sessions: the running server's, else those stored under the state directory
    (read without opening a service)."""
    remote = running_server()
    if remote is not None:
        rows = guarded(lambda: remote.invoke(rest.sessions.list_sessions))["sessions"]
        where = remote.url
    else:
        rows = offline.stored_sessions(current_settings())
        where = str(current_settings().state_dir)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"sessions in {where}")
    for column in ("id", "state", "created", "last used"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["id"], row["state"], when(row["created_at"]), when(row["last_used_at"]))
    out.print(table)


@sessions.command("stop")
@click.argument("session_id")
def sessions_stop(session_id: str) -> None:
    """Stop a session's kernels on the running server; its workspace and packages stay."""
    info = as_admin(rest.operator.admin_stop_session, {"id": session_id})
    click.echo(f"{info['id']}: {info['state']}")


@sessions.command("delete")
@click.argument("session_id")
@click.confirmation_option(prompt="Delete the session's workspace and packages?")
def sessions_delete(session_id: str) -> None:
    """Stop a session and delete its workspace, packages and record (on the running server,
    else on the state directory, holding its lock)."""
    remote = running_server()
    if remote is not None:
        guarded(lambda: remote.invoke(admin.delete_session, {"id": session_id}))
    else:
        run_async(offline.delete_session(current_settings(), session_id))
    click.echo(f"{session_id}: deleted")


@main.command()
@click.option("--kind", type=click.Choice(KINDS))
@click.option("--session", "session_id", default=None)
@click.option("--net", is_flag=True, help="Only network decisions (same as --kind network).")
@click.option("--limit", type=click.IntRange(1, 1000), default=50)
@click.option("--before-id", type=int, default=None, help="Page: entries older than this id.")
@click.option("--json", "as_json", is_flag=True)
def audit(
    kind: str | None,
    session_id: str | None,
    net: bool,
    limit: int,
    before_id: int | None,
    as_json: bool,
) -> None:
    """List the audit log, newest first (the running server's, else read from the state)."""
    query = {"kind": "network" if net else kind, "session": session_id, "before_id": before_id}
    query = {name: value for name, value in query.items() if value is not None}
    remote = running_server()
    if remote is not None:
        params = {**query, "limit": limit}
        page = guarded(lambda: remote.invoke(rest.operator.admin_audit, query=params))
    else:
        page = guarded(lambda: offline.audit_page(current_settings(), limit=limit, **query))
    if as_json:
        click.echo(json.dumps(page, indent=2))
        return
    table = Table(title="audit log")
    for column in ("id", "when", "kind", "session", "actor", "what"):
        table.add_column(column)
    for entry in page["entries"]:
        what = entry["action"] or ""
        if entry["status"]:
            what += f" {entry['status']} {entry['duration_s'] or 0:.3f}s"
        table.add_row(
            str(entry["id"]),
            when(entry["at"]),
            entry["kind"],
            entry["session"] or "",
            entry["actor"],
            what,
        )
    out.print(table)
    if page["next_before_id"] is not None:
        out.print(f"more: corral audit --before-id {page['next_before_id']}")


@main.group()
def limits() -> None:
    """Show or change a session's limits on the running server (admin token)."""


@limits.command("show")
@click.argument("session_id")
def limits_show(session_id: str) -> None:
    """The session's limits, what enforces each one, and its usage."""
    _print_limits(as_admin(rest.operator.admin_get_limits, {"id": session_id}))


LIMIT_OPTIONS = {
    "memory": "memory_bytes",
    "cpus": "cpus",
    "tasks": "tasks",
    "workspace": "workspace_bytes",
    "tmp": "tmp_bytes",
    "timeout": "exec_timeout_s",
    "idle": "idle_timeout_s",
    "output": "output_bytes",
    "files": "workspace_files",
}


@limits.command("set")
@click.argument("session_id")
@click.option("--memory", help="Memory, tmpfs included (e.g. 1G).")
@click.option("--cpus", type=float, help="CPUs (e.g. 0.5).")
@click.option("--tasks", type=int, help="Processes and threads.")
@click.option("--workspace", help="Workspace and package prefix size (e.g. 2G).")
@click.option("--tmp", help="Size of /tmp, from the next start (e.g. 256M).")
@click.option("--timeout", type=float, help="Seconds per execution.")
@click.option("--idle", type=float, help="Seconds idle before the kernels stop.")
@click.option("--output", help="Output bytes per execution.")
@click.option("--files", type=int, help="Files in the workspace and package prefix.")
def limits_set(session_id: str, **values: Any) -> None:
    """Change limits; a running session changes at once where the mechanism allows."""
    changes = {LIMIT_OPTIONS[k]: v for k, v in values.items() if v is not None}
    if not changes:
        raise click.UsageError("name at least one limit to change, e.g. --memory 1G")
    report = as_admin(rest.operator.admin_set_limits, {"id": session_id}, changes)
    _print_limits(report)
    if report.get("changed_at_next_start"):
        click.echo(f"from the next start: {', '.join(report['changed_at_next_start'])}")


def _print_limits(report: dict[str, Any]) -> None:
    values = report["limits"]
    click.echo(f"session {report['session_id']}: limits enforced by {report['mechanism']}")
    for name, value in values.items():
        shown = format_size(value) if name.endswith("_bytes") else f"{value:g}"
        click.echo(f"  {name:16} {shown}")
    usage = report.get("usage")
    if usage:
        click.echo(f"  using {format_size(usage['memory_bytes'])} and {usage['tasks']} tasks")
    if report.get("best_effort"):
        weak = ", ".join(report["best_effort"])
        click.echo(f"  best effort here (held by a watchdog, not the kernel): {weak}")
