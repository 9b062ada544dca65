"""What every command of the `corral` command line shares: the group, the consoles, exit
codes, the settings, and the way to the running server (see the package's docstring)."""

from __future__ import annotations

import asyncio
import ipaddress
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click
from rich.console import Console

from corral import __version__
from corral.config import Settings
from corral.errors import CorralError, InvalidInput, StateOwned
from corral.remote import Remote, connect, discover
from corral.server.operation import Handler
from corral.tokens import Role, TokenError, Tokens, load_tokens

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


def as_admin(
    handler: Handler,
    params: Mapping[str, object] | None = None,
    body: dict[str, Any] | None = None,
    *,
    query: Mapping[str, object] | None = None,
) -> Any:
    """Call the operation `handler` serves on the running server with the admin token; one
    line and exit 1 when no server runs or it refuses."""
    remote = guarded(lambda: connect(current_settings(), given_url()))
    return guarded(lambda: remote.invoke(handler, params, body, query=query))


def running_server(role: Role = Role.ADMIN) -> Remote | None:
    """The running server (or the one `--url` names) to call with `role`'s token, or None
    when no process owns the state, or the owner serves no API (commands then work on the
    state themselves; a service refuses it while it is owned)."""
    settings = current_settings()
    try:
        if discover(settings, given_url()) is None:
            return None
    except StateOwned:
        return None
    return guarded(lambda: connect(settings, given_url(), role=role))


def guarded(call: Callable[[], T]) -> T:
    """`call()`, with a corral error as one line on stderr and exit 1."""
    try:
        return call()
    except CorralError as exc:
        raise click.ClickException(str(exc)) from exc


def given_url() -> str | None:
    """The server named by `corral --url` (or CORRAL_URL)."""
    context = click.get_current_context(silent=True)
    url = context.find_root().obj if context is not None else None
    return url if isinstance(url, str) else None


def tokens_or_problem(settings: Settings) -> tuple[Tokens | None, str | None]:
    try:
        return load_tokens(settings.config_dir), None
    except TokenError as exc:
        return None, str(exc)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run_async(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except CorralError as exc:
        err.print(f"corral: {exc}", markup=False, highlight=False)
        sys.exit(EXIT_CORRAL_ERROR)


def current_settings() -> Settings:
    try:
        return Settings.from_env()
    except InvalidInput as exc:
        raise click.UsageError(str(exc)) from exc


def when(epoch: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")
