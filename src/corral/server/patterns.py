"""The shapes of the REST API's strings, as regular expressions the models and the document share.

Each pattern is checked at the edge by pydantic, and it is no wider than what the code behind
the edge takes: a string that matches is never refused later for its shape (tests draw strings
from each pattern and feed them to the parser behind it). So the OpenAPI document tells a client
exactly which strings are well formed.
"""

from __future__ import annotations

from corral import mounts
from corral.browser import fetch
from corral.kernels import session
from corral.sandbox import limits

SESSION_ID = f"^{session.SESSION_ID.pattern}$"
MOUNT_NAME = f"^{mounts.MOUNT_NAME.pattern}$"
SIZE = f"^{limits.SIZE_TEXT}$"  # "2G", "512MiB", "1.5g", "1000"

_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H = r"[0-9A-Fa-f]{1,4}"
_IPV6 = (
    "(?:"
    + "|".join(
        (
            rf"(?:{_H}:){{7}}{_H}",
            rf"(?:{_H}:){{1,7}}:",
            rf"(?:{_H}:){{1,6}}:{_H}",
            rf"(?:{_H}:){{1,5}}(?::{_H}){{1,2}}",
            rf"(?:{_H}:){{1,4}}(?::{_H}){{1,3}}",
            rf"(?:{_H}:){{1,3}}(?::{_H}){{1,4}}",
            rf"(?:{_H}:){{1,2}}(?::{_H}){{1,5}}",
            rf"{_H}:(?::{_H}){{1,6}}",
            rf":(?:(?::{_H}){{1,7}}|:)",
        )
    )
    + ")"
)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"

# A host an allowlist entry names (corral.egress.rules.parse_entry): a domain or `*.domain`,
# an IPv4 address or range, each maybe with `:port`; an IPv6 address or range, or
# `[IPv6]:port`; or a preset's name (a domain-shaped word such as `pypi`). What an agent asks
# for, and where a secret may go.
HOST_ENTRY = (
    "^(?:"
    + "|".join(
        (
            rf"(?:\*\.)?{_DOMAIN}(?::{_PORT})?",
            rf"{_IPV4}(?:/(?:3[0-2]|[12]?[0-9]))?(?::{_PORT})?",
            rf"{_IPV6}(?:/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9]))?",
            rf"\[{_IPV6}\](?::{_PORT})?",
        )
    )
    + ")$"
)
HOST_ENTRY_MAX_CHARS = 253

# An entry of the operator's allowlist: such a host, or a host (not a range) that also names
# the methods it admits (`GET,POST `) and a path prefix (`/repos/acme/`); after a bare IPv4
# address a `/N` is a range, so a path there must not be one number.
_METHOD = "(?:GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS)"
_PATH = r"/(?!/)[A-Za-z0-9._~!$&'()*+,;=:@/-]*"
_LIMITED_HOST = (
    "(?:"
    + "|".join(
        (
            rf"(?!{_IPV4}/[0-9]{{1,3}}(?::[0-9]+)?$)(?:\*\.)?{_DOMAIN}(?::{_PORT})?(?:{_PATH})?",
            rf"{_IPV4}:{_PORT}(?:{_PATH})?",
            rf"{_IPV4}(?:(?!/[0-9]{{1,3}}(?::[0-9]+)?$){_PATH})?",
            rf"\[{_IPV6}\](?::{_PORT})?(?:{_PATH})?",
        )
    )
    + ")"
)
RULE_ENTRY = (
    "^(?:"
    + "|".join(
        (
            rf"(?:{_METHOD}(?:,{_METHOD})* )?{_LIMITED_HOST}",
            rf"{_IPV4}(?:/(?:3[0-2]|[12]?[0-9]))?(?::{_PORT})?",
            rf"{_IPV6}(?:/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9]))?",
        )
    )
    + ")$"
)
RULE_ENTRY_MAX_CHARS = 300

# A URL to fetch (corral.browser.fetch.validate_url): http or https, a host (a name, an IPv4
# address or a bracketed IPv6 one; ASCII, so an international name is given in its xn-- form;
# no user info), maybe a port, then any path, query and fragment.
_URL_HOST = rf"(?:[A-Za-z0-9._~!$&'()*+,;=-]+|\[{_IPV6}\])"
# No control or blank character of any kind (C0, C1, Unicode spaces): a client may strip them.
_URL_CHAR = r"[^\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
URL = rf"^[Hh][Tt][Tt][Pp][Ss]?://{_URL_HOST}(?::{_PORT})?(?:[/?#]{_URL_CHAR}*)?$"
URL_MAX_CHARS = fetch.MAX_URL_CHARS
