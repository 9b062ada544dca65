"""The egress proxy end to end: a real unix socket, real loopback upstreams, real bytes.

Only loopback is ever dialled: `asyncio.open_connection` (what the proxy dials with) is
wrapped for every test so that a non-loopback address raises before any packet is sent, and
every attempt is recorded, so refusals can be shown to happen before any connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import os
import re
import resource
import socket
import stat
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from corral.egress import protocol as p
from corral.egress.injection import Attached
from corral.egress.proxy import EgressProxy, ProxyLimits, SessionEgress, system_resolver
from corral.egress.rules import Decision, IPAddress, Policy, make_policy, parse_entry
from tests.waiting import until

IO_S = 10.0
SID, OTHER = "s1", "s2"
NONE = make_policy("none")


def _hosts_file_names_localhost() -> bool:
    """Whether the system resolver answers 'localhost' from /etc/hosts (no DNS query sent)."""
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        return False
    return any("localhost" in line.split("#", 1)[0].split()[1:] for line in lines)


RESOLVERS = [
    "fake",
    pytest.param(
        "system",
        marks=pytest.mark.skipif(
            not _hosts_file_names_localhost(),
            reason="/etc/hosts does not name localhost: the system resolver might ask DNS",
        ),
    ),
]


# -- upstream servers on loopback ------------------------------------------------------------


@dataclass
class Upstream:
    """A real TCP server on a loopback address that records what reaches it."""

    host: str
    port: int
    server: asyncio.Server | None = None
    accepted: int = 0
    open: int = 0
    received: bytearray = field(default_factory=bytearray)
    heads: list[bytes] = field(default_factory=list)

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"


class Upstreams:
    """Starts echo and HTTP servers on 127.0.0.x and stops them all after the test."""

    def __init__(self) -> None:
        self.started: list[Upstream] = []

    async def echo(self, host: str, port: int = 0, banner: bytes = b"") -> Upstream:
        async def serve(up: Upstream, reader: asyncio.StreamReader, writer: Any) -> None:
            if banner:
                writer.write(banner)
            while data := await reader.read(65536):
                up.received += data
                writer.write(data)
                await writer.drain()

        return await self._start(host, port, serve)

    async def http(self, host: str, port: int = 0) -> Upstream:
        async def serve(up: Upstream, reader: asyncio.StreamReader, writer: Any) -> None:
            up.heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()

        return await self._start(host, port, serve)

    async def keep_alive(self, host: str, body: bytes = b"ok") -> Upstream:
        """An HTTP/1.1 origin that ignores `Connection: close`: it answers every request it
        reads on a connection (recording each head and any body bytes) and keeps it open."""

        async def serve(up: Upstream, reader: asyncio.StreamReader, writer: Any) -> None:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                up.heads.append(head)
                length = re.search(rb"(?im)^content-length: *(\d+)", head)
                if length:
                    up.received += await reader.readexactly(int(length.group(1)))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()

        return await self._start(host, 0, serve)

    async def answer_with(self, host: str, answer: bytes, *, read_body: bool = True) -> Upstream:
        """An origin that reads one request (its head, and a body as its framing says) and
        sends `answer` as it is, then closes."""

        async def serve(up: Upstream, reader: asyncio.StreamReader, writer: Any) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            up.heads.append(head)
            if read_body:
                up.received += await _read_body(head, reader)
            writer.write(answer)
            await writer.drain()

        return await self._start(host, 0, serve)

    async def speak_and_close(self, host: str, words: bytes) -> Upstream:
        async def serve(up: Upstream, reader: asyncio.StreamReader, writer: Any) -> None:
            writer.write(words)
            await writer.drain()

        return await self._start(host, 0, serve)

    async def pair(self, first: str, second: str) -> tuple[Upstream, Upstream]:
        """Echo servers on two addresses and the same port (bounded retries for a free one)."""
        for _ in range(20):
            one = await self.echo(first)
            try:
                return one, await self.echo(second, one.port)
            except OSError:
                await self._stop(one)
        raise AssertionError(f"no port free on both {first} and {second}")

    async def _start(self, host: str, port: int, serve: Callable[..., Any]) -> Upstream:
        up = Upstream(host, port)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up.accepted += 1
            up.open += 1
            try:
                await serve(up, reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                up.open -= 1
                writer.close()

        up.server = await asyncio.start_server(handle, host, port)
        up.port = up.server.sockets[0].getsockname()[1]
        self.started.append(up)
        return up

    async def _stop(self, up: Upstream) -> None:
        assert up.server is not None
        up.server.close()
        await up.server.wait_closed()
        with contextlib.suppress(ValueError):
            self.started.remove(up)

    async def close(self) -> None:
        await until(lambda: all(up.open == 0 for up in self.started), "upstreams idle")
        for up in list(self.started):
            await self._stop(up)


@pytest.fixture
async def upstreams() -> AsyncIterator[Upstreams]:
    made = Upstreams()
    try:
        yield made
    finally:
        await made.close()


async def _read_body(head: bytes, reader: asyncio.StreamReader) -> bytes:
    """The body after `head`, decoded as its Content-Length or chunked framing says."""
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    if length:
        return await reader.readexactly(int(length.group(1)))
    if not re.search(rb"(?im)^transfer-encoding: *chunked", head):
        return b""
    body = bytearray()
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readuntil(b"\r\n")
    return bytes(body)


# -- the guard on every dial -----------------------------------------------------------------


@dataclass
class Dials:
    """Every upstream address the proxy tried; a gate to hold a dial, a pause after it."""

    attempts: list[tuple[str, int]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    pause_after_s: float = 0.0


@pytest.fixture(autouse=True)
def dials(monkeypatch: pytest.MonkeyPatch) -> Dials:
    real = asyncio.open_connection
    seen = Dials()

    async def guarded(host: str, port: int, **kwargs: Any) -> Any:
        seen.attempts.append((host, port))
        if not ipaddress.ip_address(host).is_loopback:
            raise OSError(f"test guard: refused to dial non-loopback {host}")
        if seen.gate is not None:
            await seen.gate.wait()
        connection = await real(host, port, **kwargs)
        await asyncio.sleep(seen.pause_after_s)
        return connection

    monkeypatch.setattr(asyncio, "open_connection", guarded)
    return seen


# -- resolvers -------------------------------------------------------------------------------


class FakeResolver:
    """Answers from a table; a list of answers is given out in turn (the last one repeats)."""

    def __init__(self, answers: Mapping[str, Sequence[Sequence[str]]] | None = None) -> None:
        self.answers = dict(answers or {})
        self.calls: list[tuple[str, int]] = []
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.calls.append((host, port))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        turns = self.answers.get(host)
        if not turns:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        count = sum(1 for name, _ in self.calls if name == host)
        return [ipaddress.ip_address(a) for a in turns[min(count, len(turns)) - 1]]


def answer(*addresses: str) -> list[list[str]]:
    return [list(addresses)]


# -- the proxy under test and its clients ----------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IO_S)
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), IO_S) if length else b""
    return Response(int(lines[0].split(" ")[1]), headers, body)


async def read_to_eof(reader: asyncio.StreamReader, timeout_s: float = IO_S) -> bytes:
    """Everything until the proxy closes (a reset or a broken pipe after the data counts as
    a close: a write the proxy cut off ends the reader with that error)."""
    data = bytearray()
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(65536), timeout_s):
            data += chunk
    return bytes(data)


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), IO_S)


def connect_head(authority: str) -> bytes:
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()


@dataclass
class Harness:
    proxy: EgressProxy
    policies: dict[str, Policy]
    paths: dict[str, Path]
    resolver: FakeResolver
    decisions: list[tuple[str, p.Target, Decision]] = field(default_factory=list)
    egress: dict[str, SessionEgress] = field(default_factory=dict)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    def set_policy(self, session: str, policy: Policy) -> int:
        self.policies[session] = policy
        return self.proxy.policy_changed(session)

    async def dial(
        self, first: bytes, session: str = SID
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(self.paths[session])), IO_S
        )
        self.writers.append(writer)
        if first:
            writer.write(first)
            await writer.drain()
        return reader, writer

    async def request(
        self, head: bytes, session: str = SID
    ) -> tuple[Response, asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self.dial(b"H" + head, session)
        return await read_response(reader), reader, writer

    async def connect(
        self, authority: str, session: str = SID
    ) -> tuple[Response, asyncio.StreamReader, asyncio.StreamWriter]:
        return await self.request(connect_head(authority), session)

    async def socks(
        self, atyp: int, raw: bytes, port: int, session: str = SID
    ) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self.dial(b"S\x05\x01\x00", session)
        assert await asyncio.wait_for(reader.readexactly(2), IO_S) == b"\x05\x00"
        writer.write(bytes([5, p.SOCKS_CONNECT, 0, atyp]) + raw + port.to_bytes(2, "big"))
        return await asyncio.wait_for(reader.readexactly(10), IO_S), reader, writer

    def idle(self) -> bool:
        return all(egress.active == 0 for egress in self.egress.values())

    async def shutdown(self) -> None:
        for writer in self.writers:
            writer.close()
        for writer in self.writers:
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), IO_S)
        await self.proxy.close_all()
        await until(self.idle, "every proxied connection to end")


@pytest.fixture
async def start(tmp_path: Path, upstreams: Upstreams) -> AsyncIterator[Callable[..., Any]]:
    """`await start(policies, resolver=..., limits=...)`: a proxy listening for each session.

    It depends on `upstreams` so that clients and proxy are closed before the upstreams.
    """
    made: list[Harness] = []

    async def make(
        policies: Policy | dict[str, Policy],
        *,
        resolver: Any = None,
        limits: ProxyLimits | None = None,
        **hooks: Any,
    ) -> Harness:
        table = dict(policies) if isinstance(policies, dict) else {SID: policies}
        fake = resolver if isinstance(resolver, FakeResolver) else FakeResolver()
        decisions: list[tuple[str, p.Target, Decision]] = []
        proxy = EgressProxy(
            lambda session: table.get(session, NONE),
            on_decision=lambda *args: decisions.append(args),
            resolver=fake if resolver is None else resolver,
            limits=limits,
            **hooks,
        )
        harness = Harness(proxy, table, {}, fake, decisions)
        made.append(harness)
        for index, session in enumerate(table):
            path = tmp_path / f"e{len(made)}-{index}.sock"
            assert len(str(path)) < 100, path
            await harness.proxy.open(session, path)
            harness.paths[session] = path
            harness.egress[session] = harness.proxy.sessions[session]
        return harness

    try:
        yield make
    finally:
        for harness in made:
            await harness.shutdown()


def allow(*entries: str) -> Policy:
    return make_policy("allowlist", entries)


# -- tunnels that work -----------------------------------------------------------------------


async def test_connect_tunnel_relays_bytes_both_ways(start: Any, upstreams: Upstreams) -> None:
    up = await upstreams.echo("127.0.0.2", banner=b"hello from upstream\n")
    h = await start(allow("127.0.0.2"))
    response, reader, writer = await h.connect(up.authority)
    assert (response.status, response.body) == (200, b"")
    assert await asyncio.wait_for(reader.readline(), IO_S) == b"hello from upstream\n"
    payload = os.urandom(300_000)

    async def send() -> None:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()

    _, back = await asyncio.gather(send(), read_to_eof(reader))
    assert back == payload
    assert bytes(up.received) == payload


async def test_unreachable_upstream_is_a_502(start: Any) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    h = await start(allow("127.0.0.2"))
    response, _, _ = await h.connect(f"127.0.0.2:{port}")
    assert response.status == 502
    assert f"127.0.0.2:{port}" in response.text


async def test_idle_tunnel_is_closed_after_the_idle_timeout(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.echo("127.0.0.2")
    h = await start(allow("127.0.0.2"), limits=ProxyLimits(idle_timeout_s=0.5))
    response, reader, writer = await h.connect(up.authority)
    assert response.status == 200
    assert await echo(reader, writer, b"once") == b"once"
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await read_to_eof(reader) == b""
    assert 0.4 <= loop.time() - began < 7


async def test_finished_connections_free_their_slot_at_once(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.echo("127.0.0.2")
    h = await start(allow("127.0.0.2"), limits=ProxyLimits(max_connections=2))
    for index in range(5):
        response, reader, writer = await h.connect(up.authority)
        assert response.status == 200, f"connection {index}: {response.text}"
        assert await echo(reader, writer, b"%d" % index) == b"%d" % index
        writer.write_eof()
        assert await read_to_eof(reader) == b""
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize("side", ["client", "upstream"])
async def test_eof_that_arrives_before_the_relay_is_passed_on(
    start: Any, upstreams: Upstreams, dials: Dials, side: str
) -> None:
    h = await start(allow("127.0.0.2"))
    if side == "client":
        up = await upstreams.echo("127.0.0.2")
        gate = dials.gate = asyncio.Event()
        reader, writer = await h.dial(b"H" + connect_head(up.authority) + b"early data")
        writer.write_eof()
        try:
            await until(lambda: bool(dials.attempts), "the proxy to dial")
            await asyncio.sleep(0.2)  # the proxy reads the client's EOF while it dials
        finally:
            gate.set()
        expected = b"early data"
    else:
        up = await upstreams.speak_and_close("127.0.0.2", b"banner then close")
        dials.pause_after_s = 0.2  # the upstream's words and EOF arrive before the relay
        reader, writer = await h.dial(b"H" + connect_head(up.authority))
        expected = b"banner then close"
    response = await read_response(reader)
    assert response.status == 200
    assert await asyncio.wait_for(reader.readexactly(len(expected)), IO_S) == expected
    assert await read_to_eof(reader, timeout_s=3) == b""


async def test_socket_is_private_to_its_owner(start: Any) -> None:
    h = await start(NONE)
    assert stat.S_IMODE(os.stat(h.paths[SID]).st_mode) == 0o600


async def test_absolute_uri_get_is_forwarded_without_hop_by_hop_headers(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.http("127.0.0.2")
    h = await start(allow("127.0.0.2"))
    head = (
        f"GET http://{up.authority}/path/x?q=1&r=2 HTTP/1.1\r\n"
        f"Host: {up.authority}\r\n"
        "Proxy-Connection: keep-alive\r\n"
        "Proxy-Authorization: Basic dXNlcjpwYXNz\r\n"
        "Connection: keep-alive\r\n"
        "Keep-Alive: timeout=5\r\n"
        "TE: trailers\r\n"
        "Trailer: Expires\r\n"
        "Upgrade: websocket\r\n"
        "X-Kept: yes\r\n"
        "\r\n"
    ).encode()
    response, reader, _ = await h.request(head)
    assert (response.status, response.body) == (200, b"ok")
    assert await read_to_eof(reader) == b""
    [seen] = up.heads
    lines = seen.decode().split("\r\n")
    assert lines[0] == "GET /path/x?q=1&r=2 HTTP/1.1"
    names = [line.split(":", 1)[0].lower() for line in lines[1:] if line]
    assert sorted(names) == ["connection", "host", "x-kept"]
    assert f"Host: {up.authority}" in lines
    assert "X-Kept: yes" in lines
    assert "Connection: close" in lines


async def test_headers_named_by_connection_are_not_forwarded(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.http("127.0.0.2")
    h = await start(allow("127.0.0.2"))
    head = (
        f"GET http://{up.authority}/ HTTP/1.1\r\nHost: {up.authority}\r\n"
        "Connection: keep-alive, X-Hop\r\nX-Hop: private\r\n\r\n"
    ).encode()
    response, _, _ = await h.request(head)
    assert response.status == 200
    assert b"x-hop" not in up.heads[0].lower()


# -- plain HTTP: one request per connection, each judged for its own target ------------------


def get_head(authority: str, *headers: str, method: str = "GET", path: str = "/") -> bytes:
    lines = [f"{method} http://{authority}{path} HTTP/1.1", f"Host: {authority}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_requests_pipelined_after_an_allowed_one_reach_no_origin(
    start: Any, upstreams: Upstreams, dials: Dials
) -> None:
    allowed = await upstreams.keep_alive("127.0.0.2")
    forbidden = await upstreams.keep_alive("127.0.0.3")
    h = await start(allow("127.0.0.2"))
    pipelined = (
        get_head(allowed.authority)
        + get_head(forbidden.authority, "Authorization: Bearer meant-for-the-other-host")
        + connect_head(forbidden.authority)
        + get_head(forbidden.authority, method="DELETE")
    )
    reader, _ = await h.dial(b"H" + pipelined)
    answer = await read_to_eof(reader)
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok"), answer
    assert re.search(rb"(?im)^connection: close\r$", answer), answer
    assert len(allowed.heads) == 1 and b"meant-for" not in bytes(allowed.received)
    assert forbidden.accepted == 0
    assert dials.attempts == [("127.0.0.2", allowed.port)]
    assert [target.host for _, target, _ in h.decisions] == ["127.0.0.2"]


async def test_a_keep_alive_client_is_told_to_close_and_its_next_request_is_judged_anew(
    start: Any, upstreams: Upstreams
) -> None:
    allowed = await upstreams.keep_alive("127.0.0.2", body=b"allowed origin")
    forbidden = await upstreams.keep_alive("127.0.0.3", body=b"forbidden origin")
    h = await start(allow("127.0.0.2"))
    first, reader, _ = await h.request(get_head(allowed.authority, "Connection: keep-alive"))
    assert (first.status, first.body) == (200, b"allowed origin")
    assert first.headers["connection"] == "close"
    assert await read_to_eof(reader) == b""  # the origin kept its end open; the proxy did not
    second, _, _ = await h.request(get_head(forbidden.authority, "Authorization: Bearer x"))
    assert second.status == 403 and "corral refused 127.0.0.3" in second.text
    assert len(allowed.heads) == 1 and forbidden.accepted == 0


@pytest.mark.parametrize(
    ("framing", "sent", "delivered"),
    [
        ("Content-Length: 5", b"hello", b"hello"),
        ("Transfer-Encoding: chunked", b"3\r\nhel\r\n2;x=1\r\nlo\r\n0\r\n\r\n", b"hello"),
    ],
)
async def test_a_request_body_reaches_the_origin_and_what_follows_it_does_not(
    start: Any, upstreams: Upstreams, framing: str, sent: bytes, delivered: bytes
) -> None:
    up = await upstreams.answer_with(
        "127.0.0.2", b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone"
    )
    h = await start(allow("127.0.0.2"))
    after = get_head("127.0.0.3:9", "Authorization: Bearer x")
    reader, _ = await h.dial(b"H" + get_head(up.authority, framing, method="POST") + sent + after)
    response = await read_response(reader)
    assert (response.status, response.body) == (201, b"done")
    assert await read_to_eof(reader) == b""
    assert bytes(up.received) == delivered
    assert b"Authorization" not in up.heads[0] and len(up.heads) == 1


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"4\r\nchun\r\n3\r\nked\r\n0\r\n\r\n",
            b"chunked",
        ),
        (b"HTTP/1.0 200 OK\r\n\r\nuntil the close", b"until the close"),
        (b"HTTP/1.1 204 No Content\r\nConnection: keep-alive\r\n\r\n", b""),
    ],
)
async def test_an_answer_in_any_framing_reaches_the_client_whole(
    start: Any, upstreams: Upstreams, answer: bytes, body: bytes
) -> None:
    up = await upstreams.answer_with("127.0.0.2", answer)
    h = await start(allow("127.0.0.2"))
    reader, _ = await h.dial(b"H" + get_head(up.authority))
    raw = await read_to_eof(reader)
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert re.search(rb"(?im)^connection: close\r?$", head), raw
    if b"transfer-encoding: chunked" in head.lower():
        rest = b"".join(re.findall(rb"[0-9a-fA-F]+\r\n(.*?)\r\n", rest, re.S))
    assert rest == body, raw


async def test_a_head_request_gets_the_length_without_a_body(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.answer_with("127.0.0.2", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
    h = await start(allow("127.0.0.2"))
    reader, _ = await h.dial(b"H" + get_head(up.authority, method="HEAD"))
    raw = await read_to_eof(reader)
    assert raw.startswith(b"HTTP/1.1 200 ") and raw.endswith(b"\r\n\r\n"), raw
    assert b"content-length: 100" in raw.lower()


async def test_an_origin_that_does_not_speak_http_is_a_502(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.answer_with("127.0.0.2", b"SSH-2.0-OpenSSH\r\n\r\n")
    h = await start(allow("127.0.0.2"))
    response, _, _ = await h.request(get_head(up.authority))
    assert response.status == 502 and "not a valid HTTP answer" in response.text


SMUGGLED = [
    pytest.param("Host: {a}\r\nX-A: 1\nHost: {b}", id="second-host-behind-bare-lf"),
    pytest.param(
        "Host: {a}\r\nContent-Length: 5\nTransfer-Encoding: chunked", id="framing-bare-lf"
    ),
    pytest.param(
        "Host: {a}\r\nContent-Length: 5\rTransfer-Encoding: chunked", id="framing-bare-cr"
    ),
    pytest.param("Host: {a}\r\nContent-Length: 0, 63", id="two-lengths-in-one-field"),
    pytest.param("Host: {a}\r\n folded: continuation", id="obsolete-line-folding"),
]


@pytest.mark.parametrize("headers", SMUGGLED)
async def test_a_head_that_could_be_read_two_ways_is_a_400_and_one_log_line(
    start: Any, upstreams: Upstreams, dials: Dials, caplog: pytest.LogCaptureFixture, headers: str
) -> None:
    up = await upstreams.keep_alive("127.0.0.2")
    h = await start(allow("127.0.0.2", "127.0.0.3"))
    fields = headers.format(a=up.authority, b=f"127.0.0.3:{up.port}")
    head = f"POST http://{up.authority}/ HTTP/1.1\r\n{fields}\r\n\r\n".encode()
    with caplog.at_level(logging.DEBUG, logger="corral.egress"):
        response, reader, _ = await h.request(head)
    assert response.status == 400 and response.text.startswith("corral proxy: "), response.text
    assert await read_to_eof(reader) == b""
    assert dials.attempts == [] and up.accepted == 0
    _assert_one_bounded_line(caplog)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.3:{p}@127.0.0.2:{p}/",
        "http://127.0.0.3:{p}\\@127.0.0.2:{p}/",
        "http://user@127.0.0.2:{p}/",
        "http://[127.0.0.3]:{p}/",
        "http://[::1/",
        "http://[::1]:{p}:{p}/",
        "http://127.0.0.2:{p}/a b",
    ],
)
async def test_a_url_with_userinfo_or_a_bad_host_is_a_400_and_one_log_line(
    start: Any, upstreams: Upstreams, dials: Dials, caplog: pytest.LogCaptureFixture, url: str
) -> None:
    up = await upstreams.keep_alive("127.0.0.2")
    h = await start(allow("127.0.0.2", "127.0.0.3", "::1"))
    target = url.format(p=up.port)
    with caplog.at_level(logging.DEBUG, logger="corral.egress"):
        for _ in range(3):
            response, reader, _ = await h.request(f"GET {target} HTTP/1.1\r\n\r\n".encode())
            assert response.status == 400, response.text
            assert await read_to_eof(reader) == b""
    assert dials.attempts == [] and up.accepted == 0
    assert len(caplog.records) == 3
    _assert_one_bounded_line(caplog)


def _assert_one_bounded_line(caplog: pytest.LogCaptureFixture) -> None:
    """Each refused request logs at most one line, without a traceback, of bounded size."""
    assert caplog.records, "a refused request is logged"
    for record in caplog.records:
        assert record.exc_info is None and "\n" not in record.getMessage()
        assert len(record.getMessage()) <= 400


async def test_socks5_connect_by_ipv4(start: Any, upstreams: Upstreams) -> None:
    up = await upstreams.echo("127.0.0.2")
    h = await start(allow("127.0.0.2"))
    reply, reader, writer = await h.socks(
        p.SOCKS_ATYP_IPV4, ipaddress.IPv4Address("127.0.0.2").packed, up.port
    )
    assert reply == p.socks_reply(p.SOCKS_OK)
    assert await echo(reader, writer, b"over socks by address") == b"over socks by address"
    assert h.resolver.calls == []


async def test_socks5_connect_by_domain_resolves_through_the_proxy(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.echo("127.0.0.2")
    fake = FakeResolver({"echo.test": answer("127.0.0.2")})
    h = await start(allow("echo.test", "127.0.0.2"), resolver=fake)
    reply, reader, writer = await h.socks(
        p.SOCKS_ATYP_DOMAIN, bytes([len(b"Echo.Test")]) + b"Echo.Test", up.port
    )
    assert reply == p.socks_reply(p.SOCKS_OK)
    assert await echo(reader, writer, b"over socks by name") == b"over socks by name"
    assert fake.calls == [("echo.test", up.port)]


# -- refusals (always before any dial) -------------------------------------------------------


async def test_mode_none_refuses_naming_host_rule_and_command_without_resolving(
    start: Any, dials: Dials
) -> None:
    fake = FakeResolver({"example.com": answer("127.0.0.2")})
    h = await start(NONE, resolver=fake)
    response, reader, _ = await h.connect("Example.com:443")
    assert response.status == 403
    assert "example.com:443" in response.text
    assert "mode none: this session has no network" in response.text
    assert f"corral net allow {SID} example.com" in response.text
    assert await read_to_eof(reader) == b""
    assert fake.calls == []
    assert dials.attempts == []


async def test_mode_none_refuses_socks_with_not_allowed(start: Any, dials: Dials) -> None:
    h = await start(NONE)
    reply, _, _ = await h.socks(p.SOCKS_ATYP_DOMAIN, b"\x0bexample.com", 443)
    assert reply == p.socks_reply(p.SOCKS_NOT_ALLOWED)
    assert h.resolver.calls == []
    assert dials.attempts == []


@pytest.mark.parametrize("mode", ["public", "allowlist"])
@pytest.mark.parametrize("resolver", RESOLVERS)
async def test_localhost_is_refused_unless_its_address_is_listed(
    start: Any, upstreams: Upstreams, dials: Dials, mode: str, resolver: str
) -> None:
    up = await upstreams.echo("127.0.0.1")
    fake = FakeResolver({"localhost": answer("127.0.0.1")})
    h = await start(
        make_policy(mode, ["localhost"]), resolver=fake if resolver == "fake" else system_resolver
    )
    response, _, _ = await h.connect(f"localhost:{up.port}")
    assert response.status == 403
    assert "not a public address (" in response.text
    assert "127.0.0.1" in response.text
    assert dials.attempts == []
    assert up.accepted == 0
    assert fake.calls == ([("localhost", up.port)] if resolver == "fake" else [])


@pytest.mark.parametrize("resolver", RESOLVERS)
async def test_localhost_is_admitted_when_its_address_is_listed(
    start: Any, upstreams: Upstreams, dials: Dials, resolver: str
) -> None:
    up = await upstreams.echo("127.0.0.1")
    fake = FakeResolver({"localhost": answer("127.0.0.1")})
    h = await start(
        allow("localhost", "127.0.0.1"), resolver=fake if resolver == "fake" else system_resolver
    )
    response, reader, writer = await h.connect(f"localhost:{up.port}")
    assert response.status == 200
    assert await echo(reader, writer, b"local") == b"local"
    assert dials.attempts == [("127.0.0.1", up.port)]


async def _metadata_connect(h: Harness) -> int:
    response, _, _ = await h.connect("169.254.169.254:80")
    return response.status


async def _metadata_get(h: Harness) -> int:
    head = b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n"
    response, _, _ = await h.request(head)
    return response.status


async def _metadata_socks(h: Harness) -> int:
    raw = ipaddress.IPv4Address("169.254.169.254").packed
    reply, _, _ = await h.socks(p.SOCKS_ATYP_IPV4, raw, 80)
    return {p.socks_reply(p.SOCKS_NOT_ALLOWED): 403}.get(reply, reply[1])


@pytest.mark.parametrize("mode", ["public", "allowlist"])
@pytest.mark.parametrize("how", [_metadata_connect, _metadata_get, _metadata_socks])
async def test_metadata_address_is_refused(
    start: Any, dials: Dials, mode: str, how: Callable[[Harness], Any]
) -> None:
    h = await start(make_policy(mode, ["metadata.example", "127.0.0.0/8"]))
    assert await how(h) == 403
    assert dials.attempts == []
    assert h.resolver.calls == []
    [(_, target, decision)] = h.decisions
    assert (target, decision.allowed) == (p.Target("169.254.169.254", 80), False)


@pytest.mark.parametrize(
    "host",
    ["2130706434", "0x7f000002", "0X7F000002", "0177.0.0.2", "127.2", "[::ffff:127.0.0.2]"],
)
async def test_other_notations_of_a_loopback_address_are_refused(
    start: Any, upstreams: Upstreams, dials: Dials, host: str
) -> None:
    up = await upstreams.echo("127.0.0.2")
    fake = FakeResolver({"svc.test": answer("93.184.216.34")})
    h = await start(allow("svc.test"), resolver=fake)
    response, _, _ = await h.connect(f"{host}:{up.port}")
    assert response.status == 403
    assert dials.attempts == []
    assert fake.calls == []
    assert up.accepted == 0


async def test_answer_that_changes_between_lookups_is_used_once(
    start: Any, upstreams: Upstreams, dials: Dials
) -> None:
    listed, other = await upstreams.pair("127.0.0.2", "127.0.0.3")
    fake = FakeResolver({"rebind.test": [["127.0.0.2"], ["127.0.0.3"]]})
    h = await start(allow("rebind.test", "127.0.0.2"), resolver=fake)
    response, reader, writer = await h.connect(f"rebind.test:{listed.port}")
    assert response.status == 200
    assert await echo(reader, writer, b"first answer") == b"first answer"
    assert fake.calls == [("rebind.test", listed.port)]
    assert dials.attempts == [("127.0.0.2", listed.port)]
    assert (listed.accepted, other.accepted) == (1, 0)

    again, _, _ = await h.connect(f"rebind.test:{listed.port}")
    assert again.status == 403
    assert "127.0.0.3" in again.text
    assert len(fake.calls) == 2
    assert dials.attempts == [("127.0.0.2", listed.port)]
    assert other.accepted == 0


async def test_name_not_listed_is_never_resolved(start: Any, dials: Dials) -> None:
    fake = FakeResolver({"leak-secret.attacker.example": answer("93.184.216.34")})
    h = await start(allow("example.com"), resolver=fake)
    response, _, _ = await h.connect("leak-secret.attacker.example:443")
    assert response.status == 403
    assert "not in the allowlist: leak-secret.attacker.example:443" in response.text
    assert fake.calls == []
    assert dials.attempts == []


# -- malformed requests ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b"CONNECT example.com HTTP/1.1",
        b"CONNECT :443 HTTP/1.1",
        b"CONNECT example.com:http HTTP/1.1",
        b"CONNECT example.com:0 HTTP/1.1",
        b"CONNECT example.com:70000 HTTP/1.1",
        b"CONNECT bad_host!:443 HTTP/1.1",
        b"CONNECT example.com:443",
        b"CONNECT example.com:443 HTTP/1.1 extra",
        b"CONNECT  example.com:443 HTTP/1.1",
        b"CONNECT example.com:443 SPDY/3",
    ],
)
async def test_malformed_connect_is_a_400(start: Any, dials: Dials, line: bytes) -> None:
    h = await start(make_policy("public"))
    response, reader, _ = await h.request(line + b"\r\n\r\n")
    assert response.status == 400
    assert response.text.startswith("corral proxy: ")
    assert await read_to_eof(reader) == b""
    assert h.decisions == []
    assert h.resolver.calls == []
    assert dials.attempts == []


@pytest.mark.parametrize(
    "target",
    [
        "https://example.com/",
        "ftp://example.com/file",
        "file:///etc/passwd",
        "gopher://127.0.0.2:70/",
        "/relative/path",
        "http:///no-host",
    ],
)
async def test_non_http_absolute_uri_is_a_400(start: Any, dials: Dials, target: str) -> None:
    h = await start(make_policy("public", ["127.0.0.0/8"]))
    response, _, _ = await h.request(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert response.status == 400
    assert h.decisions == []
    assert dials.attempts == []


async def test_socks4_is_closed_without_a_reply(start: Any, dials: Dials) -> None:
    h = await start(make_policy("public", ["127.0.0.0/8"]))
    reader, _ = await h.dial(b"S\x04\x01\x00\x50\x7f\x00\x00\x02user\x00")
    assert await read_to_eof(reader) == b""
    assert dials.attempts == []


@pytest.mark.parametrize("methods", [b"\x02", b"\x01\x02", b"\x80\xfe"])
async def test_socks5_without_an_acceptable_method_gets_ff(
    start: Any, dials: Dials, methods: bytes
) -> None:
    h = await start(make_policy("public", ["127.0.0.0/8"]))
    reader, _ = await h.dial(b"S\x05" + bytes([len(methods)]) + methods)
    assert await read_to_eof(reader) == b"\x05\xff"
    assert dials.attempts == []


@pytest.mark.parametrize("command", [2, 3])  # BIND, UDP ASSOCIATE
async def test_socks5_commands_other_than_connect_get_07(
    start: Any, dials: Dials, command: int
) -> None:
    h = await start(make_policy("public", ["127.0.0.0/8"]))
    reader, writer = await h.dial(b"S\x05\x01\x00")
    assert await asyncio.wait_for(reader.readexactly(2), IO_S) == b"\x05\x00"
    writer.write(bytes([5, command, 0, 1, 127, 0, 0, 2, 0, 80]))
    assert await read_to_eof(reader) == p.socks_reply(p.SOCKS_COMMAND_UNSUPPORTED)
    assert dials.attempts == []


@pytest.mark.parametrize(
    "sent", [b"", b"H", b"HCONNECT example.com:443 HTTP/1.1\r\n", b"S", b"S\x05", b"S\x05\x01\x00"]
)
async def test_silent_client_is_closed_after_the_header_timeout(
    start: Any, dials: Dials, sent: bytes
) -> None:
    h = await start(make_policy("public"), limits=ProxyLimits(header_timeout_s=0.5))
    loop = asyncio.get_running_loop()
    began = loop.time()
    reader, _ = await h.dial(sent)
    data = await read_to_eof(reader)
    elapsed = loop.time() - began
    assert data in (b"", b"\x05\x00")
    assert 0.4 <= elapsed < 5, elapsed
    assert dials.attempts == []


# -- limits ----------------------------------------------------------------------------------


@pytest.fixture
def fd_room() -> Iterator[Callable[[int], None]]:
    """Raise the soft limit on open files (up to the hard limit) for the test's duration."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)

    def need(count: int) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < count:
            if hard != resource.RLIM_INFINITY and hard < count:
                pytest.skip(f"needs {count} open files, the hard limit is {hard}")
            resource.setrlimit(resource.RLIMIT_NOFILE, (count, hard))

    yield need
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


async def test_connection_limit_admits_exactly_the_limit(start: Any, upstreams: Upstreams) -> None:
    up = await upstreams.echo("127.0.0.2")
    h = await start(allow("127.0.0.2"), limits=ProxyLimits(max_connections=5))
    tunnels = []
    for index in range(5):
        response, reader, writer = await h.connect(up.authority)
        assert response.status == 200
        assert await echo(reader, writer, b"%d" % index) == b"%d" % index
        tunnels.append(writer)
    busy, _, _ = await h.connect(up.authority)
    assert busy.status == 429
    assert "already has 5 open connections" in busy.text
    tunnels[0].close()
    await until(lambda: h.egress[SID].active == 4, "a freed slot")
    again, reader, writer = await h.connect(up.authority)
    assert again.status == 200
    assert await echo(reader, writer, b"again") == b"again"


async def test_flood_of_connections_is_bounded_per_session(
    start: Any, upstreams: Upstreams, fd_room: Callable[[int], None]
) -> None:
    total, limit = 500, 20
    fd_room(4 * total + 1000)
    up = await upstreams.echo("127.0.0.2")
    h = await start(
        {SID: allow("127.0.0.2"), OTHER: allow("127.0.0.2")},
        limits=ProxyLimits(max_connections=limit),
    )
    statuses: list[int] = []
    release = asyncio.Event()
    connecting = asyncio.Semaphore(64)

    async def one(index: int) -> None:
        async with connecting:
            reader, writer = await h.dial(b"H" + connect_head(up.authority))
        response = await read_response(reader)
        statuses.append(response.status)
        if response.status == 200:
            ping = b"ping %d" % index
            assert await echo(reader, writer, ping) == ping
            await release.wait()
        else:
            assert await read_to_eof(reader) == b""
        writer.close()

    async def other_session_works() -> None:
        response, reader, writer = await h.connect(up.authority, OTHER)
        assert response.status == 200
        assert await echo(reader, writer, b"other session") == b"other session"
        writer.close()

    async with asyncio.timeout(90):
        flood = [asyncio.ensure_future(one(index)) for index in range(total)]
        try:
            await other_session_works()
            await until(lambda: len(statuses) == total, "every flood reply", 60)
            relayed = statuses.count(200)
            assert relayed <= limit
            assert statuses.count(429) == total - relayed
            await until(lambda: h.egress[SID].active == relayed, "the refused ones to end")
            assert len(h.egress[SID].tunnels) == relayed
            assert h.proxy.stats(SID)["refused"] == total - relayed
            await other_session_works()
        finally:
            release.set()
            await asyncio.gather(*flood)
        await until(h.idle, "the flood to drain")
        response, reader, writer = await h.connect(up.authority)
        assert response.status == 200
        assert await echo(reader, writer, b"still serving") == b"still serving"


# -- policy changes on open tunnels ----------------------------------------------------------


async def test_revoking_everything_cuts_an_open_tunnel(start: Any, upstreams: Upstreams) -> None:
    up = await upstreams.echo("127.0.0.2")
    h = await start(allow("127.0.0.2"))
    response, reader, writer = await h.connect(up.authority)
    assert response.status == 200
    assert await echo(reader, writer, b"before") == b"before"
    assert h.set_policy(SID, NONE) == 1
    assert await read_to_eof(reader) == b""
    await until(lambda: up.open == 0, "the upstream side to close too")
    assert h.egress[SID].tunnels == set()


async def test_policy_change_keeps_tunnels_still_allowed(start: Any, upstreams: Upstreams) -> None:
    kept = await upstreams.echo("127.0.0.2")
    revoked = await upstreams.echo("127.0.0.3")
    h = await start(allow("127.0.0.2", "127.0.0.3"))
    first, kept_reader, kept_writer = await h.connect(kept.authority)
    second, gone_reader, gone_writer = await h.connect(revoked.authority)
    assert (first.status, second.status) == (200, 200)
    assert await echo(gone_reader, gone_writer, b"x") == b"x"
    assert h.set_policy(SID, allow("127.0.0.2")) == 1
    assert await read_to_eof(gone_reader) == b""
    assert await echo(kept_reader, kept_writer, b"still open") == b"still open"
    assert h.set_policy(SID, allow("127.0.0.2", "example.com")) == 0
    assert await echo(kept_reader, kept_writer, b"and again") == b"and again"


async def test_policy_change_of_one_session_leaves_the_other(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.echo("127.0.0.2")
    h = await start({SID: allow("127.0.0.2"), OTHER: allow("127.0.0.2")})
    _, reader, writer = await h.connect(up.authority, OTHER)
    assert h.set_policy(SID, NONE) == 0
    assert await echo(reader, writer, b"untouched") == b"untouched"


@pytest.mark.parametrize("phase", ["resolving", "dialling"])
async def test_revoke_while_resolving_or_dialling_carries_no_data(
    start: Any, upstreams: Upstreams, dials: Dials, phase: str
) -> None:
    up = await upstreams.echo("127.0.0.2")
    fake = FakeResolver({"svc.test": answer("127.0.0.2")})
    h = await start(allow("svc.test", "127.0.0.2"), resolver=fake)
    gate = asyncio.Event()
    if phase == "resolving":
        fake.gate = gate
    else:
        dials.gate = gate
    reader, writer = await h.dial(b"H" + connect_head(f"svc.test:{up.port}"))
    try:
        if phase == "resolving":
            await asyncio.wait_for(fake.entered.wait(), IO_S)
        else:
            await until(lambda: bool(dials.attempts), "the proxy to dial")
        assert h.set_policy(SID, NONE) == 0
    finally:
        gate.set()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IO_S)
    if head.startswith(b"HTTP/1.1 200"):
        writer.write(b"after the revoke")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(reader.read(100), IO_S) == b""
    assert bytes(up.received) == b""


# -- accounting and audit --------------------------------------------------------------------


async def test_stats_count_connections_refusals_and_bytes(start: Any, upstreams: Upstreams) -> None:
    up = await upstreams.echo("127.0.0.2")
    h = await start(allow("127.0.0.2"))
    assert h.proxy.stats(SID) == {
        "active": 0,
        "connections": 0,
        "refused": 0,
        "bytes_out": 0,
        "bytes_in": 0,
    }
    _, reader, writer = await h.connect(up.authority)
    assert await echo(reader, writer, b"12345") == b"12345"
    assert await echo(reader, writer, b"678") == b"678"
    assert h.proxy.stats(SID)["active"] == 1
    writer.close()
    for target in ("127.0.0.3:80", "169.254.169.254:80"):
        refused, _, _ = await h.connect(target)
        assert refused.status == 403
    await until(h.idle, "every connection to end")
    assert h.proxy.stats(SID) == {
        "active": 0,
        "connections": 3,
        "refused": 2,
        "bytes_out": 8,
        "bytes_in": 8,
    }


def test_stats_of_an_unknown_session_are_zero() -> None:
    proxy = EgressProxy(lambda session: NONE, on_decision=lambda *args: None)
    assert set(proxy.stats("nobody").values()) == {0}


async def test_every_decision_reaches_the_hook_with_its_rule(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.echo("127.0.0.2")
    fake = FakeResolver({"svc.test": answer("127.0.0.2"), "pub.test": answer("10.0.0.1")})
    h = await start({SID: allow("127.0.0.2", "svc.test", "pub.test"), OTHER: NONE}, resolver=fake)
    _, reader, writer = await h.connect(up.authority)
    assert await echo(reader, writer, b"ok") == b"ok"
    await h.connect(f"svc.test:{up.port}")
    await h.connect("pub.test:443")
    await h.connect("nowhere.test:443")
    await h.socks(p.SOCKS_ATYP_DOMAIN, b"\x08svc.test", up.port, OTHER)
    await h.request(b"CONNECT nonsense\r\n\r\n")
    got = [
        (session, target.host, target.port, d.allowed, d.rule, d.address)
        for session, target, d in h.decisions
    ]
    loop2 = ipaddress.ip_address("127.0.0.2")
    assert got == [
        (SID, "127.0.0.2", up.port, True, "address listed: 127.0.0.2", loop2),
        (SID, "svc.test", up.port, True, "address listed: 127.0.0.2", loop2),
        (
            SID,
            "pub.test",
            443,
            False,
            "not a public address (10.0.0.1) and not listed by address",
            None,
        ),
        (SID, "nowhere.test", 443, False, "not in the allowlist: nowhere.test:443", None),
        (OTHER, "svc.test", up.port, False, "mode none: this session has no network", None),
    ]


async def test_closing_the_proxy_cuts_tunnels_and_removes_sockets(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.echo("127.0.0.2")
    h = await start(allow("127.0.0.2"))
    _, reader, writer = await h.connect(up.authority)
    assert await echo(reader, writer, b"x") == b"x"
    await h.proxy.close_all()
    assert await read_to_eof(reader) == b""
    assert not h.paths[SID].exists()
    with pytest.raises(OSError):
        await asyncio.open_unix_connection(str(h.paths[SID]))


def _servers_listening_at(path: Path) -> list[asyncio.Server]:
    """Every asyncio server in this process still serving on the unix socket `path`."""
    gc.collect()
    return [
        server
        for server in gc.get_objects()
        if isinstance(server, asyncio.base_events.Server)
        and server.is_serving()
        and any(sock.getsockname() == str(path) for sock in server.sockets)
    ]


async def test_opening_one_session_twice_at_once_leaves_one_listener(
    start: Any, tmp_path: Path
) -> None:
    # A session's python and bash kernels start together and each asks for the socket: the
    # second open must not start a listener of its own that nothing will ever close.
    h = await start({})
    path = tmp_path / "twice.sock"
    await asyncio.gather(h.proxy.open(SID, path), h.proxy.open(SID, path))
    assert len(_servers_listening_at(path)) == 1
    await h.proxy.close(SID)
    assert _servers_listening_at(path) == []


async def test_closing_a_session_while_its_socket_opens_leaves_no_listener(
    start: Any, tmp_path: Path
) -> None:
    # A session deleted while its kernel starts: the close must wait for the open, or the
    # listener the open binds afterwards belongs to nobody.
    h = await start({})
    path = tmp_path / "closing.sock"
    opening = asyncio.create_task(h.proxy.open(SID, path))
    while SID not in h.proxy.sessions:  # the open is under way: binding its listener
        await asyncio.sleep(0)
    await h.proxy.close(SID)  # before the open has finished
    await opening
    assert _servers_listening_at(path) == []
    assert SID not in h.proxy.sessions


async def test_an_open_cancelled_at_any_step_leaves_no_listener_unheld(
    start: Any, tmp_path: Path
) -> None:
    # A pool kernel given up at close cancels its socket's open wherever it is; a listener
    # bound before that point must still be one the proxy holds, and closes.
    h = await start({})
    for steps in range(8):  # bounded: the open takes a few loop iterations
        path = tmp_path / f"cancel{steps}.sock"
        opening = asyncio.create_task(h.proxy.open(SID, path))
        for _ in range(steps):
            await asyncio.sleep(0)
        opening.cancel()
        await asyncio.gather(opening, return_exceptions=True)
        await h.proxy.close(SID)
        assert _servers_bound_at(path) == [], steps


def _servers_bound_at(path: Path) -> list[asyncio.Server]:
    """Every asyncio server in this process whose socket at `path` is still open, serving
    or not (one made and never started is a leak too)."""
    gc.collect()
    return [
        server
        for server in gc.get_objects()
        if isinstance(server, asyncio.base_events.Server)
        and any(sock.fileno() != -1 and sock.getsockname() == str(path) for sock in server.sockets)
    ]


# -- secrets put into plain-HTTP requests ------------------------------------------------------

PLACEHOLDER = "corral-secret-" + "ab" * 16
OTHER_PLACEHOLDER = "corral-secret-" + "cd" * 16


def attached_token(host: str) -> dict[bytes, Attached]:
    return {
        PLACEHOLDER.encode(): Attached(
            "API_TOKEN", tuple(parse_entry(host)), lambda: b"s3cr3t-value"
        )
    }


async def test_a_placeholder_becomes_the_value_on_the_secrets_host(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.http("127.0.0.2")
    told: list[tuple[Any, ...]] = []
    h = await start(
        allow("127.0.0.2"),
        secrets_for=lambda session: attached_token("127.0.0.2"),
        on_secret=lambda *args: told.append(args),
    )
    head = (
        f"GET http://{up.authority}/v1?key={PLACEHOLDER} HTTP/1.1\r\nHost: {up.authority}\r\n"
        f"Authorization: Bearer {PLACEHOLDER}\r\n\r\n"
    ).encode()
    response, _, _ = await h.request(head)
    assert response.status == 200
    sent = up.heads[0]
    assert b"authorization: bearer s3cr3t-value" in sent.lower()
    assert b"/v1?key=s3cr3t-value" in sent and PLACEHOLDER.encode() not in sent
    assert [(t[0], t[2], t[3]) for t in told] == [(SID, ("API_TOKEN",), None)]


async def test_a_placeholder_to_another_host_is_refused_and_told(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.http("127.0.0.2")
    told: list[tuple[Any, ...]] = []
    h = await start(
        allow("127.0.0.2"),
        secrets_for=lambda session: attached_token("api.example.com"),
        on_secret=lambda *args: told.append(args),
    )
    head = (
        f"GET http://{up.authority}/ HTTP/1.1\r\nHost: {up.authority}\r\n"
        f"X-Api-Key: {PLACEHOLDER}\r\n\r\n"
    ).encode()
    response, _, _ = await h.request(head)
    assert response.status == 403
    assert b"API_TOKEN may not be sent to 127.0.0.2" in response.body
    assert b"s3cr3t" not in response.body
    assert up.heads == []  # nothing reached the host
    assert told and told[0][2] == ("API_TOKEN",) and "may not be sent" in told[0][3]
    assert h.egress[SID].refused == 1


async def test_a_placeholder_the_session_does_not_hold_is_refused(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.http("127.0.0.2")
    h = await start(allow("127.0.0.2"), secrets_for=lambda session: attached_token("127.0.0.2"))
    head = (
        f"GET http://{up.authority}/ HTTP/1.1\r\nHost: {up.authority}\r\n"
        f"X-Api-Key: {OTHER_PLACEHOLDER}\r\n\r\n"
    ).encode()
    response, _, _ = await h.request(head)
    assert response.status == 403 and b"does not hold" in response.body
    assert up.heads == []


async def test_requests_without_placeholders_pass_untouched(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.http("127.0.0.2")
    told: list[tuple[Any, ...]] = []
    h = await start(
        allow("127.0.0.2"),
        secrets_for=lambda session: attached_token("127.0.0.2"),
        on_secret=lambda *args: told.append(args),
    )
    head = f"GET http://{up.authority}/plain HTTP/1.1\r\nHost: {up.authority}\r\n\r\n"
    response, _, _ = await h.request(head.encode())
    assert response.status == 200 and b"GET /plain" in up.heads[0]
    assert told == []


# -- method and path rules on the requests the proxy reads -------------------------------------


async def test_plain_http_requests_are_judged_by_method_and_path(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.http("127.0.0.2")
    h = await start(allow(f"GET 127.0.0.2:{up.port}/ok/"))
    allowed, _, _ = await h.request(
        f"GET http://{up.authority}/ok/x HTTP/1.1\r\nHost: {up.authority}\r\n\r\n".encode()
    )
    assert allowed.status == 200
    for head in (
        f"POST http://{up.authority}/ok/x HTTP/1.1\r\nHost: {up.authority}\r\n"
        "Content-Length: 0\r\n\r\n",
        f"GET http://{up.authority}/other HTTP/1.1\r\nHost: {up.authority}\r\n\r\n",
        f"GET http://{up.authority}/ok/../other HTTP/1.1\r\nHost: {up.authority}\r\n\r\n",
    ):
        refused, _, _ = await h.request(head.encode())
        assert refused.status == 403, head
        assert b"refused" in refused.body
    assert len(up.heads) == 1  # only the allowed request reached the origin
    assert [d[2].allowed for d in h.decisions][-1] is False  # each refusal is told


async def test_a_limited_host_is_refused_where_requests_cannot_be_read(
    start: Any, upstreams: Upstreams
) -> None:
    up = await upstreams.echo("127.0.0.2")
    h = await start(allow(f"GET 127.0.0.2:{up.port}/ok/"))  # this proxy has no CA
    response, _, _ = await h.connect(up.authority)
    assert response.status == 403 and b"cannot be read" in response.body
    reply, _, _ = await h.socks(
        p.SOCKS_ATYP_IPV4, ipaddress.IPv4Address("127.0.0.2").packed, up.port
    )
    assert reply[1] != 0  # refused
    assert up.received == b""
