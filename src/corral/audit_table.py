"""The audit table in SQLite: its schema, its statements, and writes that wait out a refusal.

`AuditTable` is the storage under `corral.audit.AuditLog`: the log validates and shapes
entries, the table holds the one connection and its lock, runs the SQL, and keeps a write the
database refused for a reason that may pass (locked, busy, disk full) in memory, to write it
before the next one the database takes. The table's columns are described in
`corral.audit`.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Final

from corral.errors import SandboxError, StateUnavailable
from corral.store import database_problem, open_database

# One write: a statement and its parameters.
Write = tuple[str, tuple[Any, ...]]
Row = tuple[Any, ...]

MAX_PENDING: Final = 1000  # refused writes kept in memory until the database takes them
ROTATE_EVERY_WRITES: Final = 500

_log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    session TEXT,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT,
    detail TEXT NOT NULL DEFAULT '{}',
    language TEXT,
    code TEXT,
    duration_s REAL,
    status TEXT,
    output_bytes INTEGER,
    entry_key TEXT
);
CREATE INDEX IF NOT EXISTS audit_kind_id ON audit(kind, id);
CREATE INDEX IF NOT EXISTS audit_session_id ON audit(session, id);
CREATE INDEX IF NOT EXISTS audit_at ON audit(at);
"""
# Made after the schema, once a database from before keys has the column (`_add_keys`).
_KEY_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS audit_entry_key ON audit(entry_key)"
# The parameters of `insert`, in this order.
INSERT_COLUMNS: Final = (
    "at",
    "kind",
    "session",
    "actor",
    "action",
    "target",
    "detail",
    "language",
    "code",
    "duration_s",
    "status",
    "output_bytes",
    "entry_key",
)
_INSERT: Final = (
    f"INSERT OR IGNORE INTO audit({', '.join(INSERT_COLUMNS)}) "  # noqa: S608
    f"VALUES ({', '.join('?' * len(INSERT_COLUMNS))})"
)
# The columns of a row `newest` returns, in this order.
ROW_COLUMNS: Final = (
    "id, at, kind, session, actor, action, target, detail, "
    "language, code, duration_s, status, output_bytes"
)


class AuditTable:
    """The `audit` table of the database at `path`; safe to share between threads.

    Bounded: rows older than `max_age_s` and the oldest past `max_rows` are removed on open
    and every `ROTATE_EVERY_WRITES` writes (`rotate`).

    A write raises `StateUnavailable` when the database refuses it for a reason that may
    pass (the write is then kept, up to `MAX_PENDING`, and runs in the same transaction as
    the next write the database takes, or at `close`), and `SandboxError` for any other
    refusal.
    """

    def __init__(self, path: Path, *, max_rows: int, max_age_s: float) -> None:
        self._max_rows = max_rows
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._pending: list[Write] = []  # writes the database refused, oldest first
        self.dropped = 0  # refused writes let go past `MAX_PENDING`
        self._writes_since_rotation = 0
        self._db = open_database(path, _SCHEMA, "the audit log")
        try:
            _add_keys(self._db)
        except SandboxError:
            self._db.close()
            raise
        self._rotate_quietly()  # a database locked by another program must not stop a start

    def insert(self, what: str, values: tuple[Any, ...]) -> int:
        """Insert one entry (`values` in `INSERT_COLUMNS` order); its id. An entry whose
        `entry_key` was written before is not written again: that entry's id."""
        return self.write(what, (_INSERT, values))

    def write(self, what: str, write: Write) -> int:
        """Run one write after those kept from refusals; its row id (an insert) or the rows
        it changed (anything else). `what` names the entry in a refusal's message."""
        with self._lock:
            try:
                done = self._write_locked(write)
            except sqlite3.OperationalError as exc:  # locked, busy, full: may pass later
                self._keep_locked(write)
                raise StateUnavailable(
                    f"the audit log refused {what} entry: {database_problem(exc)} "
                    "(kept in memory; written with the next entry the database takes)"
                ) from exc
            except (sqlite3.Error, UnicodeEncodeError) as exc:
                raise SandboxError(f"the audit log refused {what} entry: {exc}") from exc
            self._writes_since_rotation += 1
            due = self._writes_since_rotation >= ROTATE_EVERY_WRITES
        if due:
            self._rotate_quietly()
        return done

    def newest(self, where: str, params: list[object], limit: int) -> list[Row]:
        """Up to `limit` rows (`ROW_COLUMNS`) matching `where`, newest first."""
        sql = f"SELECT {ROW_COLUMNS} FROM audit{where} ORDER BY id DESC LIMIT ?"  # noqa: S608
        try:
            with self._lock:
                return self._db.execute(sql, (*params, limit)).fetchall()
        except sqlite3.Error as exc:
            raise SandboxError(f"cannot read the audit log: {exc}") from exc

    def rotate(self, now: float | None = None) -> int:
        """Remove rows older than `max_age_s` and the oldest past `max_rows`; how many."""
        cutoff = (time.time() if now is None else now) - self._max_age_s
        try:
            with self._lock:
                self._writes_since_rotation = 0
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    removed = self._db.execute("DELETE FROM audit WHERE at < ?", (cutoff,)).rowcount
                    removed += self._db.execute(
                        "DELETE FROM audit WHERE id <= "
                        "(SELECT id FROM audit ORDER BY id DESC LIMIT 1 OFFSET ?)",
                        (self._max_rows,),
                    ).rowcount
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise SandboxError(f"cannot rotate the audit log: {exc}") from exc
        return removed

    @property
    def pending(self) -> int:
        """Writes the database refused that wait in memory for the next one it takes."""
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Write what was kept from refused writes (one try), then close."""
        with self._lock:
            if self._pending:
                last = self._pending.pop()
                try:
                    self._write_locked(last)
                except sqlite3.Error as exc:
                    _log.error(
                        "the audit log lost %d refused writes at close: %s",
                        len(self._pending) + 1,
                        database_problem(exc),
                    )
            self._db.close()

    def _write_locked(self, write: Write) -> int:
        """The writes kept from refusals, then `write`, in one transaction."""
        if not self._pending:
            return self._run(write)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for kept in self._pending:
                self._run(kept)
            done = self._run(write)
            self._db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise
        _log.warning("the audit log took %d writes it had refused before", len(self._pending))
        self._pending.clear()
        return done

    def _run(self, write: Write) -> int:
        sql, params = write
        cursor = self._db.execute(sql, params)
        if sql is not _INSERT:
            return cursor.rowcount
        if cursor.rowcount == 1 and cursor.lastrowid is not None:
            return cursor.lastrowid
        # Written before under the same key (a journal replayed): that entry's id.
        row = self._db.execute("SELECT id FROM audit WHERE entry_key = ?", (params[-1],)).fetchone()
        if row is None:
            raise SandboxError("the audit log returned no id for an entry")
        return int(row[0])

    def _rotate_quietly(self) -> None:
        # The entry is already written; a failed rotation is retried after the next batch.
        try:
            self.rotate()
        except SandboxError:
            _log.warning("audit log rotation failed", exc_info=True)

    def _keep_locked(self, write: Write) -> None:
        """Keep a refused write for the next one (a locked database, a full disk), up to
        `MAX_PENDING`; past that the oldest kept are dropped, and the log says so."""
        self._pending.append(write)
        if len(self._pending) > MAX_PENDING:
            del self._pending[0]
            self.dropped += 1
            _log.error("the audit log dropped a write: %d refused writes wait", MAX_PENDING)


def _add_keys(db: sqlite3.Connection) -> None:
    """Give a database made before entry keys its `entry_key` column, then the index."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(audit)")}
    try:
        if "entry_key" not in columns:
            db.execute("ALTER TABLE audit ADD COLUMN entry_key TEXT")
        db.execute(_KEY_INDEX)
    except sqlite3.Error as exc:
        raise SandboxError(f"cannot add entry keys to the audit log: {exc}") from exc
