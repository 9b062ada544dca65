"""Placeholders replaced by their secrets' values, only where each secret may go."""

from __future__ import annotations

import base64
import ipaddress

import h11
import pytest

from corral.egress.injection import Attached, SecretRefused, inject
from corral.egress.protocol import Target
from corral.egress.rules import parse_entry

TOKEN = "corral-secret-" + "1f" * 16
PASSWORD = "corral-secret-" + "2e" * 16
API = Target("api.example.com", 443)


def secret(name: str, hosts: str, value: bytes) -> Attached:
    entries = tuple(e for host in hosts.split(",") for e in parse_entry(host))
    return Attached(name, entries, lambda: value)


HELD = {
    TOKEN.encode(): secret("API_TOKEN", "api.example.com", b"tok-value"),
    PASSWORD.encode(): secret("DB_PASSWORD", "*.example.com,10.0.0.0/8", b"pw-value"),
}


def request(*headers: tuple[str, str], target: str = "/") -> h11.Request:
    return h11.Request(method="GET", target=target, headers=[("Host", API.host), *headers])


def header(done: h11.Request, name: bytes) -> bytes:
    return next(value for key, value in done.headers if key == name)


def test_a_bearer_header_gets_the_value() -> None:
    done = inject(request(("Authorization", f"Bearer {TOKEN}")), API, None, HELD)
    assert header(done.request, b"authorization") == b"Bearer tok-value"
    assert done.names == ("API_TOKEN",)


def test_basic_auth_gets_the_value_inside_its_encoding() -> None:
    encoded = base64.b64encode(f"me:{PASSWORD}".encode()).decode()
    done = inject(request(("Authorization", f"Basic {encoded}")), API, None, HELD)
    sent = header(done.request, b"authorization")
    assert base64.b64decode(sent.split()[1]) == b"me:pw-value"
    assert done.names == ("DB_PASSWORD",)


def test_two_secrets_in_one_request_and_the_url() -> None:
    done = inject(request(("X-Key", TOKEN), target=f"/q?password={PASSWORD}"), API, None, HELD)
    assert header(done.request, b"x-key") == b"tok-value"
    assert done.request.target == b"/q?password=pw-value"
    assert done.names == ("API_TOKEN", "DB_PASSWORD")


def test_a_secret_goes_to_an_address_its_entries_list() -> None:
    address = ipaddress.ip_address("10.1.2.3")
    done = inject(request(("X-Key", PASSWORD)), Target("db.internal", 5432), address, HELD)
    assert header(done.request, b"x-key") == b"pw-value"


@pytest.mark.parametrize(
    "target", [Target("evil.example", 443), Target("api.example.com.evil", 443)]
)
def test_a_secret_is_refused_on_any_other_host(target: Target) -> None:
    with pytest.raises(SecretRefused) as refused:
        inject(request(("Authorization", f"Bearer {TOKEN}")), target, None, HELD)
    assert refused.value.name == "API_TOKEN"
    assert "tok-value" not in refused.value.reason


def test_one_refused_secret_refuses_the_whole_request() -> None:
    mixed = request(("X-A", PASSWORD), ("X-B", TOKEN))
    with pytest.raises(SecretRefused):
        inject(mixed, Target("db.example.com", 443), None, HELD)  # TOKEN may not go there


def test_an_unknown_placeholder_is_refused() -> None:
    stranger = "corral-secret-" + "00" * 16
    with pytest.raises(SecretRefused) as refused:
        inject(request(("X-Key", stranger)), API, None, HELD)
    assert refused.value.name is None


def test_a_value_that_cannot_be_a_header_is_refused_without_showing_it() -> None:
    held = {TOKEN.encode(): secret("API_TOKEN", "api.example.com", b"line\r\nX-Evil: 1")}
    with pytest.raises(SecretRefused) as refused:
        inject(request(("X-Key", TOKEN)), API, None, held)
    assert "X-Evil" not in str(refused.value) and "line" not in str(refused.value)


def test_a_request_without_placeholders_is_the_same_request() -> None:
    plain = request(("X-Key", "corral-secret-short"))
    done = inject(plain, API, None, HELD)
    assert done.request is plain and done.names == ()
