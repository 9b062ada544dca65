"""The egress rules as pure functions: parsing a policy, reading addresses, deciding (no I/O)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest

from corral.egress import presets
from corral.egress.rules import (
    Entry,
    IPAddress,
    Policy,
    decide,
    is_global,
    literal_address,
    make_policy,
    parse_entry,
    should_resolve,
)
from corral.errors import InvalidInput

ip = ipaddress.ip_address
net = ipaddress.ip_network
PIP_DEFAULT = ("pypi.org", "files.pythonhosted.org")


def addrs(*texts: str) -> list[IPAddress]:
    return [ip(text) for text in texts]


def only(text: str) -> Entry:
    entries = parse_entry(text)
    assert len(entries) == 1, entries
    return entries[0]


# -- parsing entries -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "domain", "wildcard", "port"),
    [
        ("example.com", "example.com", False, None),
        ("Example.COM", "example.com", False, None),
        ("  docs.Example.org\t", "docs.example.org", False, None),
        ("example.com.", "example.com", False, None),
        ("xn--bcher-kva.example", "xn--bcher-kva.example", False, None),
        ("*.example.com", "example.com", True, None),
        ("*.Example.COM.", "example.com", True, None),
        ("example.com:8443", "example.com", False, 8443),
        ("*.example.com:443", "example.com", True, 443),
        ("localhost:1", "localhost", False, 1),
        ("example.com:65535", "example.com", False, 65535),
    ],
)
def test_domain_entries_are_normalised(
    text: str, domain: str, wildcard: bool, port: int | None
) -> None:
    entry = only(text)
    assert (entry.domain, entry.wildcard, entry.network, entry.port) == (
        domain,
        wildcard,
        None,
        port,
    )


@pytest.mark.parametrize(
    ("text", "network", "port"),
    [
        ("10.1.2.3", "10.1.2.3/32", None),
        ("10.0.0.0/8", "10.0.0.0/8", None),
        ("10.1.2.3/8", "10.0.0.0/8", None),
        ("127.0.0.2:8080", "127.0.0.2/32", 8080),
        ("127.0.0.0/8:8080", "127.0.0.0/8", 8080),
        ("::1", "::1/128", None),
        ("[::1]", "::1/128", None),
        ("[::1]:8080", "::1/128", 8080),
        ("2001:DB8::/32", "2001:db8::/32", None),
        ("[2001:db8::/32]:443", "2001:db8::/32", 443),
    ],
)
def test_address_entries_are_networks(text: str, network: str, port: int | None) -> None:
    entry = only(text)
    assert (entry.domain, entry.network, entry.port) == (None, net(network), port)


def test_entry_text_is_kept_lower_case_and_stripped() -> None:
    assert only("  API.Example.com:8443 ").text == "api.example.com:8443"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "x" * 301,
        "example.com:0",
        "example.com:65536",
        "example.com:http",
        "example.com:-1",
        "[::1]:99999",
        "[::1]:port",
        "exa mple.com",
        "-bad.example",
        "bad-.example",
        "ex_ample.com",
        "foo..example",
        "a" * 64 + ".example",
        "*",
        "*.",
        "**.example.com",
        "*example.com",
        "www.*.example.com",
        "http://example.com",
        "example.com//path",
        "example.com/a b",
        "example.com/a?b",
        "GET,FETCH example.com/",
        "GET 10.0.0.0/8",
        "10.0.0.0/33",
        "user@example.com",
    ],
)
def test_bad_entries_are_refused_naming_the_entry(text: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_entry(text)
    assert repr(text) in str(caught.value)


def test_make_policy_names_the_bad_entry_among_good_ones() -> None:
    with pytest.raises(InvalidInput, match="'no such host'"):
        make_policy("allowlist", ["example.com", "no such host", "10.0.0.0/8"])


@pytest.mark.parametrize("mode", ["", "None", "open", "all", "allow"])
def test_make_policy_refuses_unknown_modes(mode: str) -> None:
    with pytest.raises(InvalidInput, match=repr(mode)):
        make_policy(mode)


@pytest.mark.parametrize("mode", ["none", "allowlist", "public"])
def test_make_policy_keeps_the_mode(mode: str) -> None:
    policy = make_policy(mode, ["example.com"])
    assert policy.mode == mode
    assert policy.allow == ["example.com"]


def test_default_policy_is_none_without_entries() -> None:
    assert Policy() == make_policy("none")
    assert Policy().entries == ()


def test_make_policy_drops_duplicate_entries_keeping_the_first_order() -> None:
    policy = make_policy("allowlist", ["b.example", "A.example", "b.example", "a.example"])
    assert [entry.text for entry in policy.entries] == ["b.example", "a.example"]


# -- presets ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(presets.FIXED))
def test_fixed_presets_expand_to_their_hosts(name: str) -> None:
    expected = [entry for host in presets.FIXED[name] for entry in parse_entry(host)]
    assert parse_entry(name) == expected
    assert presets.preset_hosts(name) == presets.FIXED[name]


def test_github_preset_holds_the_apex_and_wildcards() -> None:
    entries = parse_entry("github")
    assert Entry("github.com", domain="github.com") in entries
    assert Entry("*.githubusercontent.com", domain="githubusercontent.com", wildcard=True) in (
        entries
    )


def test_huggingface_preset_holds_the_apex_and_wildcards() -> None:
    domains = {(entry.domain, entry.wildcard) for entry in parse_entry("huggingface")}
    assert domains == {("huggingface.co", False), ("huggingface.co", True), ("hf.co", True)}


@pytest.mark.parametrize("text", ["GitHub", " github ", "GITHUB"])
def test_preset_names_are_case_and_space_insensitive(text: str) -> None:
    assert parse_entry(text) == parse_entry("github")


def test_preset_and_explicit_duplicates_collapse() -> None:
    policy = make_policy("allowlist", ["github", "github.com"])
    assert [entry.text for entry in policy.entries] == list(presets.FIXED["github"])


def test_unknown_preset_name_has_no_hosts() -> None:
    assert presets.preset_hosts("no-such-preset") == ()


def test_pypi_preset_is_pips_default_index_when_unset() -> None:
    assert presets.preset_hosts("pypi", env={}) == PIP_DEFAULT


def test_pypi_preset_follows_pip_index_url() -> None:
    env = {"PIP_INDEX_URL": "https://mirror.example.org/simple"}
    assert presets.preset_hosts("pypi", env=env) == ("mirror.example.org",)


def test_pypi_preset_adds_extra_index_urls() -> None:
    env = {
        "PIP_INDEX_URL": "https://mirror.example.org/simple",
        "PIP_EXTRA_INDEX_URL": "https://extra.example/simple  http://other.example:8080/simple",
    }
    assert presets.preset_hosts("pypi", env=env) == (
        "mirror.example.org",
        "extra.example",
        "other.example:8080",
    )


def test_pypi_preset_ignores_empty_and_non_http_settings() -> None:
    env = {"PIP_INDEX_URL": "", "PIP_EXTRA_INDEX_URL": " "}
    assert presets.preset_hosts("pypi", env=env) == PIP_DEFAULT


def test_pypi_entry_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://Mirror.Example.org:8443/simple")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    assert parse_entry("pypi") == [
        Entry("mirror.example.org:8443", domain="mirror.example.org", port=8443)
    ]


def test_pypi_entry_defaults_to_pypi_org(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    assert [entry.domain for entry in parse_entry("pypi")] == list(PIP_DEFAULT)


def test_pypi_entry_drops_credentials_of_the_index_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://user:s3cret@pypi.corp.example/simple")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    policy = make_policy("allowlist", ["pypi"])
    assert [entry.domain for entry in policy.entries] == ["pypi.corp.example"]
    assert "s3cret" not in repr(policy.allow)


def test_npm_preset_is_empty_or_parses() -> None:
    hosts = presets.preset_hosts("npm")
    assert isinstance(hosts, tuple)
    expected = [entry for host in hosts for entry in parse_entry(host)]
    assert list(make_policy("allowlist", ["npm"]).entries) == expected


# -- literal addresses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0177.0000.0000.0001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7f.0.0.0x1", "127.0.0.1"),
        ("2852039166", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("0", "0.0.0.0"),
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("fe80::1%eth0", "fe80::1"),
        ("0X7F000001", "127.0.0.1"),
    ],
)
def test_literal_address_reads_every_notation(host: str, address: str) -> None:
    assert literal_address(host) == ip(address)


@pytest.mark.parametrize(
    "host",
    [
        "dead",
        "cafe",
        "DEAD.BEEF",
        "cafe.com",
        "face.b00c",
        "example.com",
        "localhost",
        "1.2.3.4.5",
        "256.256.256.256",
        "0x",
        "1e3",
        "",
    ],
)
def test_names_are_not_literal_addresses(host: str) -> None:
    assert literal_address(host) is None


# -- global or not ---------------------------------------------------------------------------

TEREDO_PRIVATE_CLIENT = "2001:0:4136:e378:8000:63bf:f5ff:fffe"  # client 10.0.0.1


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.255.255.254",
        "::1",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "169.254.169.254",
        "169.254.0.1",
        "fe80::1",
        "100.64.0.1",
        "100.127.255.254",
        "224.0.0.1",
        "239.255.255.250",
        "ff02::1",
        "ff0e::1",
        "0.0.0.0",
        "::",
        "240.0.0.1",
        "255.255.255.255",
        "192.0.2.1",
        "198.18.0.1",
        "fc00::1",
        "fd12:3456::1",
        "2001:db8::1",
        "100::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "64:ff9b::7f00:1",
        "64:ff9b::a00:1",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b:1::1",
        "2002:c0a8:101::1",
        "2002:7f00:1::1",
        "2002:a9fe:a9fe::1",
        TEREDO_PRIVATE_CLIENT,
        "::7f00:1",
        "::a00:1",
        "::a9fe:a9fe",
        "fec0::1",
    ],
)
def test_non_global_addresses(address: str) -> None:
    assert is_global(ip(address)) is False


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "2606:4700:4700::1111",
        "2001:4860:4860::8888",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
    ],
)
def test_global_addresses(address: str) -> None:
    assert is_global(ip(address)) is True


# -- decide ----------------------------------------------------------------------------------

LISTS_EVERYTHING = ["example.com", "*.example.org", "127.0.0.0/8", "8.8.8.8", "::1"]


@pytest.mark.parametrize(
    ("host", "addresses"),
    [
        ("example.com", ["93.184.216.34"]),
        ("api.example.org", ["93.184.216.34"]),
        ("8.8.8.8", ["8.8.8.8"]),
        ("127.0.0.2", ["127.0.0.2"]),
        ("::1", ["::1"]),
        ("example.com", []),
    ],
)
def test_mode_none_refuses_everything(host: str, addresses: list[str]) -> None:
    decision = decide(make_policy("none", LISTS_EVERYTHING), host, 443, addrs(*addresses))
    assert decision.allowed is False
    assert decision.address is None
    assert decision.rule.startswith("mode none")


@pytest.mark.parametrize(
    ("host", "addresses", "expected"),
    [
        ("example.com", ["93.184.216.34"], "93.184.216.34"),
        ("8.8.8.8", ["8.8.8.8"], "8.8.8.8"),
        ("ipv6.example", ["2606:4700:4700::1111"], "2606:4700:4700::1111"),
    ],
)
def test_public_admits_global_addresses(host: str, addresses: list[str], expected: str) -> None:
    decision = decide(make_policy("public"), host, 443, addrs(*addresses))
    assert decision.allowed is True
    assert decision.address == ip(expected)
    assert decision.rule == "mode public: a global address"


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "10.0.0.1", "169.254.169.254", "100.64.0.1", "::1", "::ffff:7f00:1"]
)
def test_public_refuses_non_global_addresses(address: str) -> None:
    for host in ("inside.example", address):
        decision = decide(make_policy("public"), host, 80, addrs(address))
        assert decision.allowed is False
        assert decision.address is None
        assert decision.rule.startswith(f"not a public address ({address})")


def test_public_admits_a_listed_non_global_address() -> None:
    decision = decide(make_policy("public", ["127.0.0.2"]), "127.0.0.2", 80, addrs("127.0.0.2"))
    assert decision == decide(
        make_policy("allowlist", ["127.0.0.2"]), "127.0.0.2", 80, addrs("127.0.0.2")
    )
    assert decision.allowed is True
    assert decision.rule == "address listed: 127.0.0.2"


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("example.com", True),
        ("www.example.com", False),
        ("example.com.evil.test", False),
        ("notexample.com", False),
        ("example.org", False),
        ("api.example.org", True),
        ("a.b.example.org", True),
        ("evilexample.org", False),
        ("example.net", False),
    ],
)
def test_allowlist_admits_exactly_its_names(host: str, allowed: bool) -> None:
    policy = make_policy("allowlist", ["example.com", "*.example.org"])
    decision = decide(policy, host, 443, addrs("93.184.216.34"))
    assert decision.allowed is allowed
    if allowed:
        assert decision.address == ip("93.184.216.34")
        assert decision.rule.startswith("allowlist: ")
    else:
        assert decision.rule == f"not in the allowlist: {host}:443"


@pytest.mark.parametrize(
    ("host", "port", "address", "allowed"),
    [
        ("example.com", 443, "93.184.216.34", True),
        ("example.com", 80, "93.184.216.34", False),
        ("a.example.org", 8443, "93.184.216.34", True),
        ("a.example.org", 443, "93.184.216.34", False),
        ("127.0.0.2", 8080, "127.0.0.2", True),
        ("127.0.0.2", 8081, "127.0.0.2", False),
        ("::1", 9000, "::1", True),
        ("::1", 9001, "::1", False),
    ],
)
def test_ports_of_entries_are_enforced(host: str, port: int, address: str, allowed: bool) -> None:
    policy = make_policy(
        "allowlist", ["example.com:443", "*.example.org:8443", "127.0.0.2:8080", "[::1]:9000"]
    )
    assert decide(policy, host, port, addrs(address)).allowed is allowed


@pytest.mark.parametrize(
    "address", ["10.0.0.5", "127.0.0.1", "169.254.169.254", "::ffff:10.0.0.5", "fd00::5"]
)
def test_listed_name_resolving_to_a_private_address_is_refused(address: str) -> None:
    policy = make_policy("allowlist", ["intranet.example.com"])
    decision = decide(policy, "intranet.example.com", 443, addrs(address))
    assert decision.allowed is False
    assert decision.address is None
    assert "not a public address" in decision.rule


@pytest.mark.parametrize(
    ("entry", "address"),
    [
        ("127.0.0.2", "127.0.0.2"),
        ("127.0.0.0/8", "127.0.0.3"),
        ("127.0.0.2:8080", "127.0.0.2"),
        ("::1", "::1"),
        ("10.0.0.0/8", "10.9.8.7"),
        ("169.254.169.254", "169.254.169.254"),
    ],
)
def test_explicitly_listed_address_is_admitted(entry: str, address: str) -> None:
    policy = make_policy("allowlist", [entry])
    decision = decide(policy, address, 8080, addrs(address))
    assert decision.allowed is True
    assert decision.address == ip(address)
    assert decision.rule == f"address listed: {entry}"


def test_listed_name_with_listed_loopback_address_is_admitted() -> None:
    policy = make_policy("allowlist", ["svc.test", "127.0.0.2"])
    decision = decide(policy, "svc.test", 80, addrs("127.0.0.2"))
    assert (decision.allowed, decision.address) == (True, ip("127.0.0.2"))


def test_listed_address_does_not_admit_an_unlisted_name_in_allowlist_mode() -> None:
    policy = make_policy("allowlist", ["127.0.0.2"])
    decision = decide(policy, "svc.test", 80, addrs("127.0.0.2"))
    assert decision.allowed is False
    assert decision.rule == "not in the allowlist: svc.test:80"


def test_mapped_form_of_a_listed_address_is_not_listed() -> None:
    policy = make_policy("allowlist", ["127.0.0.2"])
    assert decide(policy, "::ffff:7f00:2", 80, addrs("::ffff:7f00:2")).allowed is False


@pytest.mark.parametrize("host", ["93.184.216.34", "2606:4700:4700::1111"])
def test_unlisted_global_literal_is_refused_in_allowlist_mode(host: str) -> None:
    policy = make_policy("allowlist", ["example.com"])
    decision = decide(policy, host, 443, addrs(host))
    assert decision.allowed is False
    assert decision.rule == f"not in the allowlist: {host}:443"


@pytest.mark.parametrize(
    ("policy", "addresses", "expected"),
    [
        (
            make_policy("allowlist", ["example.com"]),
            ["10.0.0.1", "127.0.0.1", "93.184.216.34", "1.1.1.1"],
            "93.184.216.34",
        ),
        (
            make_policy("allowlist", ["example.com", "127.0.0.3"]),
            ["10.0.0.1", "127.0.0.3", "93.184.216.34"],
            "127.0.0.3",
        ),
        (
            make_policy("public"),
            ["::1", "fd00::1", "2606:4700:4700::1111", "1.1.1.1"],
            "2606:4700:4700::1111",
        ),
    ],
)
def test_first_acceptable_address_is_returned(
    policy: Policy, addresses: Sequence[str], expected: str
) -> None:
    decision = decide(policy, "example.com", 443, addrs(*addresses))
    assert decision.allowed is True
    assert decision.address == ip(expected)


@pytest.mark.parametrize("mode", ["allowlist", "public"])
def test_a_name_that_did_not_resolve_is_refused(mode: str) -> None:
    decision = decide(make_policy(mode, ["example.com"]), "example.com", 443, [])
    assert (decision.allowed, decision.rule) == (False, "the name did not resolve")


# -- should_resolve --------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["example.com", "api.example.org", "anything.test"])
def test_mode_none_never_resolves(host: str) -> None:
    assert should_resolve(make_policy("none", LISTS_EVERYTHING), host, 443) is False


@pytest.mark.parametrize("mode", ["allowlist", "public"])
@pytest.mark.parametrize("host", ["8.8.8.8", "127.0.0.1", "2130706433", "0x7f000001", "::1"])
def test_literals_are_never_resolved(mode: str, host: str) -> None:
    assert should_resolve(make_policy(mode, ["8.8.8.8", "127.0.0.0/8", "::1"]), host, 443) is False


@pytest.mark.parametrize(
    ("host", "port"),
    [
        ("evil.test", 443),
        ("www.example.com", 443),
        ("example.org", 443),
        ("example.com", 80),
        ("secret-data.attacker.example", 443),
    ],
)
def test_names_no_rule_admits_are_not_resolved(host: str, port: int) -> None:
    policy = make_policy("allowlist", ["example.com:443", "*.example.org", "127.0.0.0/8"])
    assert should_resolve(policy, host, port) is False


@pytest.mark.parametrize(
    ("policy", "host", "port"),
    [
        (make_policy("allowlist", ["example.com:443"]), "example.com", 443),
        (make_policy("allowlist", ["*.example.org"]), "a.b.example.org", 80),
        (make_policy("public"), "anything.test", 443),
    ],
)
def test_names_a_rule_admits_are_resolved(policy: Policy, host: str, port: int) -> None:
    assert should_resolve(policy, host, port) is True


@pytest.mark.parametrize(
    ("text", "written", "methods", "path"),
    [
        (
            "GET,post api.github.com/repos/Acme/",
            "GET,POST api.github.com/repos/Acme/",
            {"GET", "POST"},
            "/repos/Acme/",
        ),
        ("API.example.com/v1", "api.example.com/v1", set(), "/v1"),
        ("DELETE example.com", "DELETE example.com", {"DELETE"}, ""),
        ("GET 127.0.0.2:8080/x/", "GET 127.0.0.2:8080/x/", {"GET"}, "/x/"),
    ],
)
def test_entries_may_limit_methods_and_paths(
    text: str, written: str, methods: set[str], path: str
) -> None:
    (entry,) = parse_entry(text)
    assert (entry.text, entry.methods, entry.path) == (written, frozenset(methods), path)
    assert entry.http_level
