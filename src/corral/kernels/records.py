"""Sessions as stored: `Session` objects made from their records, their state saved as it
changes, and removed with their folders (`corral.store` is the database under it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from corral.config import Settings
from corral.errors import InvalidInput
from corral.kernels.session import Session
from corral.sandbox.profile import SessionPaths
from corral.store import SessionRecord, Store, now

TRASH = ".trash"  # deleted sessions' folders, being removed; never an id (ids start alnum)


class SessionRecords:
    """Every session's record and options in `store`, and its folders under the state."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    @property
    def trash_dir(self) -> Path:
        return self.settings.sessions_dir / TRASH

    def load(self) -> list[Session]:
        """The stored sessions, all stopped now (no kernel outlives a server). What a
        server stopped while removing deleted sessions' folders left is removed first."""
        self.settings.sessions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.rmtree(self.trash_dir, ignore_errors=True)
        self.store.mark_all_stopped()
        options = self.store.options()
        sessions = []
        for record in self.store.all():
            record.state = "stopped"
            sessions.append(self.make(record, options.get(record.id, {})))
        return sessions

    async def stored_new(self, session_id: str) -> SessionRecord:
        """A new session's record, stored before anything else is made (a refused write
        leaves no half-made session)."""
        record = _new_record(session_id)
        await self.store.run(self.store.put, record)
        return record

    def made_now(self, session_id: str) -> Session:
        """A session made on first use without waiting for its record to be stored (a
        refusal is logged; it is stored again at its next change)."""
        record = _new_record(session_id)
        self.store.later(self.store.put, record)
        return self.made(record)

    def made(self, record: SessionRecord) -> Session:
        """A new session of `record`, its workspace folder made."""
        session = self.make(record)
        session.paths.workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
        return session

    def make(self, record: SessionRecord, options: dict[str, Any] | None = None) -> Session:
        """The session of `record` (a stored one's folders are there already); stored limit
        changes that are no longer valid fall back to the defaults."""
        options = options if options is not None else {}
        limits = self.settings.limits
        with contextlib.suppress(InvalidInput):
            limits = limits.changed(options.get("limits", {}))
        root = self.settings.sessions_dir / record.id
        paths = SessionPaths(workspace=root / "workspace", env=root / "env")
        return Session(record, paths, limits, options)

    def touch(self, session: Session) -> None:
        # Kept in memory on the hot path; written with the next state change or at close.
        session.record.last_used_at = now()

    def save(self, session: Session) -> None:
        """Store the session's state, without waiting (a copy of its record, in the store's
        thread). A refused write (database locked, disk full) is logged: the record is
        written again at its next change and at close, and every session is stopped at the
        next start anyway, so the caller's action stands."""
        session.record.state = session.state
        self.store.later(self.store.put, replace(session.record))

    async def save_options(self, session: Session) -> None:
        """Store what the operator chose for `session` (limit changes, mounts, bridge)."""
        await self.store.run(self.store.put_options, session.id, session.options)

    async def forget(self, session_id: str) -> None:
        """Remove a session's record and folders. The folders leave the session's place at
        once (a new session of the same id starts empty) and are removed in a worker
        thread: one with installed packages holds thousands of files, which the event
        loop, answering every other session meanwhile, should not wait for."""
        await self.store.run(self.store.delete, session_id)
        folder = self.settings.sessions_dir / session_id
        trash = self.trash_dir / f"{session_id}.{secrets.token_hex(4)}"
        try:
            self.trash_dir.mkdir(mode=0o700, exist_ok=True)
            os.rename(folder, trash)
        except FileNotFoundError:
            return
        except OSError:
            trash = folder  # removed where it is
        await asyncio.to_thread(shutil.rmtree, trash, True)


def _new_record(session_id: str) -> SessionRecord:
    created = now()
    return SessionRecord(session_id, created, created, "stopped")
