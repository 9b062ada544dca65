"""`corral serve`, `corral mcp-stdio` and `corral mcp-config`: the server and its clients."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from corral import __version__
from corral.cli.base import (
    EXIT_CORRAL_ERROR,
    current_settings,
    err,
    given_url,
    is_loopback,
    main,
    running_server,
    tokens_or_problem,
    url_host,
)
from corral.clients import RENDERERS, client_config
from corral.config import Settings
from corral.errors import CorralError, InvalidInput, StateOwned
from corral.owner import find_server
from corral.protect import validate_protected_names
from corral.remote import discover
from corral.service import Service
from corral.tokens import Role, token_path

if TYPE_CHECKING:
    import socket


@main.command()
@click.option("--host", default=None, help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default 8222).")
@click.option(
    "--allow-remote", is_flag=True, help="Required to bind an address other than loopback."
)
@click.option(
    "--forward-env",
    "forward_env",
    multiple=True,
    metavar="NAME",
    help="Pass this host variable into every sandbox (repeatable; never proxy settings).",
)
@click.option(
    "--mount",
    "mount",
    multiple=True,
    metavar="NAME=PATH[:ro|rw]",
    help="A project folder sessions may ask for by NAME (repeatable; read-only by default).",
)
@click.option(
    "--allow-home-mount", is_flag=True, help="Allow a mount that is your home folder as a whole."
)
@click.option(
    "--protect",
    multiple=True,
    metavar="RELPATH",
    help=(
        "Another path (a file, or a folder and all it holds) that read-write mounts never "
        "pass to the host, like tools/deploy.sh (repeatable)."
    ),
)
def serve(
    host: str | None,
    port: int | None,
    allow_remote: bool,
    forward_env: tuple[str, ...],
    mount: tuple[str, ...],
    allow_home_mount: bool,
    protect: tuple[str, ...],
) -> None:
    """Run the server: MCP at /mcp, the REST API and the dashboard at /ui, on 127.0.0.1:8222
    by default.

    It owns the state directory while it runs: a second server on the same state, or a
    port in use, is refused before anything is printed.
    """
    from corral.server.app import serve as run_server

    settings = current_settings()
    try:
        settings = replace(  # checks the mounts on disk
            settings,
            host=host or settings.host,
            port=port or settings.port,
            forward_env=_joined(settings.forward_env, forward_env),
            mounts=_joined(settings.mounts, mount),
            protected_files=_joined(settings.protected_files, protect),
            allow_home_mount=allow_home_mount or settings.allow_home_mount,
        )
        settings.forwarded_names  # noqa: B018 - validates every name before serving
        validate_protected_names(settings.protected_names)
    except InvalidInput as exc:
        raise click.UsageError(str(exc)) from exc
    if not is_loopback(settings.host):
        if not allow_remote:
            raise click.UsageError(
                f"{settings.host} is not a loopback address; pass "
                "--allow-remote to expose corral beyond this machine"
            )
        err.print(
            f"[bold red]warning:[/bold red] corral listens on {settings.host}: anyone "
            "who can reach it and holds a token can run code here"
        )
    sock = _claim_serving(settings)
    tokens, problem = tokens_or_problem(settings)
    url = f"http://{url_host(settings.host)}:{settings.port}/mcp"
    err.print(f"corral {__version__}: MCP at {url}, REST at {url[:-4]}/v1")
    if tokens is not None:
        err.print(f"agent token: {tokens.agent}", markup=False, highlight=False)
    err.print(
        f"(kept in {token_path(settings.config_dir, Role.AGENT)}; "
        "'corral mcp-config CLIENT' prints a ready client snippet)"
    )
    err.print(
        f"dashboard at {url[:-4]}/ui (log in with the admin token, kept in "
        f"{token_path(settings.config_dir, Role.ADMIN)})",
        markup=False,
        highlight=False,
    )
    if not run_server(settings, Service(settings), tokens, problem, sock=sock):
        sys.exit(EXIT_CORRAL_ERROR)


def _claim_serving(settings: Settings) -> socket.socket:
    """Refuse, in one line and before any banner, a state another process owns or a port
    in use; else the bound socket. (The service takes the state's lock itself when it opens,
    so two servers racing past this check still cannot both own the state.)"""
    from corral.server.app import bind_socket

    try:
        running = find_server(settings.state_dir)
        if running is not None:
            raise StateOwned(settings.state_dir, running.pid, running)
        return bind_socket(settings.host, settings.port)
    except (CorralError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


def _joined(configured: str, given: tuple[str, ...]) -> str:
    return ",".join(filter(None, [configured, *given]))


@main.command("mcp-stdio")
def mcp_stdio() -> None:
    """Serve the MCP tools over standard input and output (for clients that only speak stdio).

    Beside a running server this relays to its /mcp (one set of sessions for every client);
    otherwise it runs its own service, which holds the state directory while it runs.
    """
    import anyio

    remote = running_server(Role.AGENT)
    if remote is not None:
        from corral.server.stdio_relay import relay_stdio

        anyio.run(relay_stdio, remote.mcp_url, remote.token)
        return

    from corral.server.mcp import build_mcp

    async def run() -> None:
        async with Service(current_settings()) as service:
            await build_mcp(service).run_stdio_async()

    try:
        anyio.run(run)
    except StateOwned as exc:
        raise click.ClickException(str(exc)) from exc


@main.command("mcp-config")
@click.argument("client", type=click.Choice(sorted(RENDERERS)))
def mcp_config(client: str) -> None:
    """Print a ready configuration snippet for CLIENT, with the agent token filled in.

    The URL is the running server's (the configured address when none runs). stdout holds
    the snippet alone (redirect it into the file); the file it belongs in goes to stderr.
    """
    settings = current_settings()
    tokens, problem = tokens_or_problem(settings)
    if tokens is None:
        raise click.ClickException(f"no usable token: {problem}")
    try:
        base = discover(settings, given_url())
    except StateOwned:
        base = None  # owned by a service with no HTTP API: the configured address it is
    base = base or f"http://{url_host(settings.host)}:{settings.port}"
    snippet = client_config(client, f"{base}/mcp", tokens.agent)
    if snippet.where is not None:
        click.echo(f"# {snippet.where}", err=True)
    click.echo(snippet.text, nl=False)
