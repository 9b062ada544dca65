"""The `corral` command line: doctor, run, sessions and serve.

A thin caller: it parses arguments, calls, and prints; corral errors become a message on
stderr and a non-zero exit code. Only one process owns a state directory (`corral.owner`):
commands that read or change sessions, the audit log or skills go through the running
server's HTTP API (`corral.remote`; `corral --url URL` names one). When no server runs,
they act on the state through `corral.offline`, the one module that does; `serve` and
`mcp-stdio` alone run a service of their own, which holds the state's lock.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from corral import __version__, offline
from corral.audit import KINDS
from corral.clients import RENDERERS, client_config
from corral.config import Settings
from corral.doctor import run_checks, status_markup
from corral.errors import CorralError, InvalidInput, StateOwned
from corral.kernels.results import ExecutionResult
from corral.owner import find_server
from corral.protect import validate_protected_names
from corral.remote import Remote, connect, discover
from corral.sandbox.limits import format_size
from corral.server import admin, rest
from corral.server.operation import Handler, wire
from corral.server.schemas import ExecutionResultModel, PageModel, SkillList
from corral.service import Service
from corral.skills import user_dir
from corral.texts import skills_text
from corral.tokens import Role, TokenError, Tokens, load_tokens, token_path

if TYPE_CHECKING:
    import socket

T = TypeVar("T")
EXIT_FOR_STATUS = {"ok": 0, "error": 1, "timeout": 3, "interrupted": 4, "died": 4}
EXIT_CORRAL_ERROR = 5

out = Console()
# Messages are never wrapped: a script greps them, and a break inside an address breaks that.
err = Console(stderr=True, soft_wrap=True)


@click.group()
@click.version_option(__version__, prog_name="corral")
@click.option(
    "--url",
    envvar="CORRAL_URL",
    default=None,
    metavar="URL",
    help="The corral server to call (default: the one running on the state directory).",
)
@click.pass_context
def main(ctx: click.Context, url: str | None) -> None:
    """corral: a local sandbox where AI agents run code."""
    ctx.obj = url


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
    remote = _running_server()
    if remote is not None:
        result = _guarded(lambda: remote.run_once(source, language, timeout_s))
    else:
        result = _call(offline.run_once(_settings(), source, language, timeout_s))
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
    remote = _running_server()
    if remote is not None:
        page = _guarded(lambda: remote.fetch_page(url, screenshot is not None, timeout_s))
    else:
        page = _call(offline.fetch_once(_settings(), url, screenshot is not None, timeout_s))
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


@main.group()
def sessions() -> None:
    """List, stop and delete stored sessions."""


@sessions.command("list")
@click.option("--json", "as_json", is_flag=True)
def sessions_list(as_json: bool) -> None:
    """List the sessions: the running server's, else those stored under the state directory
    (read without opening a service)."""
    remote = _running_server()
    if remote is not None:
        rows = _guarded(lambda: remote.invoke(rest.list_sessions))["sessions"]
        where = remote.url
    else:
        rows = offline.stored_sessions(_settings())
        where = str(_settings().state_dir)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"sessions in {where}")
    for column in ("id", "state", "created", "last used"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["id"], row["state"], _when(row["created_at"]), _when(row["last_used_at"]))
    out.print(table)


@sessions.command("stop")
@click.argument("session_id")
def sessions_stop(session_id: str) -> None:
    """Stop a session's kernels on the running server; its workspace and packages stay."""
    info = _admin(rest.admin_stop_session, {"id": session_id})
    click.echo(f"{info['id']}: {info['state']}")


@sessions.command("delete")
@click.argument("session_id")
@click.confirmation_option(prompt="Delete the session's workspace and packages?")
def sessions_delete(session_id: str) -> None:
    """Stop a session and delete its workspace, packages and record (on the running server,
    else on the state directory, holding its lock)."""
    remote = _running_server()
    if remote is not None:
        _guarded(lambda: remote.invoke(admin.delete_session, {"id": session_id}))
    else:
        _call(offline.delete_session(_settings(), session_id))
    click.echo(f"{session_id}: deleted")


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
    """Run the server: MCP at /mcp and the REST API, on 127.0.0.1:8222 by default.

    It owns the state directory while it runs: a second server on the same state, or a
    port in use, is refused before anything is printed.
    """
    from corral.server.app import serve as run_server

    settings = _settings()
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
    tokens, problem = _tokens_or_problem(settings)
    url = f"http://{_url_host(settings.host)}:{settings.port}/mcp"
    err.print(f"corral {__version__}: MCP at {url}, REST at {url[:-4]}/v1")
    if tokens is not None:
        err.print(f"agent token: {tokens.agent}", markup=False, highlight=False)
    err.print(
        f"(kept in {token_path(settings.config_dir, Role.AGENT)}; "
        "'corral mcp-config CLIENT' prints a ready client snippet)"
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

    remote = _running_server(Role.AGENT)
    if remote is not None:
        from corral.server.stdio_relay import relay_stdio

        anyio.run(relay_stdio, remote.mcp_url, remote.token)
        return

    from corral.server.mcp import build_mcp

    async def run() -> None:
        async with Service(_settings()) as service:
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
    settings = _settings()
    tokens, problem = _tokens_or_problem(settings)
    if tokens is None:
        raise click.ClickException(f"no usable token: {problem}")
    try:
        base = discover(settings, _given_url())
    except StateOwned:
        base = None  # owned by a service with no HTTP API: the configured address it is
    base = base or f"http://{_url_host(settings.host)}:{settings.port}"
    snippet = client_config(client, f"{base}/mcp", tokens.agent)
    if snippet.where is not None:
        click.echo(f"# {snippet.where}", err=True)
    click.echo(snippet.text, nl=False)


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
    remote = _running_server()
    if remote is not None:
        params = {**query, "limit": limit}
        page = _guarded(lambda: remote.invoke(rest.admin_audit, query=params))
    else:
        page = _guarded(lambda: offline.audit_page(_settings(), limit=limit, **query))
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
            _when(entry["at"]),
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
    _print_limits(_admin(rest.admin_get_limits, {"id": session_id}))


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
    report = _admin(rest.admin_set_limits, {"id": session_id}, changes)
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


@main.group()
def skills() -> None:
    """The skills: the shipped ones and yours (a folder under the config directory)."""


@skills.command("path")
def skills_path() -> None:
    """Print the folder for your own skills (drop a skill folder or a .zip there)."""
    folder = user_dir(_settings().config_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    click.echo(folder)


@skills.command("list")
def skills_list() -> None:
    """List every skill (unpacking .zip files waiting in your folder first): the running
    server's listing, else read here."""
    remote = _running_server()
    if remote is not None:
        listed = _guarded(lambda: remote.invoke(rest.list_skills))
        click.echo(skills_text(SkillList.model_validate(listed)))
    else:
        click.echo(skills_text(offline.skill_listing(_settings())))


@skills.command("add")
@click.argument("archive", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def skills_add(archive: Path) -> None:
    """Unpack a skill .zip into your folder, with the size, count and path checks (done by
    the running server when one runs, else here)."""
    if not archive.name.endswith(".zip"):
        raise click.UsageError("a skill archive is a .zip file")
    remote = _running_server()
    if remote is not None:
        data = archive.read_bytes()
        name = {"name": archive.name}
        added = _guarded(lambda: remote.invoke(admin.add_skill, query=name, content=data))
        click.echo(f"added skill {added['name']} ({added['path']})")
        return
    added = _guarded(lambda: offline.add_skill(_settings(), archive))
    click.echo(f"added skill {added.name} ({added})")


@main.group()
def bridge() -> None:
    """Turn a session's SSH agent bridge on or off (admin token; applies at its next start)."""


@bridge.command("enable")
@click.argument("session_id")
def bridge_enable(session_id: str) -> None:
    """Let SESSION use this server's SSH agent through the bridge (keys stay on the host)."""
    _print_bridge(_admin(rest.admin_set_bridge, {"id": session_id}, {"ssh_agent": True}))


@bridge.command("disable")
@click.argument("session_id")
def bridge_disable(session_id: str) -> None:
    """Turn SESSION's bridge off."""
    _print_bridge(_admin(rest.admin_set_bridge, {"id": session_id}, {"ssh_agent": False}))


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
    _print_policy(_admin(rest.admin_get_network, {"id": session_id}))


@net.command("allow")
@click.argument("session_id")
@click.argument("hosts", nargs=-1, required=True)
def net_allow(session_id: str, hosts: tuple[str, ...]) -> None:
    """Allow HOSTS (domain, *.domain, host:port, IP, CIDR or a preset: pypi, npm, github,
    huggingface). A session with no network becomes an allowlist."""
    _print_policy(_admin(rest.admin_allow_network, {"id": session_id}, {"hosts": list(hosts)}))


@net.command("deny")
@click.argument("session_id")
@click.argument("hosts", nargs=-1, required=True)
def net_deny(session_id: str, hosts: tuple[str, ...]) -> None:
    """Remove HOSTS from the allowlist; open tunnels to them are closed at once."""
    _print_policy(_admin(rest.admin_deny_network, {"id": session_id}, {"hosts": list(hosts)}))


@net.command("set")
@click.argument("session_id")
@click.argument("mode", type=click.Choice(["none", "allowlist", "public"]))
@click.argument("hosts", nargs=-1)
def net_set(session_id: str, mode: str, hosts: tuple[str, ...]) -> None:
    """Replace the policy: MODE and, for an allowlist, its HOSTS."""
    _print_policy(
        _admin(rest.admin_set_network, {"id": session_id}, {"mode": mode, "allow": list(hosts)})
    )


@net.command("requests")
@click.option("--all", "show_all", is_flag=True, help="Decided requests too.")
def net_requests(show_all: bool) -> None:
    """Agents' requests for access (pending ones unless --all)."""
    query = {"status": None if show_all else "pending"}
    found = _admin(rest.admin_network_requests, query=query)["requests"]
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
    decided = _admin(rest.admin_approve_request, {"rid": request_id})
    click.echo(f"request {decided['id']}: {decided['status']} ({' '.join(decided['hosts'])})")


@net.command("reject")
@click.argument("request_id", type=int)
def net_reject(request_id: int) -> None:
    """Reject a request."""
    decided = _admin(rest.admin_reject_request, {"rid": request_id})
    click.echo(f"request {decided['id']}: {decided['status']}")


def _admin(
    handler: Handler,
    params: Mapping[str, object] | None = None,
    body: dict[str, Any] | None = None,
    *,
    query: Mapping[str, object] | None = None,
) -> Any:
    """Call the operation `handler` serves on the running server with the admin token; one
    line and exit 1 when no server runs or it refuses."""
    remote = _guarded(lambda: connect(_settings(), _given_url()))
    return _guarded(lambda: remote.invoke(handler, params, body, query=query))


def _running_server(role: Role = Role.ADMIN) -> Remote | None:
    """The running server (or the one `--url` names) to call with `role`'s token, or None
    when no process owns the state, or the owner serves no API (commands then work on the
    state themselves; a service refuses it while it is owned)."""
    settings = _settings()
    try:
        if discover(settings, _given_url()) is None:
            return None
    except StateOwned:
        return None
    return _guarded(lambda: connect(settings, _given_url(), role=role))


def _guarded(call: Callable[[], T]) -> T:
    """`call()`, with a corral error as one line on stderr and exit 1."""
    try:
        return call()
    except CorralError as exc:
        raise click.ClickException(str(exc)) from exc


def _given_url() -> str | None:
    """The server named by `corral --url` (or CORRAL_URL)."""
    context = click.get_current_context(silent=True)
    url = context.find_root().obj if context is not None else None
    return url if isinstance(url, str) else None


def _print_policy(policy: dict[str, Any]) -> None:
    click.echo(f"mode: {policy['mode']}")
    for entry in policy["allow"]:
        click.echo(f"  allow {entry}")
    if policy.get("tunnels_closed"):
        click.echo(f"closed {policy['tunnels_closed']} open connection(s)")
    if policy.get("stats"):
        stats = policy["stats"]
        click.echo(
            f"connections: {stats['connections']} ({stats['refused']} refused, "
            f"{stats['active']} open); bytes out {stats['bytes_out']}, "
            f"in {stats['bytes_in']}"
        )


def _tokens_or_problem(settings: Settings) -> tuple[Tokens | None, str | None]:
    try:
        return load_tokens(settings.config_dir), None
    except TokenError as exc:
        return None, str(exc)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


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


def _when(epoch: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")
