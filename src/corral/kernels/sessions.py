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
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from corral.config import Settings
from corral.errors import (
    InvalidInput,
    KernelStartFailed,
    KernelUnreachable,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    ShuttingDown,
    TooManySessions,
)
from corral.kernels.disk_patrol import DiskPatrol
from corral.kernels.execute import BeforeSend, ExecutionLimits, OutputHook, run_code
from corral.kernels.factory import EgressSockets, EventHook, KernelFactory
from corral.kernels.limit_hits import attribute_limit, counters
from corral.kernels.pool import WarmPool
from corral.kernels.projects import choose_mounts
from corral.kernels.results import ExecutionResult, NetRefusal
from corral.kernels.session import DEFAULT_SESSION as DEFAULT_SESSION
from corral.kernels.session import Session as Session
from corral.kernels.session import SessionInfo as SessionInfo
from corral.kernels.session import check_timeout as check_timeout
from corral.kernels.session import new_session_id
from corral.kernels.session import validate_language as validate_language
from corral.kernels.session import validate_session_id as validate_session_id
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
        self.last_start_failure: str | None = None  # cleared by the next successful start
        self._reaper: asyncio.Task[None] | None = None
        self.disk_patrol = DiskPatrol(lambda: list(self.sessions.values()), self._drop_lost_kernel)
        self.closing = False  # set by begin_shutdown: no new execution starts
        self._interrupts: set[asyncio.Task[bool]] = set()

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
            self._check_capacity()
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
        await self._ensure_kernel(session, "python")
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
                await self._ensure_kernel(session, language)
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

    # -- execution -----------------------------------------------------------------------

    async def execute(
        self,
        session: Session,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        on_output: OutputHook | None = None,
        before_send: BeforeSend | None = None,
    ) -> ExecutionResult:
        """Run `code` in `session` (from `session_for`), after its earlier calls; the
        language and the timeout were checked by the caller (`Service.start_execution`).

        `before_send` is called once, just before the code goes to the kernel; what it
        raises stops the call there, with nothing sent.
        """
        queued = time.monotonic()
        async with session.turn():
            if self.closing:
                raise ShuttingDown(
                    "the server is shutting down and did not run this code; send it again "
                    "once the server is back"
                )
            session.current_call = (_current_task(), language)
            try:
                return await self._execute_locked(
                    session, code, language, timeout_s, (on_output, before_send), queued
                )
            finally:
                session.current_call = None

    async def _execute_locked(
        self,
        session: Session,
        code: str,
        language: str,
        timeout_s: float | None,
        hooks: tuple[OutputHook | None, BeforeSend | None],
        queued: float,
    ) -> ExecutionResult:
        result = ExecutionResult(language=language, session_id=session.record.id)
        result.queued_s = time.monotonic() - queued
        restarted = await self._kernel_for_call(session, language)
        session.open = True
        limits = self.limits_for(timeout_s, session)
        session.disk.begin()
        before = counters(session.box)
        session.refused = []
        try:
            outcome = await run_code(session.kernels[language], code, limits, result, *hooks)
        except KernelUnreachable:
            # Nothing was sent: it is safe to try once more on a fresh kernel.
            await self._replace_kernel(session, language)
            restarted = True
            outcome = await run_code(session.kernels[language], code, limits, result, *hooks)
        finally:
            result.network_refused, session.refused = session.refused or [], None
        session.disk.ended()
        outcome.result.limit = outcome.result.limit or session.disk.stopped()
        attribute_limit(outcome.result, before, counters(session.box), session.limits)
        if not outcome.kernel_usable:
            await self._after_kernel_loss(session, language, outcome.result)
        outcome.result.kernel_restarted = outcome.result.kernel_restarted or restarted
        if session.notes:
            _add_notes(outcome.result, session.notes)
            session.notes = []
        if self.closing and outcome.result.status == "interrupted":
            note = "interrupted because the server is shutting down"
            message = outcome.result.message
            outcome.result.message = f"{note}; {message}" if message else note
        self._touch(session)
        return outcome.result

    def begin_shutdown(self) -> None:
        """Refuse executions not yet started and interrupt the running ones, which then end
        with their result (status interrupted) before the server closes."""
        self.closing = True
        for session in self.sessions.values():
            call = session.current_call
            kernel = session.kernels.get(call[1]) if call is not None else None
            if kernel is not None:
                task = asyncio.create_task(kernel.interrupt())
                self._interrupts.add(task)
                task.add_done_callback(self._interrupts.discard)

    async def cancel(self, task: asyncio.Future[Any]) -> None:
        """Stop an `execute` call whose caller went away.

        Still queued, or its kernel still starting: nothing was sent, so the call is
        cancelled. Running: the kernel is interrupted and the call ends with its result as
        usual.
        """
        for session in self.sessions.values():
            call = session.current_call
            if call is not None and call[0] is task:
                kernel = session.kernels.get(call[1])
                if kernel is not None and not session.starting:
                    await kernel.interrupt()
                    return
                break
        task.cancel()

    def limits_for(
        self, timeout_s: float | None, session: Session | None = None
    ) -> ExecutionLimits:
        """The limits of one execution: a timeout past the session's cap is cut to the cap
        (the result says so if it strikes); the timeout was checked (`check_timeout`)."""
        limits = session.limits if session is not None else self.settings.limits
        cap = limits.exec_timeout_s
        return ExecutionLimits(
            timeout_s=min(timeout_s or cap, cap),
            asked_s=timeout_s if timeout_s is not None and timeout_s > cap else None,
            grace_s=self.settings.interrupt_grace_s,
            max_output_bytes=limits.output_bytes,
            guard=session.disk if session is not None else None,
        )

    async def _drop_lost_kernel(self, session: Session, language: str) -> None:
        """Stop a kernel the server had to end; the next call says it was restarted."""
        await self.factory.drop_kernel(session, language)
        session.lost.add(language)

    async def _after_kernel_loss(
        self, session: Session, language: str, result: ExecutionResult
    ) -> None:
        """A dead kernel is cleared (the next call starts a fresh one); a stuck one replaced."""
        if result.status == "died":
            await self._drop_lost_kernel(session, language)
            return
        await self._replace_kernel(session, language)
        result.kernel_restarted = True

    # -- kernels -------------------------------------------------------------------------

    async def _ensure_kernel(self, session: Session, language: str) -> bool:
        """Make sure a live kernel runs; True when one had to be (re)started after a loss."""
        kernel = session.kernels.get(language)
        if kernel is not None and await kernel.is_alive():
            return False
        lost = kernel is not None or language in session.lost
        if kernel is not None:
            await self.factory.drop_kernel(session, language)
        await self._start_kernel(session, language)
        session.lost.discard(language)
        return lost

    async def _kernel_for_call(self, session: Session, language: str) -> bool:
        """A kernel for a call, started when there is none; True when that replaces one the
        session lost. A kernel that died is found by `run_code`, which asks once, just
        before the code would be sent (`KernelUnreachable`)."""
        if language in session.kernels:
            return False
        lost = language in session.lost
        await self._start_kernel(session, language)
        session.lost.discard(language)
        return lost

    async def _replace_kernel(self, session: Session, language: str) -> None:
        await self.factory.drop_kernel(session, language)
        await self._start_kernel(session, language)

    async def _start_kernel(self, session: Session, language: str) -> None:
        if not session.running:
            self._check_capacity()
        session.starting = True
        try:
            if not await self.warm.take(session, language):
                await self.factory.launch(session, language)
            session.disk.rebase()  # what was there before the start is no growth
            session.failed = self.last_start_failure = None
        except Exception as exc:
            session.failed = str(exc)
            if isinstance(exc, KernelStartFailed):
                self.last_start_failure = str(exc)
            raise
        finally:
            session.starting = False
            if not session.kernels:
                await self.factory.close_run(session)
            self._save(session)

    def _room(self) -> int:
        """How many more sessions may run (the warm pool fills no further)."""
        running = sum(1 for session in self.sessions.values() if session.running)
        return self.settings.max_sessions - running

    def _check_capacity(self) -> None:
        if self._room() <= 0:
            raise TooManySessions(self.settings.max_sessions)

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


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("execute must run inside an asyncio task")
    return task


def _add_notes(result: ExecutionResult, notes: list[str]) -> None:
    """Tell the agent, once, what happened to its session since the last result."""
    note = "; ".join(notes)
    result.message = f"{result.message}; {note}" if result.message else note
