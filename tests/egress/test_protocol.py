"""The proxy's request parsing: one request, to the host its URL names, framed one way."""

from __future__ import annotations

import pytest

from corral.egress.protocol import HttpRequest, ProtocolError, Target, parse_http


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def upstream_fields(request: HttpRequest) -> list[tuple[bytes, bytes]]:
    assert request.upstream is not None
    return list(request.upstream.headers.raw_items())


def test_a_missing_host_header_is_added_from_the_url() -> None:
    request = parse_http(head("GET http://example.com:8080/a?b=1 HTTP/1.0"))
    assert request.target == Target("example.com", 8080)
    assert request.upstream is not None and request.upstream.target == b"/a?b=1"
    assert upstream_fields(request) == [(b"Host", b"example.com:8080"), (b"Connection", b"close")]


@pytest.mark.parametrize(
    "value", ["example.com", "EXAMPLE.com.", "example.com:80", "Example.COM:80"]
)
def test_a_host_header_naming_the_urls_host_is_kept_as_written(value: str) -> None:
    request = parse_http(head("GET http://example.com/ HTTP/1.1", f"Host: {value}", "X-A: 1"))
    assert upstream_fields(request) == [
        (b"Host", value.encode()),
        (b"X-A", b"1"),
        (b"Connection", b"close"),
    ]


@pytest.mark.parametrize(
    "value", ["other.example", "example.com:81", "127.0.0.1", "example.com.evil.example", ""]
)
def test_a_host_header_naming_another_host_is_refused(value: str) -> None:
    with pytest.raises(ProtocolError, match="Host header"):
        parse_http(head("GET http://example.com/ HTTP/1.1", f"Host: {value}"))


def test_an_ipv6_host_header_matches_its_url() -> None:
    request = parse_http(
        head("GET http://[2001:db8::1]:8080/ HTTP/1.1", "Host: [2001:db8::1]:8080")
    )
    assert request.target == Target("2001:db8::1", 8080)


def test_two_host_headers_are_refused() -> None:
    with pytest.raises(ProtocolError, match="more than one Host header"):
        parse_http(
            head("GET http://example.com/ HTTP/1.1", "Host: example.com", "host: example.com")
        )


def test_both_framings_are_refused() -> None:
    with pytest.raises(ProtocolError, match="both Content-Length and Transfer-Encoding"):
        parse_http(
            head(
                "POST http://example.com/ HTTP/1.1",
                "Host: example.com",
                "Content-Length: 5",
                "Transfer-Encoding: chunked",
            )
        )


def test_two_different_lengths_are_refused_and_a_repeated_one_is_not() -> None:
    with pytest.raises(ProtocolError, match="more than one Content-Length"):
        parse_http(
            head(
                "POST http://example.com/ HTTP/1.1",
                "Host: example.com",
                "Content-Length: 5",
                "Content-Length: 6",
            )
        )
    parse_http(
        head(
            "POST http://example.com/ HTTP/1.1",
            "Host: example.com",
            "Content-Length: 5",
            "Content-Length: 5",
        )
    )


@pytest.mark.parametrize(
    ("line", "refusal"),
    [
        ("Host: example.com\nX-B: 1", "bare CR or LF"),
        ("Host: example.com\rX-B: 1", "bare CR or LF"),
        ("Host: example.com\r\n folded", "folded"),
        ("Host: example.com\r\nContent-Length: 0, 63", "Content-Length"),
    ],
)
def test_a_head_another_parser_could_read_differently_is_refused(line: str, refusal: str) -> None:
    with pytest.raises(ProtocolError, match=refusal):
        parse_http(head("POST http://example.com/ HTTP/1.1", line))


@pytest.mark.parametrize(
    "url",
    [
        "http://a.example:1@example.com/",
        "http://a.example:1\\@example.com/",
        "http://[127.0.0.1]:80/",
        "http://[::1/",
        "http://example.com:80:80/",
    ],
)
def test_a_url_with_userinfo_or_a_host_read_two_ways_is_refused(url: str) -> None:
    with pytest.raises(ProtocolError):
        parse_http(head(f"GET {url} HTTP/1.0"))
