"""`corral secrets`: the operator's secrets on the running server (admin token)."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from corral.cli.base import as_admin, main, out
from corral.server import rest


@main.group("secrets")
def secrets_group() -> None:
    """Secrets a sandbox uses but never sees: it holds a placeholder, and the proxy puts the
    value into plain-HTTP requests to the secret's hosts only (admin token)."""


@secrets_group.command("add")
@click.argument("name")
@click.option("--from-env", "from_env", metavar="VAR", help="The server's variable holding it.")
@click.option(
    "--from-file",
    "from_file",
    metavar="PATH",
    type=click.Path(dir_okay=False, resolve_path=True),
    help="A file the server reads it from (its first 64 KiB, without the final newline).",
)
@click.option(
    "--hosts",
    required=True,
    metavar="HOST[,HOST...]",
    help="Where it may be sent: allowlist entries (domain, *.domain, host:port, address).",
)
def secrets_add(name: str, from_env: str | None, from_file: str | None, hosts: str) -> None:
    """Define secret NAME (the variable sessions see) by where its value comes from."""
    if (from_env is None) == (from_file is None):
        raise click.UsageError("give exactly one of --from-env and --from-file")
    body: dict[str, Any] = {"hosts": [h.strip() for h in hosts.split(",") if h.strip()]}
    body.update({"from_env": from_env} if from_env else {"from_file": from_file})
    made = as_admin(rest.secrets.admin_put_secret, {"secret": name}, body)
    click.echo(f"secret {made['name']}: from {_source(made)}, for {', '.join(made['hosts'])}")
    click.echo(f"attach it to a session: corral secrets attach SESSION {made['name']}")


@secrets_group.command("list")
def secrets_list() -> None:
    """The secrets, where each comes from, where it may go and who holds it (no values)."""
    listed = as_admin(rest.secrets.admin_list_secrets)["secrets"]
    if not listed:
        click.echo("no secrets; add one with 'corral secrets add NAME --from-env VAR --hosts H'")
        return
    table = Table("name", "from", "hosts", "sessions")
    for item in listed:
        table.add_row(
            item["name"], _source(item), ", ".join(item["hosts"]), ", ".join(item["sessions"])
        )
    out.print(table)


@secrets_group.command("remove")
@click.argument("name")
def secrets_remove(name: str) -> None:
    """Forget secret NAME: every session loses it from its next request."""
    as_admin(rest.secrets.admin_delete_secret, {"secret": name})
    click.echo(f"secret {name} removed; requests carrying it are refused from now on")


@secrets_group.command("attach")
@click.argument("session_id")
@click.argument("name")
def secrets_attach(session_id: str, name: str) -> None:
    """Give SESSION the secret NAME (as a placeholder variable, from its next start)."""
    _print_attachment(
        as_admin(rest.secrets.admin_attach_secret, {"id": session_id, "secret": name})
    )


@secrets_group.command("detach")
@click.argument("session_id")
@click.argument("name")
def secrets_detach(session_id: str, name: str) -> None:
    """Take secret NAME from SESSION (refused from its next request)."""
    _print_attachment(
        as_admin(rest.secrets.admin_detach_secret, {"id": session_id, "secret": name})
    )


def _source(item: dict[str, Any]) -> str:
    return f"${item['location']}" if item["source"] == "env" else item["location"]


def _print_attachment(report: dict[str, Any]) -> None:
    session, name = report["session_id"], report["name"]
    if report["attached"]:
        click.echo(f"session {session} holds secret {name}")
        when = "at its next kernel start"
        if report["restart_needed"]:
            when += f" (its kernels run: corral sessions stop {session}, or restart it)"
        click.echo(f"its sandbox sees ${name} as a placeholder {when}")
    else:
        click.echo(f"session {session} no longer holds secret {name}; the proxy refuses it now")
