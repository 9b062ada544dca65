"""The session registry: every session of one server, by id, and what happens to it.

A session's metadata is stored (`corral.kernels.records`), so it is listed after a server
restart (as stopped) and resumes on first use with the same workspace and installed
packages. The registry creates, starts, stops, restarts and deletes sessions; it builds
the parts that act on them and gives each what it needs: `kernels` starts kernels within
the session cap (`corral.kernels.starter`), taking ready ones from the warm pool
(`corral.kernels.warm`) that the kernel factory (`corral.kernels.factory`) fills; `calls`
runs code, one call at a time per session in arrival order (`corral.kernels.calls`);
`reaper` stops idle kernels (`corral.kernels.reaper`); the disk patrol watches workspaces.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Sequence

from corral.config import Settings
from corral.errors import (
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
from corral.kernels.reaper import IdleReaper
from corral.kernels.records import SessionRecords
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
from corral.sandbox.host import SandboxHost
from corral.store import Store

log = logging.getLogger(__name__)


class SessionManager:
    """Owns every session of one server. Call `open()` first and `close()` at the end;
    they prepare and close the sandbox host too (made here when none is given).

    Raises `InvalidInput` at construction for an operator setting the factory refuses.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        host: SandboxHost | None = None,
        store: Store | None = None,
        egress: EgressSockets | None = None,
        on_event: EventHook | None = None,
    ) -> None:
        self.settings = settings
        self.host = host or SandboxHost(settings)
        self.factory = KernelFactory(settings, self.host, egress=egress, on_event=on_event)
        self.warm = WarmHandOver(self.factory, settings, self._room)
        self.store = store or Store(settings.db_path)
        self.records = SessionRecords(self.store, settings)
        self._sessions: dict[str, Session] = {}  # by id
        self.kernels = KernelStarter(
            self.factory, self.warm, settings.max_sessions, self._room, self.records.save
        )
        self.calls = CallRunner(
            self.kernels,
            settings,
            self._sessions.values,
            self.records.touch,
            ended=self.warm.pool.resume,  # a refill held back for a new session's first call
        )
        self.reaper = IdleReaper(
            self._sessions.values,
            self.factory.stop_kernels,
            self.records.save,
            interval_s=min(60.0, max(1.0, settings.idle_timeout_s / 4)),
        )
        self.disk_patrol = DiskPatrol(lambda: list(self._sessions.values()), self.kernels.drop_lost)

    @property
    def pool(self) -> WarmPool[WarmSession]:
        return self.warm.pool

    async def open(self) -> None:
        """Load stored sessions (all stopped now) and start the idle reaper."""
        await self.host.prepare()
        try:
            self._sessions.update((session.id, session) for session in self.records.load())
            await self.warm.open()
        except BaseException:
            self.host.close()  # its janitor leaves: nothing was started yet
            raise
        self.reaper.start()
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
        await self.reaper.close()
        await asyncio.gather(*(self.factory.stop_kernels(s) for s in self._sessions.values()))
        await self.host.fonts.close()
        for session in self._sessions.values():
            self.records.save(session)
        await asyncio.to_thread(self.store.close)  # after the writes queued
        self.host.close()

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
        existing = self._sessions.get(session_id)
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
                await self.records.save_options(session)
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
        session = self.session(session_id)
        await self._open(session)
        return session.info()

    async def _open(self, session: Session) -> None:
        await self.kernels.ensure(session, "python")
        session.open = True

    def exists(self, session_id: str) -> bool:
        return session_id in self._sessions

    def list_sessions(self) -> list[SessionInfo]:
        return [session.info() for session in self._sessions.values()]

    async def stop(self, session_id: str, *, only_open: bool = False) -> SessionInfo:
        """Stop the session's kernels and close it; its workspace and packages stay for a
        later start. With `only_open` (coderunner's stop), a closed session is not found."""
        session = self.session(session_id)
        if only_open and not session.open:
            raise SessionNotFound(session_id)
        session.open = False
        await self.factory.stop_kernels(session)
        self.records.save(session)
        return session.info()

    async def restart(self, session_id: str) -> SessionInfo:
        """Replace the session's kernels with fresh ones (variables are lost, files stay)."""
        session = self.session(session_id)
        languages = sorted(session.kernels) or ["python"]
        async with session.lock:
            await self.factory.stop_kernels(session)
            for language in languages:
                await self.kernels.ensure(session, language)
        return session.info()

    async def delete(self, session_id: str) -> None:
        """Stop the session and remove its workspace, packages and record."""
        session = self.session(session_id)
        await self.factory.stop_kernels(session)
        await self._forget(session)

    async def _forget(self, session: Session) -> None:
        """Remove a session whose kernels are stopped: its record, folders and egress."""
        if self.factory.egress is not None:
            await self.factory.egress.forget(session.id)
        self._sessions.pop(session.id, None)
        await self.records.forget(session.id)

    def _room(self) -> int:
        """How many more sessions may run (the warm pool fills no further)."""
        running = sum(1 for session in self._sessions.values() if session.running)
        return self.settings.max_sessions - running

    # -- helpers ---------------------------------------------------------------------------

    def note_refusal(self, session_id: str, refusal: NetRefusal) -> None:
        """A connection the proxy refused for `session_id`, for its running execution."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.note_refusal(refusal)

    def session_for(self, session_id: str | None, *, resume: bool = True) -> Session:
        """The named session, or the default one (registered on first use) for None.

        Raises `SessionNotFound`, or `SessionClosed` for a named session that was stopped
        when `resume` is False."""
        if session_id is None:
            if DEFAULT_SESSION not in self._sessions:  # made on first use, anywhere
                self._sessions[DEFAULT_SESSION] = self.records.made_now(DEFAULT_SESSION)
            return self._sessions[DEFAULT_SESSION]
        session = self.session(session_id)
        if not resume and not session.open:
            raise SessionClosed(session_id)
        return session

    def session(self, session_id: str) -> Session:
        """The session named `session_id`; raises `InvalidInput` for a malformed id and
        `SessionNotFound` for an unknown one."""
        session = self._sessions.get(validate_session_id(session_id))
        if session is None:
            raise SessionNotFound(session_id)
        return session

    async def _register(self, session_id: str) -> Session:
        record = await self.records.stored_new(session_id)
        if session_id in self._sessions:  # made meanwhile, by a call that did not wait
            raise SessionExists(session_id)
        session = self._sessions[session_id] = self.records.made(record)
        return session
