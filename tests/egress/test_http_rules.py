"""Method and path rules, judged on each request the proxy reads."""

from __future__ import annotations

import ipaddress

import pytest

from corral.egress.http_rules import judge, limited
from corral.egress.protocol import Target
from corral.egress.rules import make_policy

API = Target("api.github.com", 443)
RULES = make_policy(
    "allowlist", ["GET,HEAD api.github.com/repos/acme/", "POST api.github.com/graphql"]
)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/repos/acme/widget"),
        ("HEAD", "/repos/acme/"),
        ("GET", "/repos/acme/widget?per_page=5"),
        ("POST", "/graphql"),
    ],
)
def test_a_request_the_rules_name_goes(method: str, path: str) -> None:
    assert judge(RULES, API, None, method, path) is None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/repos/acme/widget"),  # the method is not named for that prefix
        ("GET", "/repos/other/"),
        ("GET", "/repos/acme"),  # the prefix is written with its slash
        ("DELETE", "/graphql"),
        ("GET", "/"),
    ],
)
def test_a_request_the_rules_do_not_name_is_refused_with_them(method: str, path: str) -> None:
    refusal = judge(RULES, API, None, method, path)
    assert refusal is not None and "GET,HEAD api.github.com/repos/acme/" in refusal


@pytest.mark.parametrize(
    "path",
    [
        "/repos/acme/../other/",
        "/repos/acme/./x",
        "/repos/acme/%2e%2e/other",
        "/repos/acme/%2F..%2Fother",
        "/repos/acme/..",
        "/repos/acme/x%5c..%5cother",
        "/repos/acme\\..\\other",
    ],
)
def test_a_path_another_server_could_read_differently_is_refused(path: str) -> None:
    refusal = judge(RULES, API, None, "GET", path)
    assert refusal is not None and "dot segments" in refusal


def test_a_host_admitted_without_limits_is_not_limited() -> None:
    both = make_policy("allowlist", ["GET api.github.com/repos/", "api.github.com"])
    assert limited(both, API, None) == []
    assert judge(both, API, None, "DELETE", "/anything") is None


def test_other_hosts_are_not_limited() -> None:
    assert limited(RULES, Target("example.com", 443), None) == []
    public = make_policy("public", ["GET api.github.com/repos/"])
    assert judge(public, Target("example.com", 443), None, "POST", "/x") is None


def test_rules_on_an_address_apply_to_the_connected_address() -> None:
    policy = make_policy("allowlist", ["GET 10.1.2.3:8080/v1/"])
    target = Target("internal.example", 8080)
    address = ipaddress.ip_address("10.1.2.3")
    assert judge(policy, target, address, "GET", "/v1/x") is None
    assert judge(policy, target, address, "PUT", "/v1/x") is not None
    assert judge(policy, Target("internal.example", 9090), address, "PUT", "/") is None
