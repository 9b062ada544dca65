"""The agent bridge: the host end of a session's opt-in relay to the user's SSH agent.

Off by default. When the operator enables it for a session, the server listens on one unix
socket in that session's run directory, the only place the sandbox can reach it; inside,
`bridge_shim.py` serves it as SSH_AUTH_SOCK. Every connection must first send one line,

    corral-bridge 1 TOKEN SERVICE\\n      (ASCII, at most 256 bytes, within the deadline)

with the session's random token (compared in constant time) and a service this bridge
relays. Anything else (a wrong token, an unknown service, a malformed or oversize line, an
early end, or silence until the deadline) closes the connection without a single byte in
reply. An accepted connection is relayed byte for byte to the host socket of that service;
the keys stay with the agent on the host and never enter the sandbox. Every connection, let
in or not, is reported to `on_use` (the audit log), never with the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from corral.bridge_shim import MAGIC, MAX_HANDSHAKE_BYTES, SSH_AGENT, VERSION, handshake
from corral.egress.relay import bridge_streams
from corral.errors import SandboxError

__all__ = [
    "BRIDGE_SERVICES",
    "MAX_HANDSHAKE_BYTES",
    "AgentBridge",
    "UseHook",
    "check_handshake",
    "handshake",
    "new_token",
]

log = logging.getLogger(__name__)

BRIDGE_SERVICES = (SSH_AGENT,)
UNKNOWN = "?"
RELAYED = "relayed"
CONNECT_TIMEOUT_S = 5.0

UseHook = Callable[[str, str], None]
"""Called as `on_use(service, outcome)`: the service (or "?"), then "relayed" or "refused: ..."."""


def new_token() -> str:
    """A fresh session token: 32 random bytes as 64 hex digits."""
    return secrets.token_hex(32)


def check_handshake(line: bytes, token: bytes, services: Mapping[bytes, str]) -> tuple[str, str]:
    """Judge one handshake line: (the service, or "?" when unknown; RELAYED or a refusal).

    The token is compared in constant time, and before the service, so a wrong token is
    reported as such whatever service it names.
    """
    if len(line) > MAX_HANDSHAKE_BYTES:
        return UNKNOWN, "refused: handshake too long"
    words = line.removesuffix(b"\n").split(b" ")
    if not line.endswith(b"\n") or len(words) != 4 or words[:2] != [MAGIC, VERSION]:
        return UNKNOWN, "refused: malformed handshake"
    service = services.get(words[3], UNKNOWN)
    if not hmac.compare_digest(words[2], token):
        return service, "refused: wrong token"
    if service == UNKNOWN:
        return service, "refused: unknown service"
    return service, RELAYED


class AgentBridge:
    """One session's bridge socket, serving in this process's event loop.

    `services` maps a service name (one of BRIDGE_SERVICES) to the host unix socket it is
    relayed to, for "ssh-agent" the server's own SSH_AUTH_SOCK. Times are in seconds; at most
    `max_connections` connections are open at once (handshaking or relaying), and a relay
    ends after `idle_timeout_s` without a byte either way. Raises ValueError for a malformed
    token or a service that is not in BRIDGE_SERVICES.
    """

    def __init__(
        self,
        socket_path: Path,
        token: str,
        services: Mapping[str, Path],
        on_use: UseHook | None,
        handshake_timeout_s: float = 5.0,
        *,
        max_connections: int = 32,
        idle_timeout_s: float = 3600.0,
    ) -> None:
        unknown = set(services) - set(BRIDGE_SERVICES)
        if unknown:
            raise ValueError(f"the bridge relays only {', '.join(BRIDGE_SERVICES)}")
        handshake(token, SSH_AGENT)  # the same check a client's line must pass
        self.socket_path = socket_path
        self.services = dict(services)
        self.on_use = on_use
        self.handshake_timeout_s = handshake_timeout_s
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self._token = token.encode("ascii")
        self._names = {name.encode("ascii"): name for name in services}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def active(self) -> int:
        """Connections open now, in their handshake or relaying."""
        return len(self._tasks)

    async def start(self) -> None:
        """Listen at `socket_path` (mode 0600). Call before the sandbox starts.

        The parent directory must exist. A stale socket there is replaced; raises SandboxError
        when anything else is at the path or the socket cannot be made.
        """
        if self._server is not None:
            return
        _remove_stale_socket(self.socket_path)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(self.socket_path), limit=MAX_HANDSHAKE_BYTES
            )
        except OSError as exc:
            raise SandboxError(
                f"the agent bridge cannot listen at {self.socket_path}: {exc}"
            ) from exc
        _restrict_mode(self.socket_path)

    async def close(self) -> None:
        """Stop listening, cut every open connection and relay, and remove the socket."""
        self._closed = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
            with contextlib.suppress(OSError, SandboxError):
                _remove_stale_socket(self.socket_path)

    # -- one connection --------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self._closed or task is None:
            writer.close()
            return
        self._tasks.add(task)
        try:
            if len(self._tasks) > self.max_connections:
                self._report(UNKNOWN, "refused: too many connections")
                return
            service, outcome = await self._admit(reader)
            if outcome != RELAYED:
                self._report(service, outcome)
                return
            await self._relay(service, reader, writer)
        except asyncio.CancelledError:
            return  # close(): end quietly, the streams callback would log it as an error
        except Exception:
            log.exception("agent bridge connection on %s failed", self.socket_path)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _admit(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        """Read the handshake within the deadline: (the service or "?", RELAYED or a refusal)."""
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), self.handshake_timeout_s)
        except TimeoutError:
            return UNKNOWN, "refused: timeout"
        except (asyncio.IncompleteReadError, ConnectionError):
            return UNKNOWN, "refused: closed before the handshake"
        except asyncio.LimitOverrunError:
            return UNKNOWN, "refused: handshake too long"
        return check_handshake(line, self._token, self._names)

    async def _relay(
        self, service: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        target = str(self.services[service])
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_unix_connection(target), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            self._report(service, f"refused: agent unreachable ({reason})")
            return
        self._report(service, RELAYED)
        try:
            await bridge_streams((reader, writer), upstream, idle_timeout_s=self.idle_timeout_s)
        finally:
            upstream[1].close()

    def _report(self, service: str, outcome: str) -> None:
        if self.on_use is not None:
            self.on_use(service, outcome)


def _remove_stale_socket(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SandboxError(
            f"{path} exists and is not a socket; the agent bridge will not replace it"
        )
    os.unlink(path)


def _restrict_mode(path: Path) -> None:
    """Mode 0600, without following a link that might have taken the socket's place."""
    try:
        os.chmod(path, 0o600, follow_symlinks=False)
    except NotImplementedError:
        # Either the path is a link now (glibc refuses), or this C library cannot skip links.
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise SandboxError(f"{path} is no longer the bridge's socket") from None
        os.chmod(path, 0o600)
