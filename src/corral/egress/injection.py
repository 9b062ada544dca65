"""Secrets put into requests on their way out: a placeholder in, the value out, per host.

A sandbox holds a secret only as a placeholder (`corral-secret-` and 32 hex digits) in an
environment variable. A program sends it where it would send the key: a header, the user
or password of basic auth, the URL. On a request the proxy can read (plain HTTP), each
placeholder is looked up among the secrets attached to the request's session: when the
request goes to one of that secret's hosts the placeholder is replaced by the value, read
from its source now; anything else (a placeholder of another session, of a detached or
removed secret, or sent to a host the secret may not go to) refuses the whole request, so a
secret cannot be walked out through a host the operator allowed for another purpose.

Pure functions over h11's request: the proxy does the I/O and the audit.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import h11

from corral.egress.protocol import Target
from corral.egress.rules import Entry, IPAddress

PREFIX = "corral-secret-"
PLACEHOLDER = re.compile(rb"corral-secret-[0-9a-f]{32}")
_BASIC = b"basic "


@dataclass(frozen=True)
class Attached:
    """A secret as one session holds it: its name, where it may go, and its value (read at
    each use, so a changed source or a revoked secret counts from the next request)."""

    name: str
    entries: tuple[Entry, ...]
    value: Callable[[], bytes]

    def may_go_to(self, target: Target, address: IPAddress | None) -> bool:
        return any(
            entry.matches_name(target.host, target.port)
            or (address is not None and entry.matches_address(address, target.port))
            for entry in self.entries
        )


class SecretRefused(Exception):
    """A request carried a placeholder it may not carry there; `name` is the secret's (None
    for a placeholder this session does not hold)."""

    def __init__(self, name: str | None, reason: str) -> None:
        super().__init__(reason)
        self.name = name
        self.reason = reason


@dataclass(frozen=True)
class Injection:
    request: h11.Request
    names: tuple[str, ...]  # the secrets put in, for the audit log


def inject(
    request: h11.Request,
    target: Target,
    address: IPAddress | None,
    attached: Mapping[bytes, Attached],
) -> Injection:
    """`request` with every placeholder replaced by its value; raises `SecretRefused`."""
    found = _placeholders(request)
    for placeholder in found:
        secret = attached.get(placeholder)
        if secret is None:
            raise SecretRefused(
                None,
                "the request carries a secret placeholder this session does not hold "
                "(detached, removed, or another session's)",
            )
        if not secret.may_go_to(target, address):
            raise SecretRefused(
                secret.name,
                f"secret {secret.name} may not be sent to {target.host}:{target.port}; "
                f"its hosts are {', '.join(e.text for e in secret.entries)}",
            )
    if not found:
        return Injection(request, ())
    values = {placeholder: attached[placeholder].value() for placeholder in found}
    names = tuple(sorted({attached[p].name for p in found}))
    try:
        swapped = h11.Request(
            method=request.method,
            target=_swap(request.target, values),
            headers=[(name, _swap_header(name, value, values)) for name, value in request.headers],
        )
    except h11.LocalProtocolError:
        # h11's message quotes the header: never let the value reach a message or a log.
        raise SecretRefused(
            names[0], f"the value of {', '.join(names)} cannot go in an HTTP header"
        ) from None
    return Injection(swapped, names)


def _placeholders(request: h11.Request) -> set[bytes]:
    found = set(PLACEHOLDER.findall(request.target))
    for name, value in request.headers:
        found.update(PLACEHOLDER.findall(value))
        if name == b"authorization" and (decoded := _basic_credentials(value)) is not None:
            found.update(PLACEHOLDER.findall(decoded))
    return found


def _swap(raw: bytes, values: Mapping[bytes, bytes]) -> bytes:
    return PLACEHOLDER.sub(lambda m: values.get(m[0], m[0]), raw)


def _swap_header(name: bytes, value: bytes, values: Mapping[bytes, bytes]) -> bytes:
    decoded = _basic_credentials(value) if name == b"authorization" else None
    if decoded is not None and PLACEHOLDER.search(decoded):
        return value[: len(_BASIC)] + base64.b64encode(_swap(decoded, values))
    return _swap(value, values)


def _basic_credentials(value: bytes) -> bytes | None:
    """The `user:password` of a basic-auth header value, or None for any other."""
    if not value.lower().startswith(_BASIC):
        return None
    try:
        return base64.b64decode(value[len(_BASIC) :].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
