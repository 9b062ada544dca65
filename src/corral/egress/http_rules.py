"""Allowlist entries that limit methods and paths, judged on each request the proxy reads.

An entry such as `GET,POST api.github.com/repos/acme/` admits its host at the connection
level like any entry, and then only requests with those methods whose path starts with that
prefix. A host that some entry admits without such limits is not limited; a host only
limited entries admit is read request by request: plain HTTP always, HTTPS by reading the
tunnel (`corral.egress.intercept`), and a SOCKS connection, which cannot be read, is refused.

A path is compared as sent, so a path another server could read differently is refused
outright: one with `.` or `..` segments, an encoded dot, slash or backslash, or a backslash.
Pure functions; the proxy applies them.
"""

from __future__ import annotations

import re

from corral.egress.protocol import Target
from corral.egress.rules import Entry, IPAddress, Policy

_AMBIGUOUS = re.compile(r"(?:^|/)\.{1,2}(?:/|$)|%2[eEfF]|%5[cC]|\\")


def _matching(policy: Policy, target: Target, address: IPAddress | None) -> list[Entry]:
    return [
        entry
        for entry in policy.entries
        if entry.matches_name(target.host, target.port)
        or (address is not None and entry.matches_address(address, target.port))
    ]


def limited(policy: Policy, target: Target, address: IPAddress | None) -> list[Entry]:
    """The limiting entries that decide requests to `target`, or [] when none limits it
    (no entry names it, or one names it without limits)."""
    entries = _matching(policy, target, address)
    if not entries or any(not entry.http_level for entry in entries):
        return []
    return entries


def judge(
    policy: Policy, target: Target, address: IPAddress | None, method: str, target_path: str
) -> str | None:
    """Why a request may not go (naming the rules), or None when it may."""
    rules = limited(policy, target, address)
    if not rules:
        return None
    path = target_path.split("?", 1)[0].split("#", 1)[0] or "/"
    if _AMBIGUOUS.search(path):
        return (
            f"the path {path[:200]!r} has dot segments or encoded separators, which the rules "
            f"for {target.host}:{target.port} cannot judge"
        )
    for entry in rules:
        if (not entry.methods or method in entry.methods) and path.startswith(entry.path or "/"):
            return None
    written = "; ".join(entry.text for entry in rules)
    return f"{method} {path[:200]} is not allowed on {target.host}:{target.port} (rules: {written})"
