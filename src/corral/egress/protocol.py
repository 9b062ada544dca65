"""Parsing what a sandboxed client sends the proxy: an HTTP proxy request or a SOCKS5 request.

Pure functions over bytes; the proxy does the reading and writing. Every malformed input is
a `ProtocolError` with the reply the client should get.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from corral.egress.rules import literal_address, normalise_name

MAX_HEAD_BYTES = 64 * 1024
HOP_BY_HOP = frozenset(
    {
        b"proxy-connection",
        b"proxy-authorization",
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authenticate",
    }
)

SOCKS_VERSION = 5
SOCKS_NO_AUTH = 0
SOCKS_NO_ACCEPTABLE = 0xFF
SOCKS_CONNECT = 1
SOCKS_ATYP_IPV4, SOCKS_ATYP_DOMAIN, SOCKS_ATYP_IPV6 = 1, 3, 4
SOCKS_OK = 0
SOCKS_GENERAL_FAILURE = 1
SOCKS_NOT_ALLOWED = 2
SOCKS_HOST_UNREACHABLE = 4
SOCKS_REFUSED = 5
SOCKS_COMMAND_UNSUPPORTED = 7
SOCKS_ATYP_UNSUPPORTED = 8


class ProtocolError(Exception):
    """Malformed input; `status` is the HTTP status (or SOCKS reply code) to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Target:
    """Where a client wants to go: a normalised host (name or literal address) and a port."""

    host: str
    port: int


@dataclass(frozen=True)
class HttpRequest:
    """A parsed proxy request: CONNECT (a tunnel) or one plain-HTTP request to forward.

    For a plain request, `upstream` is the request as the origin gets it (origin-form target,
    hop-by-hop headers dropped, `Connection: close`), and `client` is the client's side of the
    connection, past the request head: what reads the request's body and frames the answer.
    """

    target: Target
    tunnel: bool
    upstream: h11.Request | None = None
    client: h11.Connection | None = None


def parse_target(host: str, port: int) -> Target:
    """`host` checked and normalised; raises `ProtocolError` for a bad host or port."""
    if not 0 < port < 65536:
        raise ProtocolError(f"bad port {port}")
    address = literal_address(host)
    if address is not None:
        return Target(str(address), port)
    name = normalise_name(host)
    if name is None:
        raise ProtocolError(f"bad host name {host[:100]!r}")
    return Target(name, port)


def parse_http(head: bytes) -> HttpRequest:
    """The request in `head` (everything up to and including the blank line).

    A head that another parser could read differently is refused rather than repaired: a bare
    CR or LF, a folded line, two Host headers, two framings, two lengths.
    """
    if _BARE_LINE_END.search(head):
        raise ProtocolError(
            "a request head with a bare CR or LF is refused: end every line with CRLF"
        )
    request_line = head.partition(b"\r\n")[0].decode("latin-1")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ProtocolError(f"malformed request line {request_line[:200]!r}")
    method, target, _ = parts
    if method == "CONNECT":
        host, port = _split_authority(target)
        return HttpRequest(parse_target(host, port), tunnel=True)
    return _forward_request(head)


_BARE_LINE_END = re.compile(rb"\r(?!\n)|(?<!\r)\n")


def _split_authority(authority: str) -> tuple[str, int]:
    if authority.startswith("["):
        host, sep, rest = authority[1:].partition("]")
        port_text = rest[1:] if sep and rest.startswith(":") else ""
    else:
        host, _, port_text = authority.rpartition(":")
    if not host or not port_text.isdigit():
        raise ProtocolError(f"CONNECT needs host:port, not {authority[:200]!r}")
    return host, int(port_text)


def _forward_request(head: bytes) -> HttpRequest:
    client, event, fields = _read_head(head)
    target_text = event.target.decode("latin-1")
    target, path, authority = _absolute_url(target_text)
    host = _check_host_header(fields, target)
    return _upstream(target, client, event, path, authority if host is None else host, fields)


def parse_tunnelled(head: bytes, target: Target) -> HttpRequest:
    """A request read inside an intercepted tunnel to `target`: it names a path (origin
    form), and its Host header, when it sends one, names the tunnel's target. Refused like
    any other request head (`ProtocolError`)."""
    client, event, fields = _read_head(head)
    if not event.target.startswith(b"/"):
        raise ProtocolError("inside a tunnel a request names a path, not a whole URL")
    host = _check_host_header(fields, target)
    if host is None:
        shown = f"[{target.host}]" if ":" in target.host else target.host
        host = (shown if target.port == 443 else f"{shown}:{target.port}").encode()
    return _upstream(target, client, event, event.target, host, fields)


def _read_head(head: bytes) -> tuple[h11.Connection, h11.Request, Fields]:
    """The client's side of the connection past `head`, the request, and its fields as
    written; refused when another parser could read it differently."""
    if re.search(rb"\r\n[ \t]", head):
        raise ProtocolError("a folded header line is refused: send each header on one line")
    lines = head.split(b"\r\n")[1:]
    written = [
        (name.strip(), value.strip()) for name, _, value in (x.partition(b":") for x in lines)
    ]
    _check_framing(written)  # first, in corral's words; h11 refuses the same and more
    if len(_values(written, b"host")) > 1:
        raise ProtocolError("a request with more than one Host header is refused")
    client = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    client.receive_data(head)
    try:
        event = client.next_event()
    except h11.RemoteProtocolError as exc:
        raise ProtocolError(f"malformed request: {exc}") from exc
    if not isinstance(event, h11.Request):  # pragma: no cover - a whole head is one event
        raise ProtocolError("malformed request")
    return client, event, list(event.headers.raw_items())


def _upstream(
    target: Target,
    client: h11.Connection,
    event: h11.Request,
    path: bytes,
    host: bytes,
    fields: Fields,
) -> HttpRequest:
    """The request as the origin gets it: origin form, its Host, end-to-end headers only,
    and `Connection: close`."""
    headers = [(b"Host", host)]
    headers += [(n, v) for n, v in end_to_end(fields) if n.lower() != b"host"]
    headers.append((b"Connection", b"close"))
    upstream = h11.Request(method=event.method, target=path, headers=headers)
    return HttpRequest(target, tunnel=False, upstream=upstream, client=client)


def _absolute_url(text: str) -> tuple[Target, bytes, bytes]:
    """The target, the origin-form path and the Host value of an absolute http:// URL.

    Userinfo is refused (`http://a@b/` would otherwise reach b with a Host some servers read
    as a), and so is a host or port `urlsplit` cannot parse (`http://[::1/`)."""
    try:
        parts = urlsplit(text)
        port = parts.port or 80
        hostname = parts.hostname
    except ValueError as exc:
        raise ProtocolError(f"bad host or port in {text[:200]!r}") from exc
    if parts.scheme != "http" or not hostname:
        raise ProtocolError(
            f"only CONNECT and absolute http:// URLs go through this proxy, not {text[:200]!r}"
        )
    if "@" in parts.netloc or "\\" in parts.netloc:
        raise ProtocolError(
            f"a URL with a user name or password is refused ({text[:200]!r}): "
            "send credentials in an Authorization header"
        )
    target = parse_target(hostname, port)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return target, path.encode("latin-1"), parts.netloc.encode("latin-1")


Fields = list[tuple[bytes, bytes]]


def _values(fields: Fields, name: bytes) -> list[bytes]:
    return [value for field, value in fields if field.lower() == name]


def _check_framing(fields: Fields) -> None:
    """One way to tell where the body ends, or the request is refused: a request with both
    Content-Length and Transfer-Encoding, or two lengths, is how requests are smuggled past
    a proxy (RFC 9112 6.3 lets an intermediary refuse it)."""
    lengths = {v.strip() for value in _values(fields, b"content-length") for v in value.split(b",")}
    if lengths and _values(fields, b"transfer-encoding"):
        raise ProtocolError(
            "a request with both Content-Length and Transfer-Encoding is refused: send one"
        )
    if len(lengths) > 1:
        raise ProtocolError("a request with more than one Content-Length is refused")


def _check_host_header(fields: Fields, target: Target) -> bytes | None:
    """The request's Host header when it names the host the URL names (None when there is
    none); refused otherwise, so a request goes only to the site its URL names, never to
    another one behind the same address."""
    hosts = [value.decode("latin-1") for value in _values(fields, b"host")]
    if not hosts:
        return None
    try:
        named = parse_target(*_host_and_port(hosts[0], target.port))
    except ProtocolError as exc:
        raise ProtocolError(f"bad Host header {hosts[0][:200]!r}") from exc
    if named != target:
        raise ProtocolError(
            f"the Host header names {hosts[0][:200]!r} but the URL names "
            f"{target.host}:{target.port}: a request goes only to the host its URL names"
        )
    return hosts[0].encode("latin-1")


def _host_and_port(value: str, default_port: int) -> tuple[str, int]:
    """A Host header's host and port (the URL's port when it names none)."""
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
    else:
        host, _, rest = value.partition(":")
        rest = ":" + rest if rest else ""
    port_text = rest[1:] if rest.startswith(":") else ""
    if port_text and not port_text.isdigit():
        raise ProtocolError(f"bad port in Host header {value[:200]!r}")
    return host, int(port_text) if port_text else default_port


def _connection_tokens(fields: Fields) -> frozenset[bytes]:
    """Header names a Connection header marks as hop-by-hop (RFC 9110 7.6.1)."""
    tokens: set[bytes] = set()
    for value in _values(fields, b"connection"):
        tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return frozenset(tokens)


def end_to_end(fields: Fields) -> Fields:
    """`fields` without the hop-by-hop headers and those its Connection header names."""
    drop = HOP_BY_HOP | _connection_tokens(fields)
    return [(name, value) for name, value in fields if name.lower() not in drop]


def http_reply(status: int, reason: str, body: str = "") -> bytes:
    data = body.encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode() + data


def socks_reply(code: int) -> bytes:
    return bytes([SOCKS_VERSION, code, 0, SOCKS_ATYP_IPV4, 0, 0, 0, 0, 0, 0])


def socks_address(atyp: int, raw: bytes) -> str:
    """The host of a SOCKS5 request from its address type and bytes."""
    if atyp == SOCKS_ATYP_IPV4:
        return str(ipaddress.IPv4Address(raw))
    if atyp == SOCKS_ATYP_IPV6:
        return str(ipaddress.IPv6Address(raw))
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ProtocolError("non-ASCII host name", SOCKS_GENERAL_FAILURE) from exc
