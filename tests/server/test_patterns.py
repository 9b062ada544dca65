"""The REST API's string patterns are exactly as wide as the parsers behind them.

A request whose strings match the document's patterns must not be refused for their shape
later, so every string drawn from a pattern is fed to the parser that would meet it.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.audit import KINDS
from corral.browser.fetch import validate_url
from corral.egress.rules import parse_entry
from corral.errors import InvalidInput
from corral.mounts import check_name
from corral.sandbox.limits import parse_size
from corral.server import patterns
from corral.server.openapi import document

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(st.from_regex(patterns.HOST_ENTRY, fullmatch=True).filter(lambda h: len(h) <= 253))
def test_every_host_entry_the_pattern_admits_is_parsed(entry: str) -> None:
    assert parse_entry(entry)


@SETTINGS
@given(st.from_regex(patterns.RULE_ENTRY, fullmatch=True).filter(lambda h: len(h) <= 300))
def test_every_rule_entry_the_pattern_admits_is_parsed(entry: str) -> None:
    assert parse_entry(entry)


@pytest.mark.parametrize(
    "entry",
    [
        "GET,POST api.github.com/repos/acme/",
        "api.example.com/v1",
        "DELETE 127.0.0.2:8080/x",
        "GET [::1]:443/a",
        "10.0.0.0/8",
        "pypi",
    ],
)
def test_the_rule_entries_people_write_match(entry: str) -> None:
    assert re.fullmatch(patterns.RULE_ENTRY, entry)


@pytest.mark.parametrize(
    "entry", ["GET 10.0.0.0/8", "FETCH a.org", "get a.org", "a.org//x", "a.org/a b", "a.org/%2e"]
)
def test_malformed_rule_entries_do_not_match(entry: str) -> None:
    assert not re.fullmatch(patterns.RULE_ENTRY, entry)


@SETTINGS
@given(st.from_regex(patterns.URL, fullmatch=True).filter(lambda u: len(u) <= 8192))
def test_every_url_the_pattern_admits_can_be_fetched(url: str) -> None:
    assert validate_url(url) == url


@SETTINGS
@given(st.from_regex(patterns.MOUNT_NAME, fullmatch=True))
def test_every_mount_name_the_pattern_admits_is_a_mount_name(name: str) -> None:
    assert check_name(name) == name


@SETTINGS
@given(st.from_regex(patterns.SIZE, fullmatch=True))
def test_every_size_the_pattern_admits_is_a_size(text: str) -> None:
    assert parse_size(text) >= 0


@pytest.mark.parametrize(
    "entry",
    ["pypi", "*.example.org:443", "10.0.0.0/8", "192.168.1.2:8080", "fd00::/8", "[::1]:443"],
)
def test_the_host_entries_people_write_match(entry: str) -> None:
    assert re.fullmatch(patterns.HOST_ENTRY, entry)


@pytest.mark.parametrize("entry", ["", " pypi", "exa mple.org", "-a.org", "a.org:0", "a:99999"])
def test_malformed_host_entries_do_not_match(entry: str) -> None:
    assert not re.fullmatch(patterns.HOST_ENTRY, entry)


@pytest.mark.parametrize(
    "url",
    ["https://de.wikipedia.org/wiki/Zürich", "http://127.0.0.1:8080/a?b=c#d", "https://[::1]/"],
)
def test_the_urls_people_write_match(url: str) -> None:
    assert re.fullmatch(patterns.URL, url)


@pytest.mark.parametrize(
    "url", ["", "ftp://example.org/", "https://", "https://a b/", "https://a:x/", "http://\uff0f/"]
)
def test_urls_that_cannot_be_fetched_do_not_match_and_are_refused(url: str) -> None:
    assert not re.fullmatch(patterns.URL, url)
    with pytest.raises(InvalidInput):
        validate_url(url)


def test_the_audit_kinds_the_document_names_are_those_the_log_takes() -> None:
    audit = next(op for op in document()["paths"]["/v1/admin/audit"].values() if "parameters" in op)
    [kind] = [param for param in audit["parameters"] if param["name"] == "kind"]
    assert kind["schema"]["enum"] == list(KINDS)
