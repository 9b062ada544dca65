"""The audit log: what ran, what happened to sessions, what the operator changed.

One SQLite table, `audit`, in the same database file as the session store (`Settings.db_path`)
but with its own connection. Every entry has a `kind`:

    execution   code sent to a kernel: language, the code as sent, status, duration, output bytes
                (status `running` from the moment the code is sent until it ends; a server that
                stopped before it ended leaves it `interrupted`, detail `interrupted`)
    session     a session event (created, started, stopped, restarted, deleted, idle-stopped)
    admin       an operator action: its name, its target and a JSON detail
    network     an egress decision (recorded through `record`; detail: host, port, address, ...)
    bridge      a connection to the SSH agent bridge: "relayed" or why it was refused
    protected   paths of a read-write project mount kept from the host (names only, as they happen)
    server      how the server's last run ended, when it did not stop cleanly

Columns shared by every kind: `id`, `at` (epoch seconds), `kind`, `session`, `actor`, `action`
(the event or action name), `target` and `detail` (a JSON object). Executions also fill
`language`, `code`, `duration_s`, `status` and `output_bytes`. Ids only grow, so `id` orders
entries by the time they were recorded and is the paging cursor. An entry written with a
`key` (the audit writer's journal gives every entry one) is written once however often it is
written again, so a journal can be replayed whole.

The log is bounded: rows older than `max_age_s` and the oldest rows past `max_rows` are removed
on open and every `ROTATE_EVERY_WRITES` writes, never on every write. Code past
`MAX_CODE_BYTES` is stored truncated, with a marker saying how many bytes were cut.

This module checks and shapes entries; `corral.audit_table` holds the SQL, the connection and
the writes kept from a refusal.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Final

from corral.audit_table import MAX_PENDING as MAX_PENDING
from corral.audit_table import ROTATE_EVERY_WRITES as ROTATE_EVERY_WRITES
from corral.audit_table import AuditTable, Row
from corral.errors import InvalidInput

KINDS: Final = ("execution", "session", "admin", "network", "bridge", "protected", "server")
# "system" is corral acting on its own, e.g. stopping an idle session.
ACTORS: Final = ("agent", "admin", "cli", "system")
SESSION_EVENTS: Final = ("created", "started", "stopped", "restarted", "deleted", "idle-stopped")
STATUSES: Final = ("ok", "error", "timeout", "interrupted", "died")
RUNNING: Final = "running"  # an execution's status while its code runs
SERVER_EVENTS: Final = ("stopped-uncleanly",)

MAX_CODE_BYTES: Final = 1024 * 1024
MAX_QUERY_LIMIT: Final = 1000


@dataclass(frozen=True)
class AuditEntry:
    """One row of the log. The execution fields are None for every other kind."""

    id: int
    at: float
    kind: str
    actor: str
    action: str
    session: str | None = None
    target: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    language: str | None = None
    code: str | None = None
    duration_s: float | None = None
    status: str | None = None
    output_bytes: int | None = None


@dataclass(frozen=True)
class AuditPage:
    """Entries newest first; pass `next_before_id` as `before_id` for the next page."""

    entries: tuple[AuditEntry, ...]
    next_before_id: int | None


class AuditLog:
    """The audit table in the database at `path`; safe to share between threads of one process.

    Every `record*` method returns the new entry's id, raises `InvalidInput` for a malformed
    argument and `SandboxError` when the database refuses the write; the caller decides whether
    to go on without an audit entry. An entry refused because the database is locked or its
    disk full is also kept in memory (up to `MAX_PENDING`) and written, with its own time,
    before the next entry the database takes, or at `close`. `at` defaults to now; tests and
    imports may pass it.
    """

    def __init__(
        self, path: Path, *, max_rows: int = 100_000, max_age_s: float = 30 * 86400
    ) -> None:
        if max_rows <= 0 or not max_age_s > 0:
            raise InvalidInput(
                f"the audit log needs positive limits, not max_rows={max_rows} "
                f"and max_age_s={max_age_s}"
            )
        self._table = AuditTable(path, max_rows=max_rows, max_age_s=max_age_s)

    def record_execution(
        self,
        session: str,
        language: str,
        code: str,
        *,
        status: str,
        duration_s: float,
        output_bytes: int,
        actor: str = "agent",
        at: float | None = None,
        key: str | None = None,
    ) -> int:
        """Record code sent to a kernel, once it ended; `at` is when it started, `duration_s`
        how long it ran."""
        _check_outcome(status, duration_s, output_bytes)
        return self._insert_execution(
            session,
            language,
            code,
            actor,
            at,
            key,
            status=status,
            duration_s=float(duration_s),
            output_bytes=output_bytes,
        )

    def begin_execution(
        self,
        session: str,
        language: str,
        code: str,
        *,
        key: str,
        actor: str = "agent",
        at: float | None = None,
    ) -> int:
        """Record code about to be sent to a kernel: status `running` until `end_execution`."""
        return self._insert_execution(
            session,
            language,
            code,
            actor,
            at,
            key,
            status=RUNNING,
            duration_s=None,
            output_bytes=None,
        )

    def end_execution(
        self, begun: str, *, status: str, duration_s: float, output_bytes: int
    ) -> int:
        """Complete the entry `begin_execution` made with key `begun`; returns how many
        entries changed (0 when there is none: rotated away, or never begun)."""
        _check_outcome(status, duration_s, output_bytes)
        update = (
            "UPDATE audit SET status = ?, duration_s = ?, output_bytes = ? "
            "WHERE entry_key = ? AND kind = 'execution'"
        )
        return self._table.write(
            "an execution", (update, (status, float(duration_s), output_bytes, begun))
        )

    def mark_interrupted(self, reason: str) -> int:
        """Executions still `running` (the server stopped before they ended): `interrupted`,
        with `reason` as their detail's `interrupted`; returns how many."""
        update = (
            "UPDATE audit SET status = 'interrupted', "
            "detail = json_set(detail, '$.interrupted', ?) "
            "WHERE kind = 'execution' AND status = ?"
        )
        return self._table.write("an execution", (update, (reason, RUNNING)))

    def record_session(
        self,
        session: str,
        event: str,
        *,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        at: float | None = None,
        key: str | None = None,
    ) -> int:
        """Record a session event, one of `SESSION_EVENTS`."""
        return self.record(
            "session", actor=actor, action=event, session=session, detail=detail, at=at, key=key
        )

    def record_admin(
        self,
        action: str,
        target: str | None,
        *,
        actor: str = "admin",
        detail: Mapping[str, Any] | None = None,
        session: str | None = None,
        at: float | None = None,
        key: str | None = None,
    ) -> int:
        """Record an operator action on `target`; `session` when it concerns one session."""
        return self.record(
            "admin",
            actor=actor,
            action=action,
            session=session,
            target=target,
            detail=detail,
            at=at,
            key=key,
        )

    def record(
        self,
        kind: str,
        *,
        actor: str,
        action: str,
        session: str | None = None,
        target: str | None = None,
        detail: Mapping[str, Any] | None = None,
        at: float | None = None,
        key: str | None = None,
    ) -> int:
        """Record an entry of any kind but "execution" (which needs `record_execution`)."""
        if kind == "execution":
            raise InvalidInput("executions are recorded with record_execution")
        _check_kind(kind)
        for events_kind, events in (("session", SESSION_EVENTS), ("server", SERVER_EVENTS)):
            if kind == events_kind and action not in events:
                raise InvalidInput(f"unknown {kind} event {action!r}; expected one of {events}")
        if not action:
            raise InvalidInput(f"an audit entry of kind {kind!r} needs an action")
        return self._insert(
            kind=kind,
            actor=actor,
            action=action,
            session=session,
            target=target,
            detail={} if detail is None else detail,
            at=at,
            execution=None,
            key=key,
        )

    def query(
        self,
        *,
        kind: str | None = None,
        session: str | None = None,
        since: float | None = None,
        until: float | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> AuditPage:
        """Entries newest first (by id), with `since <= at < until` and `id < before_id`.

        `limit` is capped at `MAX_QUERY_LIMIT`. Raises `InvalidInput` for an unknown kind, a
        limit or before_id below 1, or since after until.
        """
        if kind is not None:
            _check_kind(kind)
        if isinstance(limit, bool) or limit <= 0:
            raise InvalidInput(f"limit must be a positive integer, not {limit!r}")
        if before_id is not None and before_id <= 0:
            raise InvalidInput(f"before_id must be a positive integer, not {before_id!r}")
        if since is not None and until is not None and since > until:
            raise InvalidInput(f"since ({since}) is after until ({until})")
        limit = min(limit, MAX_QUERY_LIMIT)
        where, params = _where(
            kind=kind, session=session, since=since, until=until, before_id=before_id
        )
        rows = self._table.newest(where, params, limit + 1)
        entries = tuple(_entry(row) for row in rows[:limit])
        more = len(rows) > limit
        return AuditPage(entries=entries, next_before_id=entries[-1].id if more else None)

    def rotate(self, *, now: float | None = None) -> int:
        """Remove rows older than `max_age_s` and the oldest past `max_rows`; return how many.

        Runs on open and every `ROTATE_EVERY_WRITES` writes; callers rarely need it.
        """
        return self._table.rotate(now)

    @property
    def pending(self) -> int:
        """Writes the database refused that wait in memory for the next one it takes."""
        return self._table.pending

    @property
    def dropped(self) -> int:
        """Refused writes let go past `MAX_PENDING`."""
        return self._table.dropped

    def close(self) -> None:
        """Write what was kept from refused writes (one try), then close."""
        self._table.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _insert_execution(
        self,
        session: str,
        language: str,
        code: str,
        actor: str,
        at: float | None,
        key: str | None,
        *,
        status: str,
        duration_s: float | None,
        output_bytes: int | None,
    ) -> int:
        if not language:
            raise InvalidInput("an execution needs a language")
        stored, detail = _bound_code(code)
        return self._insert(
            kind="execution",
            actor=actor,
            action="execute",
            session=session,
            target=None,
            detail=detail,
            at=at,
            execution=(language, stored, duration_s, status, output_bytes),
            key=key,
        )

    def _insert(
        self,
        *,
        kind: str,
        actor: str,
        action: str,
        session: str | None,
        target: str | None,
        detail: Mapping[str, Any],
        at: float | None,
        execution: tuple[str, str, float | None, str, int | None] | None,
        key: str | None,
    ) -> int:
        if actor not in ACTORS:
            raise InvalidInput(f"unknown actor {actor!r}; expected one of {ACTORS}")
        when = time.time() if at is None else float(at)
        if not math.isfinite(when):
            raise InvalidInput(f"at must be a finite time, not {at!r}")
        language, code, duration_s, status, output_bytes = execution or (None,) * 5
        params = (
            when,
            kind,
            session,
            actor,
            action,
            target,
            _encode_detail(detail),
            language,
            code,
            duration_s,
            status,
            output_bytes,
            key,
        )
        return self._table.insert(f"a {kind}", params)


def _check_outcome(status: str, duration_s: float, output_bytes: int) -> None:
    if status not in STATUSES:
        raise InvalidInput(f"unknown execution status {status!r}; expected one of {STATUSES}")
    if not (math.isfinite(duration_s) and duration_s >= 0):
        raise InvalidInput(f"duration_s must be a non-negative number, not {duration_s!r}")
    if output_bytes < 0:
        raise InvalidInput(f"output_bytes must not be negative, not {output_bytes}")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InvalidInput(f"unknown audit kind {kind!r}; expected one of {KINDS}")


def _bound_code(code: str) -> tuple[str, dict[str, Any]]:
    """The code to store and a detail saying what was changed, if anything."""
    detail: dict[str, Any] = {}
    try:
        raw = code.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (valid in JSON, not in UTF-8): keep them visible as escapes.
        raw = code.encode("utf-8", "backslashreplace")
        code = raw.decode("utf-8")
        detail["code_escaped"] = True
    if len(raw) <= MAX_CODE_BYTES:
        return code, detail
    kept = raw[:MAX_CODE_BYTES].decode("utf-8", "ignore")
    cut = len(raw) - len(kept.encode("utf-8"))
    detail.update(code_bytes=len(raw), code_cut_bytes=cut)
    return f"{kept}\n[corral audit: {cut} more bytes of code not stored]", detail


def _encode_detail(detail: Mapping[str, Any]) -> str:
    if not isinstance(detail, Mapping):
        raise InvalidInput(f"an audit detail must be a JSON object, not {type(detail).__name__}")
    try:
        return json.dumps(dict(detail), allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"an audit detail must be JSON-serialisable: {exc}") from exc


def _where(
    *,
    kind: str | None,
    session: str | None,
    since: float | None,
    until: float | None,
    before_id: int | None,
) -> tuple[str, list[object]]:
    clauses: list[str] = []
    params: list[object] = []
    for clause, value in (
        ("kind = ?", kind),
        ("session = ?", session),
        ("at >= ?", since),
        ("at < ?", until),
        ("id < ?", before_id),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _entry(row: Row) -> AuditEntry:
    (id_, at, kind, session, actor, action, target, detail, *execution) = row
    language, code, duration_s, status, output_bytes = execution
    return AuditEntry(
        id=id_,
        at=at,
        kind=kind,
        actor=actor,
        action=action,
        session=session,
        target=target,
        detail=MappingProxyType(json.loads(detail)),
        language=language,
        code=code,
        duration_s=duration_s,
        status=status,
        output_bytes=output_bytes,
    )
