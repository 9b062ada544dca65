"""SQLite storage for session metadata, so sessions outlive the server process.

One small table; every call is a short transaction. After a restart every stored session is
listed as stopped until it is used again.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from corral.errors import SandboxError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    state TEXT NOT NULL
);
"""


@dataclass
class SessionRecord:
    id: str
    created_at: float
    last_used_at: float
    state: str


class Store:
    """Session records in `path`; safe to share between threads of one process."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(
                path, timeout=10, check_same_thread=False, isolation_level=None
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL with NORMAL sync: a power cut may lose the last writes, never corrupt.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise SandboxError(f"cannot open the session database {path}: {exc}") from exc

    def put(self, record: SessionRecord) -> None:
        self._write(
            "INSERT INTO sessions(id, created_at, last_used_at, state) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET last_used_at=excluded.last_used_at, "
            "state=excluded.state",
            (record.id, record.created_at, record.last_used_at, record.state),
        )

    def delete(self, session_id: str) -> None:
        self._write("DELETE FROM sessions WHERE id = ?", (session_id,))

    def all(self) -> list[SessionRecord]:
        rows = self._db.execute(
            "SELECT id, created_at, last_used_at, state FROM sessions ORDER BY created_at"
        ).fetchall()
        return [SessionRecord(*row) for row in rows]

    def mark_all_stopped(self) -> None:
        self._write("UPDATE sessions SET state = 'stopped' WHERE state != 'stopped'", ())

    def close(self) -> None:
        self._db.close()

    def _write(self, sql: str, params: tuple[object, ...]) -> None:
        try:
            self._db.execute(sql, params)
        except sqlite3.Error as exc:
            raise SandboxError(f"the session database refused a write: {exc}") from exc


def now() -> float:
    return time.time()
