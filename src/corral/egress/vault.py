"""The operator's secrets: where each value comes from and where it may go, never the value.

A secret is a name (the variable a sandbox sees), a source the server reads (one of its
environment variables, or a file) and the hosts it may be sent to (allowlist entries). The
store keeps the reference; the value is read from its source at each request that uses it
(`corral.egress.injection`), so changing the source or removing the secret counts from the
next request. A session holds a secret as a random placeholder, made when the operator
attaches it; messages and errors here name secrets and sources, never a value.
"""

from __future__ import annotations

import functools
import os
import re
import secrets as random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corral.egress.injection import PREFIX, Attached, SecretRefused
from corral.egress.rules import Entry, parse_entry
from corral.errors import InvalidInput, NotFound, SandboxError

Source = Literal["env", "file"]
OPTION = "secrets"  # a session's option holding its secrets: {NAME: placeholder}
# Variables a sandbox needs as they are (and the trust variables corral sets for sessions
# holding secrets): a secret may not take their place, nor a proxy setting's.
RESERVED = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "LANG",
    "PWD",
    "TMPDIR",
    "PYTHONPATH",
    "PYTHONHOME",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
)
VARIABLE = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
NAME = re.compile(rf"(?!(?:{'|'.join(RESERVED)})$)(?![A-Z0-9_]*PROXY){VARIABLE.pattern}")
MAX_VALUE_BYTES = 64 * 1024
MAX_HOSTS = 50


class SecretUnavailable(SandboxError):
    """A secret's source cannot be read now (the variable is unset, the file unreadable)."""


@dataclass(frozen=True)
class SecretRef:
    name: str
    source: Source
    location: str  # the server's variable, or an absolute file path
    hosts: tuple[str, ...]
    created_at: float


@dataclass(frozen=True)
class HeldSecret:
    """A secret a session holds, by name, and the hosts whose HTTPS the proxy reads for it."""

    name: str
    hosts: tuple[str, ...]


def checked(name: str, source: str, location: str, hosts: list[str]) -> tuple[str, Source, str]:
    """The reference's parts, checked; raises `InvalidInput` naming what is wrong."""
    if not NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid secret name {name!r}: use an environment variable name (A-Z, 0-9, _), "
            "not PATH, HOME or another the sandbox needs, nor a proxy setting"
        )
    if source == "env":
        if not VARIABLE.fullmatch(location):
            raise InvalidInput(f"invalid variable name {location!r}")
    elif source == "file":
        if not Path(location).is_absolute():
            raise InvalidInput(f"a secret's file must be an absolute path, not {location!r}")
    else:
        raise InvalidInput(f"a secret comes from env or file, not {source!r}")
    if not hosts or len(hosts) > MAX_HOSTS:
        raise InvalidInput(f"name 1 to {MAX_HOSTS} hosts the secret may go to")
    for host in hosts:
        parse_entry(host)  # InvalidInput for a bad entry, as the allowlist says
    kind: Source = "env" if source == "env" else "file"
    return name, kind, location


def read_value(ref: SecretRef) -> bytes:
    """The value now; raises `SecretUnavailable` (whose message holds no value)."""
    if ref.source == "env":
        value = os.environ.get(ref.location)
        if not value:
            raise SecretUnavailable(f"secret {ref.name}: the server has no ${ref.location}")
        return value.encode()
    try:
        with open(ref.location, "rb") as file:
            data = file.read(MAX_VALUE_BYTES + 1)
    except OSError as exc:
        raise SecretUnavailable(
            f"secret {ref.name}: cannot read {ref.location}: {exc.strerror}"
        ) from None
    if len(data) > MAX_VALUE_BYTES:
        raise SecretUnavailable(f"secret {ref.name}: {ref.location} is over 64 KiB")
    return data.rstrip(b"\r\n")


def new_placeholder() -> str:
    return PREFIX + random.token_hex(16)


class Vault:
    """The secrets' references by name, as stored, each with its hosts parsed once when it
    is put (the proxy asks for them at every request it reads)."""

    def __init__(self) -> None:
        self._refs: dict[str, SecretRef] = {}
        self._entries: dict[str, tuple[Entry, ...]] = {}

    def put(self, ref: SecretRef) -> None:
        """Define or redefine a secret (its hosts already checked)."""
        self._entries[ref.name] = tuple(e for host in ref.hosts for e in parse_entry(host))
        self._refs[ref.name] = ref

    def drop(self, name: str) -> None:
        self._refs.pop(name, None)
        self._entries.pop(name, None)

    def refs(self) -> list[SecretRef]:
        """Every secret, by name."""
        return [self._refs[name] for name in sorted(self._refs)]

    def holds(self, name: str) -> bool:
        return name in self._refs

    def get(self, name: str) -> SecretRef:
        ref = self._refs.get(name)
        if ref is None:
            raise NotFound(f"no secret {name!r}; 'corral secrets list' shows them")
        return ref

    def attached(self, placeholders: Mapping[str, str]) -> dict[bytes, Attached]:
        """What the proxy needs of a session's secrets (placeholders by name), for those
        still defined."""
        return {
            placeholder.encode(): Attached(
                name, self._entries[name], functools.partial(_value_for_request, self._refs[name])
            )
            for name, placeholder in placeholders.items()
            if name in self._refs
        }


def _value_for_request(ref: SecretRef) -> bytes:
    """The value, or a refusal of the request that needs it (saying why, never a value)."""
    try:
        return read_value(ref)
    except SecretUnavailable as exc:
        raise SecretRefused(ref.name, str(exc)) from None
