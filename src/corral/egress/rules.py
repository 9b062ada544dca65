"""Network policy as data, and the pure decision of whether one connection may go out.

A policy is a mode (`none`, `allowlist`, `public`) and, for allowlists, entries: exact domains,
`*.domain` wildcards, `host:port`, IP addresses and CIDR ranges, or named presets
(`corral.egress.presets`). Addresses that are not global (loopback, private, link-local and
metadata, CGNAT, multicast, reserved, and the IPv4 forms embedded in IPv6) are refused in
every mode unless the operator listed that exact address or a range holding it.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from corral.egress import presets
from corral.errors import InvalidInput

Mode = Literal["none", "allowlist", "public"]
MODES: tuple[str, ...] = ("none", "allowlist", "public")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_SIXTOFOUR = ipaddress.ip_network("2002::/16")


@dataclass(frozen=True)
class Entry:
    """One allowlist entry: a domain (maybe `*.`), an address range, and maybe a port."""

    text: str
    domain: str | None = None
    wildcard: bool = False
    network: IPNetwork | None = None
    port: int | None = None
    # HTTP-level limits (`corral.egress.http_rules`): the methods and the path prefix this
    # entry admits; none means any request.
    methods: frozenset[str] = frozenset()
    path: str = ""

    @property
    def http_level(self) -> bool:
        return bool(self.methods or self.path)

    def matches_name(self, host: str, port: int) -> bool:
        if self.domain is None or (self.port is not None and self.port != port):
            return False
        if self.wildcard:
            return host.endswith("." + self.domain)
        return host == self.domain

    def matches_address(self, address: IPAddress, port: int) -> bool:
        if self.network is None or (self.port is not None and self.port != port):
            return False
        return address.version == self.network.version and address in self.network


@dataclass(frozen=True)
class Policy:
    """A session's network policy. `entries` are the parsed allowlist (presets expanded)."""

    mode: Mode = "none"
    entries: tuple[Entry, ...] = field(default=())

    @property
    def allow(self) -> list[str]:
        """The allowlist as written (presets expanded)."""
        return [entry.text for entry in self.entries]


@dataclass(frozen=True)
class Decision:
    """Whether one connection may go out, to which address, and the rule that decided."""

    allowed: bool
    rule: str
    address: IPAddress | None = None  # where to connect, when allowed
    private: IPAddress | None = None  # the non-public address a refusal was for, if any


def make_policy(mode: str, allow: Iterable[str] = ()) -> Policy:
    """A validated policy; raises `InvalidInput` naming the bad mode or entry."""
    if mode not in MODES:
        raise InvalidInput(f"unknown network mode {mode!r}: choose one of {', '.join(MODES)}")
    entries: list[Entry] = []
    for text in allow:
        entries.extend(parse_entry(text))
    unique = tuple(dict.fromkeys(entries))
    return Policy(mode=mode, entries=unique)  # type: ignore[arg-type]


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def parse_entry(text: str) -> list[Entry]:
    """The entries `text` stands for: a preset name expands to several. Raises `InvalidInput`.

    An entry may also limit requests: `GET,POST api.github.com/repos/acme/` admits only
    those methods, and only paths under that prefix (checked on each request the proxy
    reads: plain HTTP, and HTTPS to that host, which it then reads).
    """
    stripped = text.strip()
    if not stripped or len(stripped) > 300:
        raise InvalidInput(f"empty or overlong network entry {text!r}")
    methods_text, _, rest = stripped.rpartition(" ")
    methods = _methods(methods_text, text) if methods_text else frozenset()
    host_text, path = _split_path(rest)
    entries = _host_entries(host_text.lower(), text)
    if not (methods or path):
        return entries
    if any(entry.network is not None and entry.network.num_addresses > 1 for entry in entries):
        raise InvalidInput(f"{text!r}: methods and paths apply to a host, not a range")
    written = " ".join(filter(None, [",".join(sorted(methods)), host_text.lower() + path]))
    return [replace(e, text=written, methods=methods, path=path) for e in entries]


def _methods(text: str, whole: str) -> frozenset[str]:
    names = frozenset(name.strip().upper() for name in text.split(","))
    unknown = names - set(METHODS)
    if unknown or not names:
        raise InvalidInput(f"{whole!r}: methods are a comma-separated list of {', '.join(METHODS)}")
    return names


def _split_path(text: str) -> tuple[str, str]:
    """The host part and the path prefix (`/...`, or "" for none) of an entry; a `/N` after
    an address (`10.0.0.0/8`, `10.0.0.0/8:443`, `[2001:db8::/32]:443`) is a range."""
    bracketed = text.startswith("[")
    cut = text.find("/", text.find("]") + 1 if bracketed else 0)
    if cut < 0:
        return text, ""
    host, path = text[:cut], text[cut:]
    if not bracketed and _RANGE_SUFFIX.fullmatch(path[1:]) and _as_network(host) is not None:
        return text, ""
    if path.startswith("//") or any(c in path for c in " ?#%\\"):
        raise InvalidInput(
            f"{text!r}: a path prefix is written plainly after the host: "
            "one /, and no space, ?, #, % or \\"
        )
    return host, path


_RANGE_SUFFIX = re.compile(r"[0-9]{1,3}(?::[0-9]+)?")


def _host_entries(raw: str, text: str) -> list[Entry]:
    if raw in presets.NAMES:
        return [entry for item in presets.preset_hosts(raw) for entry in parse_entry(item)]
    network = _as_network(raw)
    if network is not None:
        return [Entry(text=raw, network=network)]
    host, port = _split_port(raw, text)
    network = _as_network(host)
    if network is not None:
        return [Entry(text=raw, network=network, port=port)]
    wildcard = host.startswith("*.")
    domain = normalise_name(host[2:] if wildcard else host)
    if domain is None:
        raise InvalidInput(
            f"{text!r} is not a domain, '*.domain', host:port, IP address or CIDR range"
        )
    return [Entry(text=raw, domain=domain, wildcard=wildcard, port=port)]


def _split_port(raw: str, text: str) -> tuple[str, int | None]:
    if raw.startswith("["):
        host, _, rest = raw[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif raw.count(":") == 1:
        host, _, port_text = raw.partition(":")
    else:
        return raw, None
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidInput(f"bad port in network entry {text!r}")
    return host, int(port_text)


def _as_network(text: str) -> IPNetwork | None:
    try:
        return ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        return None


def normalise_name(host: str) -> str | None:
    """A lower-case DNS name without a trailing dot, or None when `host` is not one."""
    name = host.lower().rstrip(".")
    if not name or len(name) > 253:
        return None
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return None
    return name


def literal_address(host: str) -> IPAddress | None:
    """The address a host names by itself, in any notation a resolver would accept.

    Covers plain IPv4 and IPv6 (bracketed too) and the legacy IPv4 forms inet_aton takes:
    decimal (2130706433), hex (0x7f000001), octal (0177.0.0.1) and short forms (127.1).
    Returns None for a DNS name.
    """
    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        pass
    if re.fullmatch(r"[0-9a-fA-FxX.]+", text) and not re.fullmatch(r"[a-fA-F.]+", text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def is_global(address: IPAddress) -> bool:
    """True only for addresses on the public internet, looking inside embedded IPv4 forms."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return is_global(embedded)
        if address in _NAT64_LOCAL or address.is_site_local:
            return False
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return False
    return bool(address.is_global) and not address.is_multicast


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(address.packed[-4:])
    if address in _SIXTOFOUR:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    compat = address.packed[:12] == bytes(12) and int(address) > 1
    return ipaddress.IPv4Address(address.packed[-4:]) if compat else None


def decide(policy: Policy, host: str, port: int, addresses: Sequence[IPAddress]) -> Decision:
    """May a connection to `host`:`port` go out, and to which of `addresses` (resolved)?

    `host` is a normalised DNS name or a literal address; `addresses` what it resolved to (the
    literal itself for one). The first acceptable address is the one to connect to.
    """
    if policy.mode == "none":
        return Decision(False, "mode none: this session has no network")
    literal = literal_address(host) is not None
    name_rule = None if literal else _name_rule(policy, host, port)
    if policy.mode == "allowlist" and not literal and name_rule is None:
        return Decision(False, f"not in the allowlist: {host}:{port}")
    if not addresses:
        return Decision(False, "the name did not resolve")
    for address in addresses:
        listed = _listed_address(policy, address, port)
        if listed is not None:
            return Decision(True, f"address listed: {listed}", address)
        if not is_global(address):
            continue
        if policy.mode == "public":
            return Decision(True, "mode public: a global address", address)
        if name_rule is not None:
            return Decision(True, f"allowlist: {name_rule}", address)
    if not any(is_global(address) for address in addresses):
        shown = ", ".join(str(a) for a in addresses[:3])
        return Decision(
            False, f"not a public address ({shown}) and not listed by address", private=addresses[0]
        )
    return Decision(False, f"not in the allowlist: {host}:{port}")


def should_resolve(policy: Policy, host: str, port: int) -> bool:
    """Whether looking `host` up could lead to an allowed connection.

    Names no rule could admit are never resolved, so a sandbox cannot leak data through DNS
    queries for names of its choosing.
    """
    if policy.mode == "none" or literal_address(host) is not None:
        return False
    return policy.mode == "public" or _name_rule(policy, host, port) is not None


def _name_rule(policy: Policy, host: str, port: int) -> str | None:
    for entry in policy.entries:
        if entry.matches_name(host, port):
            return entry.text
    return None


def _listed_address(policy: Policy, address: IPAddress, port: int) -> str | None:
    for entry in policy.entries:
        if entry.matches_address(address, port):
            return entry.text
    return None
