"""The host egress proxy: one unix socket per session, policy checked on every connection.

The socket a connection arrives on names the session, so nothing a sandbox sends can claim
another identity. Each connection starts with one byte from the in-sandbox forwarder (`H` for
its HTTP port, `S` for SOCKS5), then the client's own request. The proxy resolves names
itself, checks every address, connects to exactly the address it checked, and relays bytes,
counting them. A policy change re-checks open tunnels and closes those no longer allowed.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import h11

from corral.egress import protocol as p
from corral.egress.ca import CAUnavailable, CertificateAuthority
from corral.egress.forward import Exchange, forward
from corral.egress.http_rules import judge, limited
from corral.egress.injection import Attached, SecretRefused, inject
from corral.egress.intercept import Interception, intercept, upstream_context
from corral.egress.relay import bridge_streams
from corral.egress.rules import Decision, IPAddress, Policy, decide, literal_address, should_resolve

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
DecisionHook = Callable[[str, p.Target, Decision], None]
UNREAD_TEXT = (
    "this host is allowed for some methods and paths only, and this connection's requests "
    "cannot be read (a SOCKS connection cannot show them): use the HTTP proxy (HTTP_PROXY, "
    "HTTPS_PROXY)"
)
# A request carried secrets: the session, where it went, the secrets' names, and why it
# was refused (None when they were put in).
SecretHook = Callable[[str, p.Target, tuple[str, ...], str | None], None]


def no_secrets(session_id: str) -> Mapping[bytes, Attached]:
    return {}


def not_told(session_id: str, target: p.Target, names: tuple[str, ...], why: str | None) -> None:
    """Nobody listens for secrets (a proxy built without them)."""


KIND_HTTP, KIND_SOCKS = b"H", b"S"


@dataclass(frozen=True)
class ProxyLimits:
    """Per-session bounds. Times in seconds."""

    max_connections: int = 64
    header_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0


@dataclass(eq=False)
class _Tunnel:
    target: p.Target
    address: IPAddress
    writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


@dataclass
class SessionEgress:
    """One session's listening socket, its open tunnels and its counters."""

    session_id: str
    socket_path: Path
    server: asyncio.Server | None = None
    inode: int = 0  # of the socket file this server listens on
    active: int = 0
    connections: int = 0
    refused: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    tunnels: set[_Tunnel] = field(default_factory=set)

    @property
    def listening(self) -> bool:
        """Serving, and the socket file at `socket_path` is still the one it bound."""
        if self.server is None or not self.server.is_serving():
            return False
        try:
            return os.lstat(self.socket_path).st_ino == self.inode
        except FileNotFoundError:
            return False

    def stats(self) -> dict[str, int]:
        return {
            "active": self.active,
            "connections": self.connections,
            "refused": self.refused,
            "bytes_out": self.bytes_out,
            "bytes_in": self.bytes_in,
        }


@dataclass(frozen=True)
class _Meter:
    """What a carried connection counts its bytes into, and how long it may stay silent."""

    egress: SessionEgress
    idle_timeout_s: float

    def outbound(self, count: int) -> None:
        self.egress.bytes_out += count

    def inbound(self, count: int) -> None:
        self.egress.bytes_in += count


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """The host's resolver: unique addresses in the order it returned them."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: dict[IPAddress, None] = {}
    for info in infos:
        found[ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])] = None
    return list(found)


class EgressProxy:
    """Serves every session's egress socket in this process's event loop."""

    def __init__(
        self,
        policy_for: Callable[[str], Policy],
        *,
        on_decision: DecisionHook,
        resolver: Resolver = system_resolver,
        limits: ProxyLimits | None = None,
        secrets_for: Callable[[str], Mapping[bytes, Attached]] = no_secrets,
        on_secret: SecretHook = not_told,
        ca: Callable[[], CertificateAuthority] | None = None,
        upstream_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.policy_for = policy_for
        self.on_decision = on_decision
        self.secrets_for = secrets_for  # a session's attached secrets, by placeholder
        self.on_secret = on_secret
        self.ca = ca  # made on first use; without one, no tunnel is read
        self.upstream_tls = upstream_tls or upstream_context()
        self.resolver = resolver
        self.limits = limits or ProxyLimits()
        self.sessions: dict[str, SessionEgress] = {}
        # A session's kernels start together and each asks for its socket: one open (or
        # close) at a time, or a listener bound meanwhile would be one nothing ever closes.
        self._opening = asyncio.Lock()

    async def open(self, session_id: str, socket_path: Path) -> None:
        """Listen on `socket_path` for `session_id`.

        Idempotent while it listens there; when the socket file is gone or is no longer the
        one it listens on (removed by a clean-up of the run root, say), it listens again at
        the same path, keeping the session's counters and open tunnels.
        """
        async with self._opening:
            await self._open(session_id, socket_path)

    async def _open(self, session_id: str, socket_path: Path) -> None:
        egress = self.sessions.get(session_id)
        if egress is not None and egress.socket_path == socket_path and egress.listening:
            return
        if egress is None or egress.socket_path != socket_path:
            if egress is not None:
                self._stop(egress)
            egress = SessionEgress(session_id, socket_path)
            self.sessions[session_id] = egress
        elif egress.server is not None:
            egress.server.close()
        await self._listen(egress)

    def rename(self, old_id: str, new_id: str) -> None:
        """Let the socket of `old_id` speak for `new_id` (a warm pool kernel taken by a new
        session). Raises `KeyError` when `old_id` has no socket or `new_id` has one."""
        if new_id in self.sessions:
            raise KeyError(f"session {new_id} already has an egress socket")
        egress = self.sessions.pop(old_id)
        egress.session_id = new_id
        self.sessions[new_id] = egress
        self.policy_changed(new_id)

    async def close(self, session_id: str) -> None:
        """Stop listening for the session, cut its tunnels, and remove its socket and (when
        empty) the socket's directory. It waits for an open in progress (a kernel starting
        while its session is deleted), or the listener that open makes would outlive it."""
        async with self._opening:
            egress = self.sessions.pop(session_id, None)
        if egress is None:
            return
        self._stop(egress)
        with contextlib.suppress(OSError):
            os.rmdir(egress.socket_path.parent)

    async def close_all(self) -> None:
        for session_id in list(self.sessions):
            await self.close(session_id)

    async def restart(self) -> int:
        """Stop every listener and cut every tunnel, then listen again at the same paths.

        Sandboxes that are running keep their way out: they see the socket's directory, not
        the socket, so they find the new one. Connections open at the time are closed (their
        clients see the connection end). Returns how many tunnels were cut.
        """
        cut = 0
        async with self._opening:
            for egress in list(self.sessions.values()):
                cut += len(egress.tunnels)
                self._stop(egress)
                await self._listen(egress)
        return cut

    async def _listen(self, egress: SessionEgress) -> None:
        path = egress.socket_path
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        # Made without serving, so that no await lies between binding the socket and holding
        # it: a start cancelled there (a pool kernel given up at close) left a listener that
        # nothing held, found only by the garbage collector.
        egress.server = await asyncio.start_unix_server(
            lambda r, w: self._serve(egress, r, w), path=str(path), start_serving=False
        )
        os.chmod(path, 0o600)
        egress.inode = os.lstat(path).st_ino
        await egress.server.start_serving()

    def _stop(self, egress: SessionEgress) -> None:
        if egress.server is not None:
            egress.server.close()
            egress.server = None
        for tunnel in list(egress.tunnels):
            tunnel.close()
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(egress.socket_path).st_ino == egress.inode:
                os.unlink(egress.socket_path)

    def policy_changed(self, session_id: str) -> int:
        """Re-check the session's open tunnels; close and count those no longer allowed."""
        egress = self.sessions.get(session_id)
        if egress is None:
            return 0
        policy = self.policy_for(session_id)
        cut = 0
        for tunnel in list(egress.tunnels):
            if not decide(policy, tunnel.target.host, tunnel.target.port, [tunnel.address]).allowed:
                tunnel.close()
                cut += 1
        return cut

    def stats(self, session_id: str) -> dict[str, int]:
        egress = self.sessions.get(session_id)
        return egress.stats() if egress is not None else SessionEgress(session_id, Path()).stats()

    # -- one connection --------------------------------------------------------------------

    async def _serve(
        self, egress: SessionEgress, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        egress.active += 1
        egress.connections += 1
        try:
            await self._handle(egress, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except asyncio.CancelledError:
            # The loop is shutting down: end this connection quietly (asyncio's stream
            # callback would otherwise log the cancellation as an error).
            return
        except Exception as exc:
            # One bounded line: a sandbox can make connections fail as often as it likes.
            log.warning(
                "egress connection of session %s failed: %s: %.200r",
                egress.session_id,
                type(exc).__name__,
                str(exc),
            )
            log.debug("the failed egress connection's traceback", exc_info=True)
        finally:
            egress.active -= 1
            writer.close()

    async def _handle(
        self, egress: SessionEgress, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        timeout = self.limits.header_timeout_s
        kind = await asyncio.wait_for(reader.readexactly(1), timeout)
        handler = {KIND_HTTP: _HttpClient, KIND_SOCKS: _SocksClient}.get(kind)
        if handler is None:
            return
        client = handler(reader, writer, timeout)
        if egress.active > self.limits.max_connections:
            egress.refused += 1
            await client.refuse_busy(self.limits.max_connections)
            return
        try:
            target = await client.read_target()
        except p.ProtocolError as exc:
            log.info(
                "egress: refused a malformed request of session %s: %.200r",
                egress.session_id,
                str(exc),
            )
            await client.reject(exc)
            return
        await self._connect(egress, client, target)

    async def _connect(self, egress: SessionEgress, client: _Client, target: p.Target) -> None:
        decision = await self._decide(egress.session_id, target)
        self.on_decision(egress.session_id, target, decision)
        if not decision.allowed or decision.address is None:
            egress.refused += 1
            await client.refuse(egress.session_id, target, decision)
            return
        if self._cannot_read(egress.session_id, client, target, decision.address):
            egress.refused += 1
            unread = Decision(False, UNREAD_TEXT)
            self.on_decision(egress.session_id, target, unread)
            await client.refuse(egress.session_id, target, unread)
            return
        if isinstance(client, _HttpClient) and client.request is not None:
            if self._reads(egress.session_id, client.request, target, decision.address):
                await self._intercept(egress, client, target, decision.address)
                return
            if (upstream := client.request.upstream) is not None:
                outgoing = self._judge(egress.session_id, target, decision.address, upstream)
                if isinstance(outgoing, str):
                    egress.refused += 1
                    await client.refuse_request(outgoing)
                    return
                client.request = replace(client.request, upstream=outgoing)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(str(decision.address), target.port),
                self.limits.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            await client.unreachable(target, decision.address, exc)
            return
        # The policy may have changed while this connection resolved and dialled: look again,
        # then register the tunnel before any further wait, so a later change always sees it.
        recheck = decide(
            self.policy_for(egress.session_id), target.host, target.port, [decision.address]
        )
        if not recheck.allowed:
            up_writer.close()
            egress.refused += 1
            self.on_decision(egress.session_id, target, recheck)
            await client.refuse(egress.session_id, target, recheck)
            return
        tunnel = _Tunnel(target, decision.address, (client.writer, up_writer))
        egress.tunnels.add(tunnel)
        try:
            await client.carry(up_reader, up_writer, _Meter(egress, self.limits.idle_timeout_s))
        finally:
            egress.tunnels.discard(tunnel)
            up_writer.close()

    def _judge(
        self, session_id: str, target: p.Target, address: IPAddress, request: h11.Request
    ) -> h11.Request | str:
        """A request the proxy reads: why it may not go (the policy's method and path
        rules, `corral.egress.http_rules`; a secret where it may not go), or the request
        to send, the session's secrets put in (`corral.egress.injection`)."""
        method, path = request.method.decode(), request.target.decode("latin-1")
        refusal = judge(self.policy_for(session_id), target, address, method, path)
        if refusal is not None:
            self.on_decision(session_id, target, Decision(False, refusal))
            return refusal
        try:
            done = inject(request, target, address, self.secrets_for(session_id))
        except SecretRefused as refused:
            names = (refused.name,) if refused.name else ()
            self.on_secret(session_id, target, names, refused.reason)
            return refused.reason
        if done.names:
            self.on_secret(session_id, target, done.names, None)
        return done.request

    def _cannot_read(
        self, session_id: str, client: _Client, target: p.Target, address: IPAddress
    ) -> bool:
        """Whether the policy limits the target's methods and paths on a connection the
        proxy cannot read (SOCKS, or a tunnel when it has no CA): it is then refused."""
        if not limited(self.policy_for(session_id), target, address):
            return False
        if not isinstance(client, _HttpClient) or client.request is None:
            return True
        return client.request.tunnel and self.ca is None

    def _reads(
        self, session_id: str, request: p.HttpRequest, target: p.Target, address: IPAddress
    ) -> bool:
        """Whether to read inside this CONNECT tunnel: the policy limits the target's
        methods and paths, or one of the session's secrets may go there (every other tunnel
        stays opaque)."""
        if self.ca is None or not request.tunnel:
            return False
        if limited(self.policy_for(session_id), target, address):
            return True
        held = self.secrets_for(session_id).values()
        return any(secret.may_go_to(target, address) for secret in held)

    async def _intercept(
        self, egress: SessionEgress, client: _HttpClient, target: p.Target, address: IPAddress
    ) -> None:
        """Answer the CONNECT and serve one request inside it (`corral.egress.intercept`)."""
        if self.ca is None:  # pragma: no cover - `_reads` checked it
            return
        try:
            server_context = self.ca().server_context(target.host)
        except CAUnavailable as exc:
            egress.refused += 1
            await client.refuse_request(f"corral's CA is unavailable, so {exc}")
            return
        await client.connected()
        limits = self.limits
        tls = Interception(
            server_context,
            self.upstream_tls,
            limits.header_timeout_s,
            limits.connect_timeout_s,
            limits.idle_timeout_s,
        )
        meter = _Meter(egress, limits.idle_timeout_s)
        await intercept(
            (client.reader, client.writer),
            target,
            address,
            tls,
            functools.partial(self._judge, egress.session_id, target, address),
            (meter.outbound, meter.inbound),
        )

    async def _decide(self, session_id: str, target: p.Target) -> Decision:
        policy = self.policy_for(session_id)
        literal = literal_address(target.host)
        if literal is not None:
            return decide(policy, target.host, target.port, [literal])
        if not should_resolve(policy, target.host, target.port):
            return decide(policy, target.host, target.port, [])
        try:
            addresses = await asyncio.wait_for(
                self.resolver(target.host, target.port), self.limits.connect_timeout_s
            )
        except (OSError, TimeoutError):
            addresses = []
        return decide(policy, target.host, target.port, addresses)


def refusal_text(session_id: str, target: p.Target, decision: Decision) -> str:
    """What a refused client reads: what was refused, by which rule, and how to allow it.

    A private or loopback address is reached only when its address is listed (listing the
    name does not admit it), so the hint names the address and port then."""
    entry = target.host
    if decision.private is not None:
        shown = f"[{decision.private}]" if decision.private.version == 6 else str(decision.private)
        entry = f"{shown}:{target.port}"
    return (
        f"corral refused {target.host}:{target.port}: {decision.rule}.\n"
        f"The operator can allow it with: corral net allow {session_id} {entry}\n"
        "(an agent may ask with the request_network_access tool).\n"
    )


class _Client(abc.ABC):
    """The protocol-specific half of one connection: read the target, answer the client."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.timeout_s = timeout_s

    @abc.abstractmethod
    async def read_target(self) -> p.Target:
        """See the subclasses."""

    @abc.abstractmethod
    async def reject(self, error: p.ProtocolError) -> None:
        """See the subclasses."""

    @abc.abstractmethod
    async def refuse(self, session_id: str, target: p.Target, decision: Decision) -> None:
        """See the subclasses."""

    @abc.abstractmethod
    async def refuse_busy(self, limit: int) -> None:
        """See the subclasses."""

    @abc.abstractmethod
    async def unreachable(self, target: p.Target, address: IPAddress, error: Exception) -> None:
        """See the subclasses."""

    @abc.abstractmethod
    async def connected(self) -> None:
        """Tell the client the tunnel is open."""

    async def carry(
        self, up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, meter: _Meter
    ) -> None:
        """Open the way, then relay both directions until either side ends or goes idle."""
        await self.connected()
        await bridge_streams(
            (self.reader, self.writer),
            (up_reader, up_writer),
            a_to_b=meter.outbound,
            b_to_a=meter.inbound,
            idle_timeout_s=meter.idle_timeout_s,
        )

    async def _send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()


class _HttpClient(_Client):
    request: p.HttpRequest | None = None

    async def read_target(self) -> p.Target:
        try:
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), self.timeout_s)
        except asyncio.LimitOverrunError as exc:
            raise p.ProtocolError("request head too large", 431) from exc
        if len(head) > p.MAX_HEAD_BYTES:
            raise p.ProtocolError("request head too large", 431)
        self.request = p.parse_http(head)
        return self.request.target

    async def reject(self, error: p.ProtocolError) -> None:
        reason = "Request Header Fields Too Large" if error.status == 431 else "Bad Request"
        await self._send(p.http_reply(error.status, reason, f"corral proxy: {error}\n"))

    async def refuse(self, session_id: str, target: p.Target, decision: Decision) -> None:
        await self._send(p.http_reply(403, "Forbidden", refusal_text(session_id, target, decision)))

    async def refuse_request(self, reason: str) -> None:
        await self._send(p.http_reply(403, "Forbidden", f"corral proxy: refused: {reason}\n"))

    async def refuse_busy(self, limit: int) -> None:
        await self._send(
            p.http_reply(
                429,
                "Too Many Requests",
                f"corral proxy: this session already has {limit} open connections\n",
            )
        )

    async def unreachable(self, target: p.Target, address: IPAddress, error: Exception) -> None:
        await self._send(
            p.http_reply(
                502,
                "Bad Gateway",
                f"corral proxy: {target.host}:{target.port} ({address}) did not answer: {error}\n",
            )
        )

    async def connected(self) -> None:
        await self._send(b"HTTP/1.1 200 Connection established\r\n\r\n")

    async def carry(
        self, up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, meter: _Meter
    ) -> None:
        request = self.request
        if request is None or request.upstream is None or request.client is None:
            await super().carry(up_reader, up_writer, meter)
            return
        exchange = Exchange(
            request.client,
            (self.reader, self.writer),
            (up_reader, up_writer),
            meter.idle_timeout_s,
            meter.outbound,
            meter.inbound,
        )
        await forward(exchange, request.upstream)


class _SocksClient(_Client):
    async def read_target(self) -> p.Target:
        read = self._read
        version, count = await read(2)
        if version != p.SOCKS_VERSION:
            raise p.ProtocolError(f"SOCKS version {version} is not 5", -1)
        methods = await read(count)
        if p.SOCKS_NO_AUTH not in methods:
            await self._send(bytes([p.SOCKS_VERSION, p.SOCKS_NO_ACCEPTABLE]))
            raise p.ProtocolError("no acceptable SOCKS method", -1)
        await self._send(bytes([p.SOCKS_VERSION, p.SOCKS_NO_AUTH]))
        version, command, _, atyp = await read(4)
        if version != p.SOCKS_VERSION:
            raise p.ProtocolError("bad SOCKS request version", p.SOCKS_GENERAL_FAILURE)
        raw = await self._address_bytes(atyp)
        port = int.from_bytes(await read(2), "big")
        if command != p.SOCKS_CONNECT:
            raise p.ProtocolError("only CONNECT is supported", p.SOCKS_COMMAND_UNSUPPORTED)
        return p.parse_target(p.socks_address(atyp, raw), port)

    async def _address_bytes(self, atyp: int) -> bytes:
        if atyp == p.SOCKS_ATYP_IPV4:
            return await self._read(4)
        if atyp == p.SOCKS_ATYP_IPV6:
            return await self._read(16)
        if atyp == p.SOCKS_ATYP_DOMAIN:
            (length,) = await self._read(1)
            return await self._read(length)
        raise p.ProtocolError(f"address type {atyp} is not supported", p.SOCKS_ATYP_UNSUPPORTED)

    async def _read(self, count: int) -> bytes:
        return await asyncio.wait_for(self.reader.readexactly(count), self.timeout_s)

    async def reject(self, error: p.ProtocolError) -> None:
        if error.status >= 0:
            code = error.status if error.status < 256 else p.SOCKS_GENERAL_FAILURE
            await self._send(p.socks_reply(code))

    async def refuse(self, session_id: str, target: p.Target, decision: Decision) -> None:
        await self._send(p.socks_reply(p.SOCKS_NOT_ALLOWED))

    async def refuse_busy(self, limit: int) -> None:
        await self._send(p.socks_reply(p.SOCKS_GENERAL_FAILURE))

    async def unreachable(self, target: p.Target, address: IPAddress, error: Exception) -> None:
        await self._send(p.socks_reply(p.SOCKS_HOST_UNREACHABLE))

    async def connected(self) -> None:
        await self._send(p.socks_reply(p.SOCKS_OK))
