"""Assembling the server: REST, coderunner routes and MCP in one Starlette app, behind the guard.

`build_app` wires everything to one `Service`; `serve` runs it under uvicorn. Shutting down
(SIGINT, SIGTERM) runs the lifespan exit, which stops every sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
from collections.abc import AsyncIterator
from types import FrameType

import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from corral.config import Settings
from corral.dashboard.app import Dashboard
from corral.dashboard.gate import PREFIX
from corral.errors import AddressInUse
from corral.owner import ServerInfo
from corral.server import compat
from corral.server.auth import Guard, allowed_hosts, is_loopback
from corral.server.body import BodyLimit
from corral.server.errors import HANDLERS
from corral.server.mcp import build_mcp
from corral.server.meta import Health
from corral.server.openapi import document
from corral.server.protocol import bounded_protocol
from corral.server.routes import OPERATIONS, routes
from corral.service import Service
from corral.tokens import Tokens

log = logging.getLogger(__name__)


def build_app(
    settings: Settings,
    service: Service,
    tokens: Tokens | None,
    token_problem: str | None = None,
    *,
    check_host: bool = True,
) -> ASGIApp:
    """The whole server as one ASGI app; `tokens` None makes it fail closed (503)."""
    hosts = allowed_hosts(settings.host, settings.port, settings.allowed_hosts.split(","))
    mcp = build_mcp(service)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=check_host,
        allowed_hosts=sorted(hosts),
        allowed_origins=sorted(
            f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")
        ),
    )
    mcp_app = mcp.streamable_http_app(
        streamable_http_path="/mcp", transport_security=security, host=settings.host
    )
    health = Health()
    dashboard = Dashboard(service, tokens, settings, secure=not is_loopback(settings.host))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with service, mcp.session_manager.run():
            await health.refresh(settings)
            yield

    app = Starlette(
        routes=[
            *routes(),
            *_mcp_routes(mcp_app),
            *dashboard.routes(),
        ],
        lifespan=lifespan,
        exception_handlers=HANDLERS,
    )
    app.state.service = service
    app.state.health = health
    app.state.openapi = document()
    limited = BodyLimit(
        app,
        max_bytes=settings.max_body_bytes,
        upload_bytes=settings.max_upload_bytes,
        idle_s=settings.body_idle_timeout_s,
        total_s=settings.body_timeout_s,
    )
    return Guard(
        limited,
        tokens=tokens,
        token_problem=token_problem,
        hosts=hosts,
        coderunner_paths=compat.PATHS,
        open_routes=_open_routes(),
        cookie_prefix=PREFIX,
    )


def _mcp_routes(mcp_app: Starlette) -> list[BaseRoute]:
    """The MCP app's own routes, taken into ours rather than mounted at /: a mount there
    would match every path, so a known path with another method would be its 404, not 405.
    Its lifespan runs in ours; it has no middleware of its own (no MCP auth is configured)."""
    if mcp_app.user_middleware:
        raise RuntimeError("the MCP app has middleware of its own; mount it instead")
    return list(mcp_app.routes)


def _open_routes() -> frozenset[tuple[str, str]]:
    """What the guard lets through without a token: the operations declared `open`."""
    methods = {"GET": ("GET", "HEAD")}
    return frozenset(
        (method, op.path)
        for op in OPERATIONS
        if op.open
        for method in methods.get(op.method, (op.method,))
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """The server's listening address, bound now so a taken port is refused before anything
    starts (`AddressInUse`); uvicorn listens on it once the service is open."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(host, port) from exc
        raise
    return sock


def serve(
    settings: Settings,
    service: Service,
    tokens: Tokens | None,
    token_problem: str | None = None,
    *,
    sock: socket.socket | None = None,
) -> bool:
    """Run the server in the foreground until SIGINT or SIGTERM; False when it never started
    (the service could not open: the state is owned, say).

    The runtime file (`corral.owner`) is published once the socket listens and removed when
    the service closes.
    """
    configure_logging()
    raise_open_file_limit()
    forbid_core_dumps()
    app = build_app(settings, service, tokens, token_problem)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        lifespan="on",
        timeout_graceful_shutdown=10,
        server_header=False,
        http=bounded_protocol(settings.header_timeout_s),
        # Longer than clients keep an idle connection (httpx 5 s, aiohttp 15 s): the client
        # lets it go first, never reusing one the server is closing at that moment.
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=settings.max_connections,
    )
    server = _Server(config, service)
    server.run(sockets=[sock or bind_socket(settings.host, settings.port)])
    return server.started


KEEP_ALIVE_S = 75  # as nginx; uvicorn's own 5 s raced httpx's pool
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging() -> None:
    """One plain line per record on stderr (a traceback only for a real crash).

    Done before the MCP SDK is set up, which would otherwise give the root logger its rich
    handler: a record wrapped and padded over several lines, and a boxed traceback that
    took the event loop seconds to draw."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def raise_open_file_limit() -> None:
    """Raise this process's soft limit on open files to the account's hard limit.

    Login shells give an ordinary user 1024, which a few dozen sessions (kernel sockets,
    pipes, proxy connections) use up. A sandbox gains nothing from it: any process may raise
    its own soft limit to the hard one.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("open file limit raised from %d to %d", soft, hard)


def forbid_core_dumps() -> None:
    """No core file of this process: it holds the secrets' values while it puts them into
    requests, and a dump would write them to disk."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _Server(uvicorn.Server):
    """uvicorn's server, telling the service first when a signal asks it to stop: running
    calls are interrupted and queued ones refused, so each ends with an answer rather than
    being cut at the end of the graceful period."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            port = sockets[0].getsockname()[1] if sockets else self.config.port
            self.service.owner.publish(ServerInfo.for_address(self.config.host, port))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.loop is not None and not self.should_exit:
            self.loop.call_soon_threadsafe(self.service.begin_shutdown)
        super().handle_exit(sig, frame)
