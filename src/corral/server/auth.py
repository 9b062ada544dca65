"""The guard in front of every route: Host and Origin checks, bearer tokens, admin routes.

Pure ASGI middleware, so it covers `/mcp` (streamed responses included) exactly like REST.
Order: Host (DNS-rebinding protection), Origin, then the token; a refused Host or Origin on
a path coderunner serves too gets coderunner's 403 and body, so its clients read it as
theirs. Only `GET /health` is open, and `/.well-known/`, which answers 404 (there is no
OAuth here: a client that looks for it learns so, instead of starting a flow). The
dashboard's paths (`cookie_prefix`) pass the Host and Origin checks here and then check
its own login cookie (`corral.dashboard.gate`): no bearer token opens them. The token
comes as `Authorization: Bearer`, or as `X-API-Key` (the InstaVM SDK's header) when no
Authorization header is sent. A server whose tokens could not be loaded answers 503
everywhere else: it fails closed.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.server.responses import error_response
from corral.tokens import Role, Tokens

ADMIN_PREFIX = "/v1/admin/"
ROLE_KEY = "corral.role"
# coderunner's answer to a foreign Host or Origin, on the paths it serves too (its
# test-e2e.sh checks for 403); corral's own routes answer 421 or 403 with an error code.
CODERUNNER_REFUSAL = JSONResponse({"error": "Invalid Host or Origin header"}, status_code=403)
DISCOVERY_PREFIX = "/.well-known/"
NO_OAUTH = (
    "this server does not use OAuth: send its token as 'Authorization: Bearer <token>' or "
    "'X-API-Key: <token>' ('corral mcp-config CLIENT' prints a configuration with it)"
)


def allowed_hosts(host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host header values this server answers to (names with the port)."""
    names = {host, "localhost", "127.0.0.1", "[::1]"} if is_loopback(host) else {host}
    if ":" in host and not host.startswith("["):
        names.add(f"[{host}]")
        names.discard(host)
    hosts = {f"{name}:{port}" for name in names}
    hosts.update(item.strip().lower() for item in extra if item.strip())
    return frozenset(hosts)


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


class Guard:
    """Checks Host, Origin and the bearer token, then records the caller's role in the scope."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Tokens | None,
        token_problem: str | None,
        hosts: frozenset[str],
        coderunner_paths: frozenset[str],
        open_routes: frozenset[tuple[str, str]],
        cookie_prefix: str | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.token_problem = token_problem
        self.hosts = hosts
        self.coderunner_paths = coderunner_paths  # refused Host/Origin as coderunner says it
        self.open_routes = open_routes  # (method, path) reached without a token
        self.cookie_prefix = cookie_prefix  # the dashboard's, which checks its own cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> ASGIApp | None:
        headers = Headers(scope=scope)
        refusal = self._header_refusal(headers)
        if refusal is not None:
            return CODERUNNER_REFUSAL if scope["path"] in self.coderunner_paths else refusal
        if (scope.get("method", "GET"), scope["path"]) in self.open_routes:
            return None
        if self._cookie_path(scope["path"]):
            return None
        if scope["path"].startswith(DISCOVERY_PREFIX):
            return error_response(404, "no_oauth", NO_OAUTH)
        return self._token_refusal(scope, headers)

    def _cookie_path(self, path: str) -> bool:
        prefix = self.cookie_prefix
        return prefix is not None and (path == prefix or path.startswith(prefix + "/"))

    def _header_refusal(self, headers: Headers) -> ASGIApp | None:
        """corral's answer to a foreign Host or Origin, or None when both are this server's."""
        host = headers.get("host", "").lower()
        if host not in self.hosts:
            return error_response(
                421,
                "host_not_allowed",
                f"Host {host!r} is not this server's; DNS rebinding is refused",
            )
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin):
            return error_response(403, "origin_not_allowed", f"Origin {origin!r} is not allowed")
        return None

    def _origin_allowed(self, origin: str) -> bool:
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc.lower() in self.hosts

    def _token_refusal(self, scope: Scope, headers: Headers) -> ASGIApp | None:
        if self.tokens is None:
            return error_response(
                503, "token_unavailable", f"the server has no usable token: {self.token_problem}"
            )
        role = self.tokens.role_of(presented) if (presented := _presented(headers)) else None
        if role is None:
            return error_response(
                401,
                "unauthorized",
                "a valid token is required, as 'Authorization: Bearer <token>' or "
                "'X-API-Key: <token>'",
                {"WWW-Authenticate": 'Bearer realm="corral"'},
            )
        if scope["path"].startswith(ADMIN_PREFIX) and role is not Role.ADMIN:
            return error_response(403, "admin_only", "this route needs the admin token")
        scope.setdefault("state", {})[ROLE_KEY] = role.value
        return None


def _presented(headers: Headers) -> str | None:
    """The token the request presents: its bearer token, else its X-API-Key when it sends no
    Authorization header (one credential a request: a refused bearer is not retried)."""
    authorization = headers.get("authorization")
    if authorization is None:
        return headers.get("x-api-key", "").strip() or None
    scheme, _, presented = authorization.partition(" ")
    return presented.strip() if scheme.lower() == "bearer" else None


def role_of(scope: Scope) -> Role:
    """The role the guard granted this request (agent when called without the guard)."""
    return Role(scope.get("state", {}).get(ROLE_KEY, Role.AGENT.value))
