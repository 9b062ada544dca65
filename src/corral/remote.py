"""The CLI's way to the running server: found from the state's runtime file, or named.

Commands that read or change sessions never open a second service on the state (that would
reset what the server holds, `corral.owner`); they call the server's HTTP API with a token.
`connect` finds the server (`--url` overrides discovery); `Remote.call` makes one request
and turns a refusal or an unreachable server into a `corral.errors` class with the server's
own message. `run_once` and `fetch_page` decode the server's JSON into the same typed
results the service returns.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from corral.browser.fetch import PageResult
from corral.config import Settings
from corral.errors import ServerRefused, ServerUnavailable
from corral.kernels.results import ExecutionError, ExecutionResult
from corral.owner import find_server
from corral.server import rest
from corral.server.operation import Handler
from corral.server.routes import operation_of
from corral.tokens import Role, TokenError, load_tokens

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Remote:
    """A running corral server and the token to call it with."""

    url: str  # base URL, no trailing slash
    token: str

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content: bytes | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> Any:
        """One request; the decoded JSON answer (None for 204). `timeout_s` None waits as
        long as the server takes (an execution ends by its own time limit).

        Raises `ServerUnavailable` when the server does not answer and `ServerRefused` with
        its message for any status of 400 and above.
        """
        headers = {"Authorization": f"Bearer {self.token}"}
        try:
            response = httpx.request(
                method,
                f"{self.url}{path}",
                json=body,
                content=content,
                headers=headers,
                timeout=timeout_s,
            )
        except httpx.TransportError as exc:
            raise ServerUnavailable(
                f"the corral server at {self.url} is not reachable ({exc}); "
                "start it with 'corral serve'"
            ) from exc
        if response.status_code >= 400:
            raise ServerRefused(response.status_code, _message_of(response))
        return response.json() if response.content else None

    def invoke(
        self,
        handler: Handler,
        params: Mapping[str, object] | None = None,
        body: Any = None,
        *,
        query: Mapping[str, object] | None = None,
        content: bytes | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> Any:
        """`call` for the operation `handler` serves, its path filled from `params` and
        `query`: a call site names the operation, never its method and path again."""
        op = operation_of(handler)
        path = op.url(params, query)
        return self.call(op.method, path, body, content=content, timeout_s=timeout_s)

    def run_once(self, code: str, language: str, timeout_s: float | None) -> ExecutionResult:
        """`corral run` beside a server: a throw-away session there, deleted afterwards."""
        session = {"id": self.invoke(rest.sessions.create_session, body={})["id"]}
        try:
            body = {"code": code, "language": language, "timeout_s": timeout_s}
            answer = self.invoke(rest.executions.execute_in_session, session, body, timeout_s=None)
        finally:
            self.invoke(rest.sessions.delete_session, session)
        return _result_from(answer)

    def fetch_page(self, url: str, screenshot: bool, timeout_s: float | None) -> PageResult:
        """`corral fetch` beside a server: its browser, under its browsing policy."""
        body = {"url": url, "screenshot": screenshot, "timeout_s": timeout_s}
        return _page_from(self.invoke(rest.browser.browser_fetch, body=body, timeout_s=None))


def connect(settings: Settings, url: str | None = None, *, role: Role = Role.ADMIN) -> Remote:
    """The server to call: `url` when given, else the one owning the state directory.

    Raises `ServerUnavailable` when none runs, `StateOwned` when a process that serves no
    API holds the state, and `ServerUnavailable` when no usable token exists.
    """
    found = discover(settings, url)
    if found is None:
        raise ServerUnavailable(
            f"no corral server is running on {settings.state_dir}; start one with "
            "'corral serve' (or name one with --url)"
        )
    return Remote(found, _token(settings, role))


def discover(settings: Settings, url: str | None = None) -> str | None:
    """The base URL of the server to use, or None when no server owns the state."""
    if url:
        return normal_url(url)
    server = find_server(settings.state_dir)
    return server.url if server is not None else None


def normal_url(url: str) -> str:
    """`url` as a base URL: no trailing slash or `/mcp`."""
    url = url.rstrip("/")
    return url.removesuffix("/mcp") if url.endswith("/mcp") else url


def _token(settings: Settings, role: Role) -> str:
    try:
        tokens = load_tokens(settings.config_dir)
    except TokenError as exc:
        raise ServerUnavailable(f"no usable {role.value} token: {exc}") from exc
    return tokens.admin if role is Role.ADMIN else tokens.agent


def _result_from(data: dict[str, Any]) -> ExecutionResult:
    known = {name: data[name] for name in ExecutionResult.__dataclass_fields__ if name in data}
    error = known.pop("error", None)
    return ExecutionResult(**known, error=ExecutionError(**error) if error else None)


def _page_from(data: dict[str, Any]) -> PageResult:
    known = {name: data[name] for name in PageResult.__dataclass_fields__ if name in data}
    png = data.get("screenshot_png_base64")
    known["screenshot_png"] = base64.b64decode(png) if png else None
    return PageResult(**known)


def _message_of(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message") or response.text)
    except (ValueError, AttributeError):
        return response.text or f"HTTP {response.status_code}"
