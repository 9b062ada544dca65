"""Escape attempts through the network: the browser fetch, and the egress proxy from inside.

The browser attempts fetch host addresses the way an agent's tool call does
(`Service.fetch_page`, what MCP's navigate tool and REST call) under the battery's browsing
policy, the default `public`: no loopback, private or metadata address is listed.

The proxy attempts run in a session of their own (`esc-net`, deleted at the end, so A and B
keep their policy `none`), whose allowlist names one host address and port exactly. Code
inside writes raw bytes to the proxy its environment names and prints what came back. The
allowed host is a recorder on 127.0.0.2 that keeps every byte a connection brought (until
the client's end) and answers one fixed reply, so a test can say exactly what reached it
(the host web server answers before it reads a smuggled request, and closing with those bytes
unread resets the connection, which can lose its answer). The host web server is the listed
host where nothing is smuggled.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import socketserver
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest

from corral.browser.fetch import find_chromium
from corral.egress import protocol as p
from corral.egress.proxy import refusal_text, system_resolver
from corral.egress.rules import Decision
from corral.errors import FetchFailed
from corral.server.operation import wire
from corral.server.schemas import NetworkPolicyModel
from tests.escapes.battery import SECRET, WEB_HOST, A, B, Host, pending_connections, py

NET = "esc-net"
REPLY = b"HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\nrecorded"
# The recorder's reply as the proxy re-frames it for the client of a plain request.
RELAYED = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nrecorded"
MAX_RECORD_BYTES = 1024 * 1024
RECORD_S = 10.0  # how long the recorder waits for the client's end before it answers anyway
ESTABLISHED = "HTTP/1.1 200 Connection established\r\n\r\n"
SOCKS_GREETING = b"\x05\x01\x00"  # version 5, one method: no authentication
SOCKS_NOT_ALLOWED = (b"\x05\x00" + p.socks_reply(p.SOCKS_NOT_ALLOWED)).hex()

# -- the host side ---------------------------------------------------------------------------


def reached(host: Host) -> tuple[int, int]:
    """Requests the corral server got, connections the host web server got."""
    return len(host.server_hits), len(host.web_hits)


@dataclass
class Recorder:
    """The allowed host: each connection's bytes, recorded before it is answered."""

    port: int = 0
    received: list[bytes] = field(default_factory=list)

    @property
    def authority(self) -> str:
        return f"{WEB_HOST}:{self.port}"


@contextlib.contextmanager
def recording_upstream() -> Iterator[Recorder]:
    """A recorder on 127.0.0.2, stopped on exit (each connection's read bounded in bytes
    and time)."""
    recorder = Recorder()

    class Record(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.settimeout(RECORD_S)
            data = bytearray()
            with contextlib.suppress(OSError):
                while len(data) < MAX_RECORD_BYTES and (chunk := self.request.recv(65536)):
                    data += chunk
            recorder.received.append(bytes(data))  # before the reply: the client sees it after
            with contextlib.suppress(OSError):
                self.request.sendall(REPLY)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    tcp = Server((WEB_HOST, 0), Record)
    recorder.port = int(tcp.server_address[1])
    thread = threading.Thread(target=tcp.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield recorder
    finally:
        tcp.shutdown()
        tcp.server_close()
        thread.join(10)


@contextlib.contextmanager
def silent_listener() -> Iterator[tuple[socket.socket, int]]:
    """A host port on 127.0.0.2 that never accepts: connections made to it wait in its
    backlog, where `pending_connections` counts them."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((WEB_HOST, 0))
    listener.listen(16)
    try:
        yield listener, int(listener.getsockname()[1])
    finally:
        listener.close()


# -- the session and what runs in it ------------------------------------------------------


@pytest.fixture(scope="module")
async def net(host: Host) -> AsyncIterator[str]:
    """A session of this module's own; each test sets its policy first."""
    shared = {sid: host.service.network.policy(sid).policy for sid in (A, B)}
    await host.service.create_session(NET)
    try:
        yield NET
    finally:
        await host.service.delete_session(NET)
        assert {sid: host.service.network.policy(sid).policy for sid in (A, B)} == shared


async def allow_only(host: Host, sid: str, *entries: str) -> None:
    changed = wire(
        NetworkPolicyModel, await host.service.network.set(sid, "allowlist", list(entries))
    )
    assert (changed["mode"], changed["allow"]) == ("allowlist", list(entries)), changed


def stats(host: Host, sid: str) -> dict[str, int]:
    return dict(wire(NetworkPolicyModel, host.service.network.policy(sid))["stats"])


EXCHANGE = """
import json, os, socket, urllib.parse
def _exchange(data, variable):
    proxy = urllib.parse.urlsplit(os.environ[variable])
    with socket.create_connection((proxy.hostname, proxy.port), timeout=20) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # all sent: the far side answers once it reads the end
        got = b''
        while len(got) < 65536 and (chunk := sock.recv(65536)):
            got += chunk
    return got
"""


async def through_proxy(
    host: Host, sid: str, *requests: bytes, status_only: bool = False
) -> list[str]:
    """Each request sent raw on a connection of its own to the HTTP proxy the sandbox's
    HTTP_PROXY names; each whole reply (latin-1), or only its first line."""
    shown = "r.split(b'\\r\\n')[0]" if status_only else "r"
    code = (
        f"{EXCHANGE}\n_r = [_exchange(d, 'HTTP_PROXY') for d in {list(requests)!r}]\n"
        f"print(json.dumps([({shown}).decode('latin-1') for r in _r]))"
    )
    got: list[str] = await py(host, code, sid)
    return got


async def through_socks(host: Host, sid: str, atyp: int, raw: bytes, port: int) -> str:
    """A SOCKS5 CONNECT (greeting and request at once) to the proxy ALL_PROXY names; the
    reply bytes in hex."""
    request = SOCKS_GREETING + bytes([5, p.SOCKS_CONNECT, 0, atyp]) + raw + port.to_bytes(2, "big")
    code = f"{EXCHANGE}\nprint(json.dumps(_exchange({request!r}, 'ALL_PROXY').hex()))"
    got: str = await py(host, code, sid)
    return got


def forbidden(sid: str, host: str, port: int, rule: str, private: str | None = None) -> str:
    """The whole reply the proxy gives a refused HTTP client (`private`: the non-public
    address the target stood for, which the hint then names)."""
    decision = Decision(False, rule, private=ipaddress.ip_address(private) if private else None)
    text = refusal_text(sid, p.Target(host, port), decision)
    return p.http_reply(403, "Forbidden", text).decode("latin-1")


def bad_request(why: str) -> str:
    """The whole reply the proxy gives a request it will not parse as one request."""
    return p.http_reply(400, "Bad Request", f"corral proxy: {why}\n").decode("latin-1")


def loopback_rule(address: str) -> str:
    return f"not a public address ({address}) and not listed by address"


def get(url: str, host_header: str) -> bytes:
    return f"GET {url} HTTP/1.1\r\nHost: {host_header}\r\n\r\n".encode()


def connect(authority: str) -> bytes:
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()


def forwarded_get(path: str, host_header: str) -> bytes:
    """What the proxy sends on for `get(...)`: origin form, one request per connection."""
    return f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode()


def server_refused(host: Host, sid: str) -> str:
    """The reply to any request for the corral server's port."""
    return forbidden(sid, "127.0.0.1", host.server_port, loopback_rule("127.0.0.1"), "127.0.0.1")


def to_server(host: Host) -> bytes:
    """The request an attacker wants to reach the corral server with, proxy form."""
    server = f"127.0.0.1:{host.server_port}"
    return get(f"http://{server}/health", server)


# -- the browser fetch ------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(
    find_chromium(None) is None, reason="no Chromium installed on this host"
)

# (URL, what the proxy names the target it refused), {web} and {server} the host's ports.
BROWSER_TARGETS = [
    pytest.param("http://127.0.0.2:{web}/", "127.0.0.2:{web}", id="web-server"),
    pytest.param("http://127.0.0.1:{server}/health", "127.0.0.1:{server}", id="corral-server"),
    pytest.param("http://localhost:{server}/health", "localhost:{server}", id="localhost"),
    pytest.param("http://[::1]:{server}/health", "::1:{server}", id="ipv6-loopback"),
    pytest.param("http://0.0.0.0:{server}/health", "0.0.0.0:{server}", id="zeros"),
    # Chromium reads these as 127.0.0.2 before asking the proxy; the proxy would too.
    pytest.param("http://2130706434:{web}/", "127.0.0.2:{web}", id="decimal"),
    pytest.param("http://0x7f000002:{web}/", "127.0.0.2:{web}", id="hex"),
    pytest.param("http://0177.0.0.2:{web}/", "127.0.0.2:{web}", id="octal"),
    pytest.param("http://127.2:{web}/", "127.0.0.2:{web}", id="short"),
    pytest.param("http://[::ffff:127.0.0.2]:{web}/", "::ffff:7f00:2:{web}", id="v4-mapped"),
    pytest.param("http://169.254.169.254/latest/meta-data/", "169.254.169.254:80", id="metadata"),
    pytest.param("https://169.254.169.254/", "169.254.169.254:443", id="metadata-https"),
    pytest.param("http://[fd00:ec2::254]/latest/meta-data/", "fd00:ec2::254:80", id="metadata-v6"),
]


@needs_chromium
@pytest.mark.parametrize(("url", "named"), BROWSER_TARGETS)
async def test_browse_to_a_host_address(host: Host, url: str, named: str) -> None:
    ports = {"web": host.web_port, "server": host.server_port}
    url, named = url.format(**ports), named.format(**ports)
    before = reached(host)
    with pytest.raises(FetchFailed) as failure:
        await host.service.browser.fetch(url)
    message = str(failure.value)
    # It names the URL as Chromium wrote it (2130706434 is 127.0.0.2 by then).
    assert message.startswith("could not load http"), message
    # The rule names the address: a name (localhost) is refused for what it resolved to.
    assert f"the browsing policy refused {named} (not a public address (" in message, message
    assert "and not listed by address)" in message, message
    assert "CORRAL_BROWSER_NET" in message, message  # says what would change it
    assert SECRET not in message
    assert reached(host) == before


# The redirect attempt (an allowed page answering 302 to 127.0.0.1) needs a page the browsing
# policy admits; here that is only a public site. tests/browser/test_fetch.py makes that
# attempt with 127.0.0.2 listed in its own browsing policy
# (test_a_redirect_to_a_private_address_is_refused_and_never_reached).


# -- smuggling a second request past the proxy ---------------------------------------------


def chunked_post(recorder: Recorder, body: bytes, content_length: int) -> bytes:
    """A POST to the recorder with both framings (Content-Length and chunked)."""
    headers = (
        f"Host: {recorder.authority}\r\nContent-Length: {content_length}\r\n"
        "Transfer-Encoding: chunked\r\n"
    )
    return f"POST http://{recorder.authority}/upload HTTP/1.1\r\n{headers}\r\n".encode() + body


BOTH_FRAMINGS = "a request with both Content-Length and Transfer-Encoding is refused: send one"


async def smuggled(host: Host, sid: str, recorder: Recorder, sent: bytes, forwarded: bytes) -> None:
    """`sent` reaches the recorder as `forwarded`, once, on one connection the proxy checked;
    the corral server and the web server get nothing, the proxy decides nothing else."""
    before, counted = reached(host), stats(host, sid)
    assert await through_proxy(host, sid, sent) == [RELAYED]
    assert recorder.received == [forwarded]
    assert reached(host) == before
    after = stats(host, sid)
    assert after["connections"] - counted["connections"] == 1
    assert after["refused"] == counted["refused"]


async def refused_whole(host: Host, sid: str, recorder: Recorder, sent: bytes, why: str) -> None:
    """`sent` is answered 400 before anything is dialled: no host gets a byte."""
    before = reached(host)
    assert await through_proxy(host, sid, sent) == [bad_request(why)]
    assert recorder.received == []
    assert reached(host) == before


async def test_smuggle_a_request_to_the_server_after_the_chunked_end(host: Host, net: str) -> None:
    # Content-Length covers everything; the chunked body ends first. A proxy that framed
    # by chunks would read the hidden request as the next one and route it; this one
    # refuses a request with two framings whole (RFC 9112 6.3).
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        body = b"0\r\n\r\n" + to_server(host)
        await refused_whole(
            host, net, recorder, chunked_post(recorder, body, len(body)), BOTH_FRAMINGS
        )


async def test_smuggle_a_request_to_the_server_after_the_content_length_end(
    host: Host, net: str
) -> None:
    # Content-Length ends where the hidden request starts; for chunked framing it is the
    # data of one chunk. A proxy that framed by length would route it as the next request.
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        hidden = to_server(host)
        size = f"{len(hidden):x}\r\n".encode()
        body = size + hidden + b"\r\n0\r\n\r\n"
        await refused_whole(
            host, net, recorder, chunked_post(recorder, body, len(size)), BOTH_FRAMINGS
        )


async def test_smuggle_with_two_content_lengths(host: Host, net: str) -> None:
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        hidden = to_server(host)
        sent = (
            f"POST http://{recorder.authority}/ HTTP/1.1\r\nHost: {recorder.authority}\r\n"
            f"Content-Length: 0\r\nContent-Length: {len(hidden)}\r\n\r\n"
        ).encode() + hidden
        await refused_whole(
            host, net, recorder, sent, "a request with more than one Content-Length is refused"
        )


async def test_pipeline_a_request_to_the_server_behind_an_allowed_one(host: Host, net: str) -> None:
    # One request per connection: the proxy reads the first request (its head, and a body as
    # its framing says), sends that alone, and never reads what follows.
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        first = get(f"http://{recorder.authority}/first", recorder.authority)
        rewritten = forwarded_get("/first", recorder.authority)
        await smuggled(host, net, recorder, first + to_server(host), rewritten)


@pytest.mark.parametrize("behind", ["get", "connect", "post-body"])
async def test_pipeline_another_host_behind_an_allowed_request(
    host: Host, net: str, behind: str
) -> None:
    # A pipelined GET or CONNECT for another host, or one hidden after a body that ends
    # where its Content-Length says: none reaches the allowed host, none is dialled.
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        server = f"127.0.0.1:{host.server_port}"
        tail = {"get": to_server(host), "connect": connect(server), "post-body": to_server(host)}
        if behind == "post-body":
            first = (
                f"POST http://{recorder.authority}/ HTTP/1.1\r\nHost: {recorder.authority}\r\n"
                "Content-Length: 4\r\n\r\nbody"
            ).encode()
            rewritten = (
                f"POST / HTTP/1.1\r\nHost: {recorder.authority}\r\nContent-Length: 4\r\n"
                "Connection: close\r\n\r\nbody"
            ).encode()
        else:
            first = get(f"http://{recorder.authority}/", recorder.authority)
            rewritten = forwarded_get("/", recorder.authority)
        await smuggled(host, net, recorder, first + tail[behind], rewritten)


KEEP_ALIVE = """
import json, os, socket, urllib.parse
proxy = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])
replies = []
with socket.create_connection((proxy.hostname, proxy.port), timeout=20) as sock:
    for request in REQUESTS:
        try:
            sock.sendall(request)
            got = b''
            while chunk := sock.recv(65536):
                got += chunk
                if got.endswith(b'recorded') or b'corral' in got:
                    break
        except OSError as error:
            got = type(error).__name__.encode()
        replies.append(got.decode('latin-1'))
print(json.dumps(replies))
"""


async def test_send_the_next_request_for_another_host_on_a_kept_alive_connection(
    host: Host, net: str
) -> None:
    # A keep-alive client's second request, with credentials meant for another host: the
    # proxy told the client to close and closed; nothing of the second request is relayed.
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        first = get(f"http://{recorder.authority}/", recorder.authority)
        second = to_server(host).replace(b"\r\n\r\n", b"\r\nAuthorization: Bearer x\r\n\r\n")
        before = reached(host)
        code = KEEP_ALIVE.replace("REQUESTS", repr([first, second]))
        replies = await py(host, code, net)
        assert replies[0] == RELAYED
        assert replies[1] in ("", "BrokenPipeError", "ConnectionResetError"), replies
        assert recorder.received == [forwarded_get("/", recorder.authority)]
        assert reached(host) == before


async def test_pipeline_an_allowed_request_behind_one_to_the_server(host: Host, net: str) -> None:
    # The refused first request ends the connection: what follows it is never read.
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        before = reached(host)
        sent = to_server(host) + get(f"http://{recorder.authority}/", recorder.authority)
        assert await through_proxy(host, net, sent) == [server_refused(host, net)]
        assert recorder.received == []
        assert reached(host) == before


def host_mismatch(header: str, host: str, port: int) -> str:
    return (
        f"the Host header names {header!r} but the URL names {host}:{port}: a request goes "
        "only to the host its URL names"
    )


HEADS_READ_TWO_WAYS = [
    pytest.param(
        "Host: {a}\r\nX-A: 1\nHost: {s}",
        "a request head with a bare CR or LF is refused: end every line with CRLF",
        id="second-host-behind-a-bare-lf",
    ),
    pytest.param(
        "Host: {a}\r\nContent-Length: 5\nTransfer-Encoding: chunked",
        "a request head with a bare CR or LF is refused: end every line with CRLF",
        id="second-framing-behind-a-bare-lf",
    ),
    pytest.param(
        "Host: {a}\r\nContent-Length: 5\rTransfer-Encoding: chunked",
        "a request head with a bare CR or LF is refused: end every line with CRLF",
        id="second-framing-behind-a-bare-cr",
    ),
    pytest.param(
        "Host: {a}\r\nContent-Length: 0, 63",
        "a request with more than one Content-Length is refused",
        id="two-lengths-in-one-field",
    ),
]


@pytest.mark.parametrize(("fields", "why"), HEADS_READ_TWO_WAYS)
async def test_hide_a_second_host_or_framing_in_the_head(
    host: Host, net: str, fields: str, why: str
) -> None:
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        server = f"127.0.0.1:{host.server_port}"
        hidden = to_server(host)
        head = fields.format(a=recorder.authority, s=server)
        sent = f"POST http://{recorder.authority}/ HTTP/1.1\r\n{head}\r\n\r\n".encode()
        await refused_whole(host, net, recorder, sent + hidden, why)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://{s}@{a}/", id="userinfo"),
        pytest.param("http://{s}\\@{a}/", id="userinfo-backslash"),
    ],
)
async def test_name_the_server_as_userinfo_of_an_allowed_url(
    host: Host, net: str, url: str
) -> None:
    # The Host header the proxy writes names only the host it dials; userinfo is refused.
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        target = url.format(s=f"127.0.0.1:{host.server_port}", a=recorder.authority)
        sent = f"GET {target} HTTP/1.1\r\n\r\n".encode()
        before = reached(host)
        [reply] = await through_proxy(host, net, sent, status_only=True)
        assert reply == "HTTP/1.1 400 Bad Request"
        assert recorder.received == [] and reached(host) == before


@pytest.mark.parametrize(
    "url", ["http://[127.0.0.1]:{p}/", "http://[::1/", "http://[::1]:{p}:{p}/"]
)
async def test_crash_the_proxy_with_a_host_it_cannot_parse(host: Host, net: str, url: str) -> None:
    # Each is a 400 on a connection that ends, not an exception inside the proxy.
    await allow_only(host, net, "127.0.0.1", "::1")
    target = url.format(p=host.server_port)
    before = reached(host)
    replies = await through_proxy(host, net, *[f"GET {target} HTTP/1.1\r\n\r\n".encode()] * 5)
    assert all(reply.startswith("HTTP/1.1 400 Bad Request\r\n") for reply in replies), replies
    assert reached(host) == before


async def test_route_to_the_server_by_the_host_header_of_an_allowed_url(
    host: Host, net: str
) -> None:
    # The URL decides where the proxy connects, and a Host header naming another host is
    # refused: behind a shared front end it would reach a site the policy never admitted.
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        server = f"127.0.0.1:{host.server_port}"
        sent = get(f"http://{recorder.authority}/", server)
        await refused_whole(
            host, net, recorder, sent, host_mismatch(server, WEB_HOST, recorder.port)
        )


async def test_reach_the_server_by_url_under_an_allowed_host_header(host: Host, net: str) -> None:
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        sent = get(f"http://127.0.0.1:{host.server_port}/health", recorder.authority)
        why = host_mismatch(recorder.authority, "127.0.0.1", host.server_port)
        await refused_whole(host, net, recorder, sent, why)


async def test_send_two_host_headers(host: Host, net: str) -> None:
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        server = f"127.0.0.1:{host.server_port}"
        sent = (
            f"GET http://{recorder.authority}/ HTTP/1.1\r\nHost: {recorder.authority}\r\n"
            f"Host: {server}\r\n\r\n"
        ).encode()
        await refused_whole(
            host, net, recorder, sent, "a request with more than one Host header is refused"
        )


async def test_route_an_origin_form_request_by_its_host_header(host: Host, net: str) -> None:
    # A request without an absolute URL is not routed by its Host header: it is refused.
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        before = reached(host)
        replies = await through_proxy(
            host,
            net,
            get("/health", f"127.0.0.1:{host.server_port}"),
            get("/", recorder.authority),
        )
        assert replies == [
            p.http_reply(400, "Bad Request", f"corral proxy: {why}\n").decode()
            for why in (
                "only CONNECT and absolute http:// URLs go through this proxy, not '/health'",
                "only CONNECT and absolute http:// URLs go through this proxy, not '/'",
            )
        ]
        assert recorder.received == []
        assert reached(host) == before


async def test_connect_again_inside_an_allowed_tunnel(host: Host, net: str) -> None:
    # The inner CONNECT is sent before the tunnel's answer, with a request behind it: all of
    # it is tunnel data for the allowed host, which is the only host dialled.
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        server = f"127.0.0.1:{host.server_port}"
        inner = connect(server) + get("/health", server)
        before, counted = reached(host), stats(host, net)
        assert await through_proxy(host, net, connect(recorder.authority) + inner) == [
            ESTABLISHED + REPLY.decode()
        ]
        assert recorder.received == [inner]
        assert reached(host) == before
        assert stats(host, net)["refused"] == counted["refused"]


async def test_send_a_request_into_a_refused_tunnel_before_its_answer(host: Host, net: str) -> None:
    with recording_upstream() as recorder:
        await allow_only(host, net, recorder.authority)
        server = f"127.0.0.1:{host.server_port}"
        before = reached(host)
        replies = await through_proxy(host, net, connect(server) + get("/health", server))
        assert replies == [server_refused(host, net)]
        assert reached(host) == before


# -- names and ports the allowlist does not admit ------------------------------------------


@pytest.mark.parametrize("rule", ["localhost", "localhost:{server}"])
async def test_reach_the_server_through_an_allowlisted_localhost(
    host: Host, net: str, rule: str
) -> None:
    # README: a name rule never admits an address that is not global; only listing the
    # exact address would. The proxy resolves localhost itself, as the host does.
    await allow_only(host, net, rule.format(server=host.server_port))
    port = host.server_port
    shown = ", ".join(str(a) for a in (await system_resolver("localhost", port))[:3])
    before, counted = reached(host), stats(host, net)
    replies = await through_proxy(
        host,
        net,
        get(f"http://localhost:{port}/health", f"localhost:{port}"),
        get(f"http://LOCALHOST.:{port}/health", f"localhost:{port}"),
        connect(f"localhost:{port}"),
    )
    first = shown.split(", ")[0]
    assert replies == [forbidden(net, "localhost", port, loopback_rule(shown), first)] * 3
    socks = await through_socks(host, net, p.SOCKS_ATYP_DOMAIN, b"\x09localhost", port)
    assert socks == SOCKS_NOT_ALLOWED
    assert reached(host) == before
    assert stats(host, net)["refused"] - counted["refused"] == 4


async def test_reach_another_port_of_an_allowed_address(host: Host, net: str) -> None:
    await allow_only(host, net, f"{WEB_HOST}:{host.web_port}")
    with silent_listener() as (listener, other):
        before = reached(host)
        replies = await through_proxy(
            host,
            net,
            get(f"http://{WEB_HOST}:{other}/", f"{WEB_HOST}:{other}"),
            connect(f"{WEB_HOST}:{other}"),
            get(f"http://{WEB_HOST}/", WEB_HOST),
        )
        refused = loopback_rule(WEB_HOST)
        assert replies == [
            forbidden(net, WEB_HOST, other, refused, WEB_HOST),
            forbidden(net, WEB_HOST, other, refused, WEB_HOST),
            forbidden(net, WEB_HOST, 80, refused, WEB_HOST),
        ]
        raw = socket.inet_aton(WEB_HOST)
        assert await through_socks(host, net, p.SOCKS_ATYP_IPV4, raw, other) == SOCKS_NOT_ALLOWED
        assert pending_connections(listener) == 0
        assert reached(host) == before
        # The control: the listed port itself is reached (its body, the secret, stays inside).
        web = get(f"http://{WEB_HOST}:{host.web_port}/", f"{WEB_HOST}:{host.web_port}")
        assert await through_proxy(host, net, web, status_only=True) == ["HTTP/1.1 200 OK"]
        assert reached(host) == (before[0], before[1] + 1)
