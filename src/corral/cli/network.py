"""`corral net` and `corral bridge`: a session's network policy, access requests and SSH agent."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from corral.cli.base import (
    as_admin,
    main,
    out,
)
from corral.server import rest


@main.group()
def bridge() -> None:
    """Turn a session's SSH agent bridge on or off (admin token; applies at its next start)."""


@bridge.command("enable")
@click.argument("session_id")
def bridge_enable(session_id: str) -> None:
    """Let SESSION use this server's SSH agent through the bridge (keys stay on the host)."""
    _print_bridge(as_admin(rest.operator.admin_set_bridge, {"id": session_id}, {"ssh_agent": True}))


@bridge.command("disable")
@click.argument("session_id")
def bridge_disable(session_id: str) -> None:
    """Turn SESSION's bridge off."""
    _print_bridge(
        as_admin(rest.operator.admin_set_bridge, {"id": session_id}, {"ssh_agent": False})
    )


def _print_bridge(report: dict[str, Any]) -> None:
    state = "enabled" if report["ssh_agent"] else "disabled"
    click.echo(f"session {report['session_id']}: SSH agent bridge {state}")
    if report["restart_needed"]:
        click.echo(f"restart the session to apply: corral sessions stop {report['session_id']}")


@main.group()
def net() -> None:
    """Show and change a session's network policy on the running server (admin token)."""


@net.command("show")
@click.argument("session_id")
def net_show(session_id: str) -> None:
    """Print the session's mode, allowlist and proxy counters."""
    _print_policy(as_admin(rest.network.admin_get_network, {"id": session_id}))


@net.command("allow")
@click.argument("session_id")
@click.argument("hosts", nargs=-1, required=True)
def net_allow(session_id: str, hosts: tuple[str, ...]) -> None:
    """Allow HOSTS (domain, *.domain, host:port, IP, CIDR or a preset: pypi, npm, github,
    huggingface). A session with no network becomes an allowlist."""
    _print_policy(
        as_admin(rest.network.admin_allow_network, {"id": session_id}, {"hosts": list(hosts)})
    )


@net.command("deny")
@click.argument("session_id")
@click.argument("hosts", nargs=-1, required=True)
def net_deny(session_id: str, hosts: tuple[str, ...]) -> None:
    """Remove HOSTS from the allowlist; open tunnels to them are closed at once."""
    _print_policy(
        as_admin(rest.network.admin_deny_network, {"id": session_id}, {"hosts": list(hosts)})
    )


@net.command("set")
@click.argument("session_id")
@click.argument("mode", type=click.Choice(["none", "allowlist", "public"]))
@click.argument("hosts", nargs=-1)
def net_set(session_id: str, mode: str, hosts: tuple[str, ...]) -> None:
    """Replace the policy: MODE and, for an allowlist, its HOSTS."""
    _print_policy(
        as_admin(
            rest.network.admin_set_network, {"id": session_id}, {"mode": mode, "allow": list(hosts)}
        )
    )


@net.command("requests")
@click.option("--all", "show_all", is_flag=True, help="Decided requests too.")
def net_requests(show_all: bool) -> None:
    """Agents' requests for access (pending ones unless --all)."""
    query = {"status": None if show_all else "pending"}
    found = as_admin(rest.network.admin_network_requests, query=query)["requests"]
    table = Table(title="network requests")
    for column in ("id", "session", "hosts", "reason", "status"):
        table.add_column(column)
    for item in found:
        table.add_row(
            str(item["id"]),
            item["session"],
            " ".join(item["hosts"]),
            item["reason"],
            item["status"],
        )
    out.print(table)


@net.command("approve")
@click.argument("request_id", type=int)
def net_approve(request_id: int) -> None:
    """Approve a request: its hosts join the session's allowlist."""
    decided = as_admin(rest.network.admin_approve_request, {"rid": request_id})
    click.echo(f"request {decided['id']}: {decided['status']} ({' '.join(decided['hosts'])})")


@net.command("reject")
@click.argument("request_id", type=int)
def net_reject(request_id: int) -> None:
    """Reject a request."""
    decided = as_admin(rest.network.admin_reject_request, {"rid": request_id})
    click.echo(f"request {decided['id']}: {decided['status']}")


def _print_policy(policy: dict[str, Any]) -> None:
    click.echo(f"mode: {policy['mode']}")
    for entry in policy["allow"]:
        click.echo(f"  allow {entry}")
    for held in policy.get("secrets") or ():
        hosts = ", ".join(held["hosts"])
        click.echo(f"  secret {held['name']} for {hosts} (HTTPS to them is read by the proxy)")
    if policy.get("tunnels_closed"):
        click.echo(f"closed {policy['tunnels_closed']} open connection(s)")
    if policy.get("stats"):
        stats = policy["stats"]
        click.echo(
            f"connections: {stats['connections']} ({stats['refused']} refused, "
            f"{stats['active']} open); bytes out {stats['bytes_out']}, "
            f"in {stats['bytes_in']}"
        )
