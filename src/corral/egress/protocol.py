"""Parsing what a sandboxed client sends the proxy: an HTTP proxy request or a SOCKS5 request.

Pure functions over bytes; the proxy does the reading and writing. Every malformed input is
a `ProtocolError` with the reply the client should get.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

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
    """A parsed proxy request: CONNECT (a tunnel) or a plain-HTTP request to forward."""

    target: Target
    tunnel: bool
    upstream_head: bytes = b""  # the request rewritten for the origin server (not CONNECT)


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
    """The request in `head` (everything up to and including the blank line)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes any byte
        raise ProtocolError("undecodable request") from exc
    request_line, _, rest = text.partition("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ProtocolError(f"malformed request line {request_line[:200]!r}")
    method, target, version = parts
    if method == "CONNECT":
        host, port = _split_authority(target)
        return HttpRequest(parse_target(host, port), tunnel=True)
    return _forward_request(method, target, version, rest)


def _split_authority(authority: str) -> tuple[str, int]:
    if authority.startswith("["):
        host, sep, rest = authority[1:].partition("]")
        port_text = rest[1:] if sep and rest.startswith(":") else ""
    else:
        host, _, port_text = authority.rpartition(":")
    if not host or not port_text.isdigit():
        raise ProtocolError(f"CONNECT needs host:port, not {authority[:200]!r}")
    return host, int(port_text)


def _forward_request(method: str, target: str, version: str, rest: str) -> HttpRequest:
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise ProtocolError(
            f"only CONNECT and absolute http:// URLs go through this proxy, not {target[:200]!r}"
        )
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise ProtocolError(f"bad port in {target[:200]!r}") from exc
    target_host = parse_target(parts.hostname, port)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    header_lines = [line for line in rest.split("\r\n") if line]
    _check_framing(header_lines)
    authority = _check_host_header(header_lines, target_host)
    lines = [f"{method} {path} {version}"]
    if authority is None:
        lines.append(f"Host: {parts.netloc}")
    drop = HOP_BY_HOP | _connection_tokens(header_lines)
    for line in header_lines:
        if line.split(":", 1)[0].strip().lower().encode() not in drop:
            lines.append(line)
    lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return HttpRequest(target_host, tunnel=False, upstream_head=head)


def _headers_named(header_lines: list[str], name: str) -> list[str]:
    return [
        line.partition(":")[2].strip()
        for line in header_lines
        if line.partition(":")[0].strip().lower() == name
    ]


def _check_framing(header_lines: list[str]) -> None:
    """One way to tell where the body ends, or the request is refused: a request with both
    Content-Length and Transfer-Encoding, or two lengths, is how requests are smuggled past
    a proxy (RFC 9112 6.3 lets an intermediary refuse it)."""
    lengths = set(_headers_named(header_lines, "content-length"))
    if lengths and _headers_named(header_lines, "transfer-encoding"):
        raise ProtocolError(
            "a request with both Content-Length and Transfer-Encoding is refused: send one"
        )
    if len(lengths) > 1:
        raise ProtocolError("a request with more than one Content-Length is refused")


def _check_host_header(header_lines: list[str], target: Target) -> str | None:
    """The request's Host header when it names the host the URL names (None when there is
    none); refused otherwise, so a request goes only to the site its URL names, never to
    another one behind the same address."""
    hosts = _headers_named(header_lines, "host")
    if not hosts:
        return None
    if len(hosts) > 1:
        raise ProtocolError("a request with more than one Host header is refused")
    try:
        named = parse_target(*_host_and_port(hosts[0], target.port))
    except ProtocolError as exc:
        raise ProtocolError(f"bad Host header {hosts[0][:200]!r}") from exc
    if named != target:
        raise ProtocolError(
            f"the Host header names {hosts[0][:200]!r} but the URL names "
            f"{target.host}:{target.port}: a request goes only to the host its URL names"
        )
    return hosts[0]


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


def _connection_tokens(header_lines: list[str]) -> frozenset[bytes]:
    """Header names the client's Connection header marks as hop-by-hop (RFC 9110 7.6.1)."""
    tokens: set[bytes] = set()
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "connection":
            tokens.update(t.strip().lower().encode() for t in value.split(",") if t.strip())
    return frozenset(tokens)


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
