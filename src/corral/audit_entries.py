"""The audit entries a caller hands the writer, one class per kind of entry.

Each is a frozen value that knows how to write itself to the `AuditLog` (`write`), so a call
site names the class and its fields and mypy checks both. The journal stores an entry as its
`TAG` and its fields; `from_journal` reads one back. The tags are the names the journal has
always used, so a journal left by an older server is still replayed.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from corral.audit import AuditLog


def _now() -> float:
    return time.time()


@dataclass(frozen=True, kw_only=True)
class AuditEntry(abc.ABC):
    """One entry, stamped with when it happened (not when the database took it)."""

    TAG: ClassVar[str]
    at: float = field(default_factory=_now)

    @abc.abstractmethod
    def write(self, audit: AuditLog, key: str) -> None:
        """Write this entry under `key` (writing one key twice changes nothing)."""

    def fields(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class Event(AuditEntry):
    """What happened to a session or the server: a network decision, a limit, a bridge."""

    TAG: ClassVar[str] = "record"
    kind: str
    actor: str
    action: str
    session: str | None = None
    target: str | None = None
    detail: Mapping[str, Any] | None = None

    def write(self, audit: AuditLog, key: str) -> None:
        audit.record(
            self.kind,
            actor=self.actor,
            action=self.action,
            session=self.session,
            target=self.target,
            detail=self.detail,
            at=self.at,
            key=key,
        )


@dataclass(frozen=True, kw_only=True)
class SessionChanged(AuditEntry):
    """A session was created, started, stopped, restarted or deleted, and by whom."""

    TAG: ClassVar[str] = "record_session"
    session: str
    event: str
    actor: str

    def write(self, audit: AuditLog, key: str) -> None:
        audit.record_session(self.session, self.event, actor=self.actor, at=self.at, key=key)


@dataclass(frozen=True, kw_only=True)
class AdminAction(AuditEntry):
    """The operator changed something: limits, a policy, a request's answer, a skill."""

    TAG: ClassVar[str] = "record_admin"
    action: str
    target: str | None
    session: str | None = None
    detail: Mapping[str, Any] | None = None

    def write(self, audit: AuditLog, key: str) -> None:
        audit.record_admin(
            self.action,
            self.target,
            session=self.session,
            detail=self.detail,
            at=self.at,
            key=key,
        )


@dataclass(frozen=True, kw_only=True)
class ExecutionBegun(AuditEntry):
    """Code about to reach a kernel; `running` until its `ExecutionEnded`."""

    TAG: ClassVar[str] = "begin_execution"
    session: str
    language: str
    code: str
    actor: str = "agent"

    def write(self, audit: AuditLog, key: str) -> None:
        audit.begin_execution(
            self.session, self.language, self.code, key=key, actor=self.actor, at=self.at
        )


@dataclass(frozen=True, kw_only=True)
class ExecutionEnded(AuditEntry):
    """The outcome of the execution whose `ExecutionBegun` had the key `begun`."""

    TAG: ClassVar[str] = "end_execution"
    begun: str
    status: str
    duration_s: float
    output_bytes: int

    def write(self, audit: AuditLog, key: str) -> None:
        audit.end_execution(
            self.begun,
            status=self.status,
            duration_s=self.duration_s,
            output_bytes=self.output_bytes,
        )


KINDS: dict[str, type[AuditEntry]] = {
    cls.TAG: cls for cls in (Event, SessionChanged, AdminAction, ExecutionBegun, ExecutionEnded)
}


def from_journal(tag: object, fields: object) -> AuditEntry | None:
    """The entry a journal record holds; None when it holds none this server can read."""
    cls = KINDS.get(tag) if isinstance(tag, str) else None
    if cls is None or not isinstance(fields, dict):
        return None
    try:
        return cls(**fields)
    except TypeError:
        return None
