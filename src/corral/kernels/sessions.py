"""The session registry: every session of one server, its queue, and its kernels' lives.

A session's metadata is stored, so it is listed after a server restart (as stopped) and
resumes on first use with the same workspace and installed packages. Executions in one
session run one at a time, in arrival order (its lock); sessions run in parallel. The
registry decides when kernels start, stop, restart or are reaped when idle; the kernel
factory (`corral.kernels.factory`) builds them, and the warm pool (`corral.kernels.warm`)
hands ready ones to fresh sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from corral.config import Settings
from corral.errors import (
    InvalidInput,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    TooManySessions,
)
from corral.kernels.calls import CallRunner
from corral.kernels.disk_patrol import DiskPatrol
from corral.kernels.factory import EgressSockets, EventHook, KernelFactory
from corral.kernels.pool import WarmPool
from corral.kernels.projects import choose_mounts
from corral.kernels.results import NetRefusal
from corral.kernels.session import DEFAULT_SESSION as DEFAULT_SESSION
from corral.kernels.session import Session as Session
from corral.kernels.session import SessionInfo as SessionInfo
from corral.kernels.session import check_timeout as check_timeout
from corral.kernels.session import new_session_id
from corral.kernels.session import validate_language as validate_language
from corral.kernels.session import validate_session_id as validate_session_id
from corral.kernels.starter import KernelStarter
from corral.kernels.warm import WarmHandOver, WarmSession
from corral.sandbox.profile import SessionPaths
from corral.sandbox.runtime import PythonRuntime
from corral.store import SessionRecord, Store, now

log = logging.getLogger(__name__)


class SessionManager:
    """Owns every session of one server. Call `open()` first and `close()` at the end.

    Raises `InvalidInput` at construction for an operator setting the factory refuses.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        runtime: PythonRuntime | None = None,
        store: Store | None = None,
        egress: EgressSockets | None = None,
        on_event: EventHook | None = None,
    ) -> None:
        self.settings = settings
        self.factory = KernelFactory(settings, runtime=runtime, egress=egress, on_event=on_event)
        self.warm = WarmHandOver(self.factory, settings, self._room)
        self.store = store or Store(settings.db_path)
        self.sessions: dict[str, Session] = {}
        self.kernels = KernelStarter(
            self.factory, self.warm, settings.max_sessions, self._room, self._save
        )
        self.calls = CallRunner(self.kernels, settings, self.sessions.values, self._touch)
        self._reaper: asyncio.Task[None] | None = None
        self.disk_patrol = DiskPatrol(lambda: list(self.sessions.values()), self.kernels.drop_lost)

    @property
    def pool(self) -> WarmPool[WarmSession]:
        return self.warm.pool

    async def open(self) -> None:
        """Load stored sessions (all stopped now) and start the idle reaper."""
        await self.factory.prepare()
        try:
            self.settings.sessions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.store.mark_all_stopped()
            options = self.store.options()
            for record in self.store.all():
                record.state = "stopped"
                self.sessions[record.id] = self._session(record, options.get(record.id, {}))
            await self.warm.open()
        except BaseException:
            self.factory.close()  # its janitor leaves: nothing was started yet
            raise
        self._reaper = asyncio.create_task(self._reap_forever(), name="corral-idle-reaper")
        # What exists now (modules, classes, the runtime's objects) lives as long as the
        # process: moved out of the collector's reach, so a full collection walks only what
        # came later. Over the whole heap one took 90 ms, in whichever thread it fell: long
        # enough for a writer to put hundreds of MiB past its limit before the patrol looked.
        gc.freeze()
        self.disk_patrol.start()

    async def close(self) -> None:
        """Stop every kernel; workspaces and records stay."""
        await self.warm.close()
        await self.disk_patrol.close()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self.factory.stop_kernels(s) for s in self.sessions.values()))
        await self.factory.fonts.close()
        for session in self.sessions.values():
            self._save(session)
        await asyncio.to_thread(self.store.close)  # after the writes queued
        self.factory.close()

    # -- lifecycle -----------------------------------------------------------------------

    async def create(
        self, session_id: str | None = None, *, start: bool = True, mounts: Sequence[str] = ()
    ) -> SessionInfo:
        """A new session (a generated id when none is given), started unless `start` is False.

        Naming a stopped session starts it again (`resume`): coderunner's clients reuse an id
        once its session is stopped. `mounts` names some of the operator's project mounts
        (never a path); raises `InvalidInput` for one the operator did not configure,
        `SessionExists` for a session that is open, and `TooManySessions` at the cap, which
        leaves nothing behind.
        """
        session_id = validate_session_id(session_id) if session_id else new_session_id()
        existing = self.sessions.get(session_id)
        if existing is not None and not existing.open:
            return await self.resume(existing, mounts)
        if existing is not None:
            raise SessionExists(session_id)
        chosen = choose_mounts(mounts, self.factory.mounts)
        if start:
            self.kernels.check_capacity()
        session = await self._register(session_id)
        try:
            if chosen:
                session.options["mounts"] = chosen
                await self.store.run(self.store.put_options, session_id, session.options)
            if start:
                await self._open(session)
        except TooManySessions:  # another start took the last place meanwhile
            await self._forget(session)
            raise
        return session.info()

    async def resume(self, session: Session, mounts: Sequence[str] = ()) -> SessionInfo:
        """Start a stopped session again: a fresh kernel, its files and packages kept."""
        if mounts and list(mounts) != list(session.options.get("mounts", ())):
            kept = ", ".join(session.options.get("mounts", ())) or "none"
            raise SessionExists(
                session.id,
                f"session {session.id!r} exists with the mounts {kept}; start it again "
                "without naming mounts, or choose another id",
            )
        await self._open(session)
        return session.info()

    async def start(self, session_id: str) -> SessionInfo:
        """Start a stopped session's python kernel again (same workspace and packages)."""
        session = self._get(session_id)
        await self._open(session)
        return session.info()

    async def _open(self, session: Session) -> None:
        await self.kernels.ensure(session, "python")
        session.open = True

    def get(self, session_id: str) -> SessionInfo:
        return self._get(session_id).info()

    def list_sessions(self) -> list[SessionInfo]:
        return [session.info() for session in self.sessions.values()]

    async def stop(self, session_id: str, *, only_open: bool = False) -> SessionInfo:
        """Stop the session's kernels and close it; its workspace and packages stay for a
        later start. With `only_open` (coderunner's stop), a closed session is not found."""
        session = self._get(session_id)
        if only_open and not session.open:
            raise SessionNotFound(session_id)
        session.open = False
        await self.factory.stop_kernels(session)
        self._save(session)
        return session.info()

    async def restart(self, session_id: str) -> SessionInfo:
        """Replace the session's kernels with fresh ones (variables are lost, files stay)."""
        session = self._get(session_id)
        languages = sorted(session.kernels) or ["python"]
        async with session.lock:
            await self.factory.stop_kernels(session)
            for language in languages:
                await self.kernels.ensure(session, language)
        return session.info()

    async def delete(self, session_id: str) -> None:
        """Stop the session and remove its workspace, packages and record."""
        session = self._get(session_id)
        await self.factory.stop_kernels(session)
        await self._forget(session)

    async def _forget(self, session: Session) -> None:
        """Remove a session whose kernels are stopped: its record, folders and egress."""
        if self.factory.egress is not None:
            await self.factory.egress.forget(session.id)
        self.sessions.pop(session.id, None)
        await self.store.run(self.store.delete, session.id)
        shutil.rmtree(self.settings.sessions_dir / session.id, ignore_errors=True)

    def _room(self) -> int:
        """How many more sessions may run (the warm pool fills no further)."""
        running = sum(1 for session in self.sessions.values() if session.running)
        return self.settings.max_sessions - running

    # -- idle ------------------------------------------------------------------------------

    async def reap_idle(self) -> list[str]:
        """Stop the kernels of sessions unused for longer than the idle timeout."""
        stopped = []
        for session in list(self.sessions.values()):
            idle = session.kernels and not session.lock.locked() and not session.starting
            if idle and session.record.last_used_at < now() - session.limits.idle_timeout_s:
                await self.factory.stop_kernels(session)
                self._save(session)
                stopped.append(session.record.id)
        return stopped

    async def _reap_forever(self) -> None:
        interval = min(60.0, max(1.0, self.settings.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(interval)
            await self.reap_idle()

    # -- helpers ---------------------------------------------------------------------------

    def note_refusal(self, session_id: str, refusal: NetRefusal) -> None:
        """A connection the proxy refused for `session_id`, for its running execution."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.note_refusal(refusal)

    def session_for(self, session_id: str | None, *, resume: bool = True) -> Session:
        """The named session, or the default one (registered on first use) for None.

        Raises `SessionNotFound`, or `SessionClosed` for a named session that was stopped
        when `resume` is False."""
        if session_id is None:
            if DEFAULT_SESSION not in self.sessions:
                # Made on first use, anywhere: its record is stored without waiting (a
                # refusal is logged, and it is stored again at its next change).
                self.store.later(self.store.put, self._add(DEFAULT_SESSION))
            return self.sessions[DEFAULT_SESSION]
        session = self._get(session_id)
        if not resume and not session.open:
            raise SessionClosed(session_id)
        return session

    async def save_options(self, session: Session) -> None:
        """Store what the operator chose for `session` (limit changes, mounts, bridge)."""
        await self.store.run(self.store.put_options, session.id, session.options)

    def _get(self, session_id: str) -> Session:
        session = self.sessions.get(validate_session_id(session_id))
        if session is None:
            raise SessionNotFound(session_id)
        return session

    async def _register(self, session_id: str) -> Session:
        created = now()
        record = SessionRecord(session_id, created, created, "stopped")
        # First: a refused write leaves no half-made session.
        await self.store.run(self.store.put, record)
        if session_id in self.sessions:  # made meanwhile, by a call that did not wait
            raise SessionExists(session_id)
        self._add(session_id, record)
        return self.sessions[session_id]

    def _add(self, session_id: str, record: SessionRecord | None = None) -> SessionRecord:
        """Hold a new session in memory (its record stored by the caller); its record."""
        if record is None:
            created = now()
            record = SessionRecord(session_id, created, created, "stopped")
        session = self._session(record, {})
        session.paths.workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.sessions[session_id] = session
        return record

    def _session(self, record: SessionRecord, options: dict[str, Any]) -> Session:
        limits = self.settings.limits
        with contextlib.suppress(InvalidInput):  # a stored value no longer valid: defaults
            limits = limits.changed(options.get("limits", {}))
        return Session(record, self._paths(record.id), limits, options)

    def _paths(self, session_id: str) -> SessionPaths:
        root = self.settings.sessions_dir / session_id
        return SessionPaths(workspace=root / "workspace", env=root / "env")

    def _touch(self, session: Session) -> None:
        # Kept in memory on the hot path; written with the next state change or at close.
        session.record.last_used_at = now()

    def _save(self, session: Session) -> None:
        """Store the session's state, without waiting (a copy of its record, in the store's
        thread). A refused write (database locked, disk full) is logged: the record is
        written again at its next change and at close, and every session is stopped at the
        next start anyway, so the caller's action stands."""
        session.record.state = session.state
        self.store.later(self.store.put, replace(session.record))
