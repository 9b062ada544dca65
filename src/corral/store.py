"""SQLite storage for session metadata, so sessions outlive the server process.

One small table; every call is a short transaction. After a restart every stored session is
listed as stopped until it is used again.

The server never calls the database from its event loop: `run` awaits a call made in the
store's one thread, `later` queues one without waiting (its refusal is logged), both in the
order they were made. A database locked by another program then holds up only the calls
that need it (a new session must be stored), never `/health` or a running execution.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from corral.errors import SandboxError, StateUnavailable

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS session_options (
    session TEXT PRIMARY KEY,
    options TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS net_policies (
    session TEXT PRIMARY KEY,
    mode TEXT NOT NULL,
    allow TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    location TEXT NOT NULL,
    hosts TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS net_requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    hosts TEXT NOT NULL,
    reason TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    decided_at REAL
);
"""


@dataclass
class SessionRecord:
    id: str
    created_at: float
    last_used_at: float
    state: str


@dataclass
class NetRequest:
    """An agent's request for network access, waiting for (or decided by) the operator."""

    id: int
    session: str
    hosts: list[str]
    reason: str
    status: str  # pending, approved, rejected
    created_at: float
    decided_at: float | None


BUSY_TIMEOUT_S = 10.0  # how long a write waits for another connection's lock


def database_problem(exc: sqlite3.Error) -> str:
    """What a refused database call means, in words an operator can act on."""
    code = _error_code(exc)
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return (
            f"the state database stayed locked by another connection for {BUSY_TIMEOUT_S:g} s; "
            "try again"
        )
    if code == sqlite3.SQLITE_FULL:
        return "the disk holding the state directory is full; free space there"
    return str(exc)


def open_database(path: Path, schema: str, what: str) -> sqlite3.Connection:
    """An autocommit connection to `path` in WAL mode with `schema` applied.

    Shared by every table owner of the state database. Raises `SandboxError` naming `what`.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        db = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None
        )
        db.execute("PRAGMA journal_mode=WAL")
        # WAL with NORMAL sync: a power cut may lose the last writes, never corrupt.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        db.executescript(schema)
    except sqlite3.Error as exc:
        raise SandboxError(f"cannot open {what} in {path}: {database_problem(exc)}") from exc
    return db


# A live session's state (starting, idle, busy) changes behind the store between writes;
# only the running server knows it. The store keeps whether the session was last running.
_LIVE_STATES = frozenset({"starting", "idle", "busy"})


def stored_state(state: str) -> str:
    """'running' for any live state; 'stopped' and 'failed' as they are."""
    return "running" if state in _LIVE_STATES else state


class Store:
    """Session records in `path`; safe to share between threads of one process."""

    def __init__(self, path: Path) -> None:
        self._db = open_database(path, _SCHEMA, "the session database")
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-store")

    async def run(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`call(*args, **kwargs)` (a method of this store) in the store's thread."""
        return await asyncio.wrap_future(self._worker.submit(call, *args, **kwargs))

    def later(self, call: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
        """`call(*args, **kwargs)` in the store's thread, not waited for; a refusal is
        logged (for writes that the next change or the close writes again)."""
        self._worker.submit(call, *args, **kwargs).add_done_callback(_log_refusal)

    def put(self, record: SessionRecord) -> None:
        """Store `record`; its state as what outlives the moment (see `stored_state`)."""
        self._write(
            "INSERT INTO sessions(id, created_at, last_used_at, state) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET last_used_at=excluded.last_used_at, "
            "state=excluded.state",
            (record.id, record.created_at, record.last_used_at, stored_state(record.state)),
        )

    def delete(self, session_id: str) -> None:
        self._write("DELETE FROM sessions WHERE id = ?", (session_id,))
        self._write("DELETE FROM session_options WHERE session = ?", (session_id,))

    def all(self) -> list[SessionRecord]:
        rows = self._db.execute(
            "SELECT id, created_at, last_used_at, state FROM sessions ORDER BY created_at"
        ).fetchall()
        return [SessionRecord(*row) for row in rows]

    def put_options(self, session_id: str, options: dict[str, Any]) -> None:
        """What the operator chose for one session: limit changes, mounts, the agent bridge."""
        self._write(
            "INSERT INTO session_options(session, options) VALUES (?, ?) "
            "ON CONFLICT(session) DO UPDATE SET options=excluded.options",
            (session_id, json.dumps(options)),
        )

    def options(self) -> dict[str, dict[str, Any]]:
        rows = self._db.execute("SELECT session, options FROM session_options").fetchall()
        return {session: json.loads(options) for session, options in rows}

    def mark_all_stopped(self) -> None:
        self._write("UPDATE sessions SET state = 'stopped' WHERE state != 'stopped'", ())

    # -- network policies and requests -----------------------------------------------------

    def put_policy(self, session_id: str, mode: str, allow: list[str]) -> None:
        self._write(
            "INSERT INTO net_policies(session, mode, allow) VALUES (?, ?, ?) "
            "ON CONFLICT(session) DO UPDATE SET mode=excluded.mode, allow=excluded.allow",
            (session_id, mode, json.dumps(allow)),
        )

    def delete_policy(self, session_id: str) -> None:
        self._write("DELETE FROM net_policies WHERE session = ?", (session_id,))

    def policies(self) -> dict[str, tuple[str, list[str]]]:
        rows = self._db.execute("SELECT session, mode, allow FROM net_policies").fetchall()
        return {session: (mode, json.loads(allow)) for session, mode, allow in rows}

    def put_secret(self, name: str, source: str, location: str, hosts: list[str]) -> float:
        """Store a secret's reference (never its value); replaces one of the same name."""
        created = now()
        self._write(
            "INSERT OR REPLACE INTO secrets (name, source, location, hosts, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (name, source, location, json.dumps(hosts), created),
        )
        return created

    def delete_secret(self, name: str) -> None:
        self._write("DELETE FROM secrets WHERE name = ?", (name,))

    def secrets(self) -> list[tuple[str, str, str, list[str], float]]:
        rows = self._db.execute(
            "SELECT name, source, location, hosts, created_at FROM secrets ORDER BY name"
        ).fetchall()
        return [(n, s, loc, json.loads(h), at) for n, s, loc, h, at in rows]

    def add_request(self, session_id: str, hosts: list[str], reason: str) -> int:
        try:
            cursor = self._db.execute(
                "INSERT INTO net_requests(session, hosts, reason, status, created_at) "
                "VALUES (?, ?, ?, 'pending', ?)",
                (session_id, json.dumps(hosts), reason, now()),
            )
        except sqlite3.Error as exc:
            raise _refused(exc) from exc
        return int(cursor.lastrowid or 0)

    def requests(self, status: str | None = None) -> list[NetRequest]:
        sql = "SELECT id, session, hosts, reason, status, created_at, decided_at FROM net_requests"
        rows = (
            self._db.execute(sql + " WHERE status = ? ORDER BY id", (status,))
            if status
            else self._db.execute(sql + " ORDER BY id")
        ).fetchall()
        return [NetRequest(row[0], row[1], json.loads(row[2]), *row[3:]) for row in rows]

    def decide_request(self, request_id: int, status: str) -> None:
        self._write(
            "UPDATE net_requests SET status = ?, decided_at = ? WHERE id = ?",
            (status, now(), request_id),
        )

    def close(self) -> None:
        """Finish the calls queued, then close."""
        self._worker.shutdown(wait=True)
        self._db.close()

    def _write(self, sql: str, params: tuple[object, ...]) -> None:
        try:
            self._db.execute(sql, params)
        except sqlite3.Error as exc:
            raise _refused(exc) from exc


def _log_refusal(done: Future[object]) -> None:
    if not done.cancelled() and (exc := done.exception()) is not None:
        log.warning("the session database refused a write: %s", exc)


def _refused(exc: sqlite3.Error) -> SandboxError:
    message = f"the session database refused a write: {database_problem(exc)}"
    return StateUnavailable(message) if _passing(exc) else SandboxError(message)


def _passing(exc: sqlite3.Error) -> bool:
    """A lock held by another connection or a full disk: the same write may pass later."""
    return _error_code(exc) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL)


def _error_code(exc: sqlite3.Error) -> int:
    return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF


def now() -> float:
    return time.time()
