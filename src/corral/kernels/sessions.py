"""Sessions: a workspace, a package prefix and the kernels that share them.

A session's metadata is stored, so it is listed after a server restart (as stopped) and
resumes on first use with the same workspace and installed packages. Executions in one
session run one at a time, in arrival order; sessions run in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from corral.config import Settings
from corral.errors import (
    InvalidInput,
    KernelStartFailed,
    KernelUnreachable,
    SessionExists,
    SessionNotFound,
    TooManySessions,
)
from corral.kernels.execute import ExecutionLimits, OutputHook, run_code
from corral.kernels.kernel import SandboxedKernel
from corral.kernels.results import ExecutionResult
from corral.sandbox.bwrap import find_bwrap
from corral.sandbox.profile import (
    SessionPaths,
    default_policy,
    egress_launcher,
    write_identity_files,
)
from corral.sandbox.runtime import PythonRuntime, create_session_env, current_runtime
from corral.store import SessionRecord, Store, now

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
LANGUAGES = ("python", "bash")
DEFAULT_SESSION = "default"


class EgressSockets(Protocol):
    """Gives a session's proxy socket, listening; the network layer implements it."""

    async def socket_for(self, session_id: str) -> Path: ...

    async def forget(self, session_id: str) -> None: ...


def validate_session_id(value: object) -> str:
    """`value` if it is a valid session id; raises `InvalidInput` otherwise."""
    if not isinstance(value, str) or not SESSION_ID.fullmatch(value):
        raise InvalidInput(
            f"invalid session id {value!r}: use 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return value


def validate_language(value: object) -> str:
    if value not in LANGUAGES:
        raise InvalidInput(f"unknown language {value!r}: choose one of {', '.join(LANGUAGES)}")
    return str(value)


@dataclass(frozen=True)
class SessionInfo:
    """A snapshot of one session, for listing and for the APIs."""

    id: str
    state: str
    created_at: float
    last_used_at: float
    kernels: tuple[str, ...]
    workspace: Path

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "created_at": self.created_at,
            "last_used_at": self.last_used_at,
            "kernels": list(self.kernels),
        }


class Session:
    def __init__(self, record: SessionRecord, paths: SessionPaths) -> None:
        self.record = record
        self.paths = paths
        self.kernels: dict[str, SandboxedKernel] = {}
        self.lock = asyncio.Lock()
        self.starting = False
        self.failed: str | None = None
        self.lost: set[str] = set()  # languages whose kernel died since the last call
        self.current_call: tuple[asyncio.Task[Any], str] | None = None  # holds the lock

    @property
    def running(self) -> bool:
        return bool(self.kernels) or self.starting

    @property
    def state(self) -> str:
        if self.starting:
            return "starting"
        if self.lock.locked():
            return "busy"
        if self.kernels:
            return "idle"
        return "failed" if self.failed else "stopped"

    def info(self) -> SessionInfo:
        return SessionInfo(
            id=self.record.id,
            state=self.state,
            created_at=self.record.created_at,
            last_used_at=self.record.last_used_at,
            kernels=tuple(sorted(self.kernels)),
            workspace=self.paths.workspace,
        )


class SessionManager:
    """Owns every session of one server. Call `open()` first and `close()` at the end."""

    def __init__(
        self,
        settings: Settings,
        *,
        runtime: PythonRuntime | None = None,
        egress: EgressSockets | None = None,
    ) -> None:
        self.settings = settings
        self.egress = egress
        self.runtime = runtime or current_runtime()
        self.bwrap = find_bwrap(settings.bwrap)
        self.store = Store(settings.db_path)
        self.identity_dir = settings.state_dir / "sandbox-etc"
        self.sessions: dict[str, Session] = {}
        self.last_start_failure: str | None = None  # cleared by the next successful start
        self._reaper: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Load stored sessions (all stopped now) and start the idle reaper."""
        write_identity_files(self.identity_dir)
        self.settings.sessions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.store.mark_all_stopped()
        for record in self.store.all():
            record.state = "stopped"
            self.sessions[record.id] = Session(record, self._paths(record.id))
        self._reaper = asyncio.create_task(self._reap_forever(), name="corral-idle-reaper")

    async def close(self) -> None:
        """Stop every kernel; workspaces and records stay."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self._stop_kernels(s) for s in self.sessions.values()))
        for session in self.sessions.values():
            self._save(session)
        self.store.close()

    # -- lifecycle -----------------------------------------------------------------------

    async def create(self, session_id: str | None = None, *, start: bool = True) -> SessionInfo:
        """A new session (a generated id when none is given), started unless `start` is False."""
        session_id = validate_session_id(session_id) if session_id else _new_id()
        if session_id in self.sessions:
            raise SessionExists(session_id)
        session = self._register(session_id)
        if start:
            await self._ensure_kernel(session, "python")
        return session.info()

    async def start(self, session_id: str) -> SessionInfo:
        """Start a stopped session's python kernel again (same workspace and packages)."""
        session = self._get(session_id)
        await self._ensure_kernel(session, "python")
        return session.info()

    def get(self, session_id: str) -> SessionInfo:
        return self._get(session_id).info()

    def list_sessions(self) -> list[SessionInfo]:
        return [session.info() for session in self.sessions.values()]

    async def stop(self, session_id: str) -> SessionInfo:
        """Stop the session's kernels; its workspace and packages stay for a later start."""
        session = self._get(session_id)
        await self._stop_kernels(session)
        self._save(session)
        return session.info()

    async def restart(self, session_id: str) -> SessionInfo:
        """Replace the session's kernels with fresh ones (variables are lost, files stay)."""
        session = self._get(session_id)
        languages = sorted(session.kernels) or ["python"]
        async with session.lock:
            await self._stop_kernels(session)
            for language in languages:
                await self._ensure_kernel(session, language)
        return session.info()

    async def delete(self, session_id: str) -> None:
        """Stop the session and remove its workspace, packages and record."""
        session = self._get(session_id)
        await self._stop_kernels(session)
        if self.egress is not None:
            await self.egress.forget(session_id)
        del self.sessions[session_id]
        self.store.delete(session_id)
        shutil.rmtree(self.settings.sessions_dir / session_id, ignore_errors=True)

    # -- execution -----------------------------------------------------------------------

    async def execute(
        self,
        session_id: str | None,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        on_output: OutputHook | None = None,
    ) -> ExecutionResult:
        """Run `code` in the session (the default session when None), after earlier calls.

        Creates the default session on first use; a named session must exist.
        """
        language = validate_language(language)
        session = self.session_for(session_id)
        queued = time.monotonic()
        async with session.lock:
            session.current_call = (_current_task(), language)
            try:
                return await self._execute_locked(
                    session, code, language, timeout_s, on_output, queued
                )
            finally:
                session.current_call = None

    async def _execute_locked(
        self,
        session: Session,
        code: str,
        language: str,
        timeout_s: float | None,
        on_output: OutputHook | None,
        queued: float,
    ) -> ExecutionResult:
        result = ExecutionResult(language=language, session_id=session.record.id)
        result.queued_s = time.monotonic() - queued
        restarted = await self._ensure_kernel(session, language)
        limits = self.limits_for(timeout_s)
        try:
            outcome = await run_code(session.kernels[language], code, limits, result, on_output)
        except KernelUnreachable:
            # Nothing was sent: it is safe to try once more on a fresh kernel.
            await self._replace_kernel(session, language)
            restarted = True
            outcome = await run_code(session.kernels[language], code, limits, result, on_output)
        if not outcome.kernel_usable:
            await self._after_kernel_loss(session, language, outcome.result)
        outcome.result.kernel_restarted = outcome.result.kernel_restarted or restarted
        self._touch(session)
        return outcome.result

    async def cancel(self, task: asyncio.Future[Any]) -> None:
        """Stop an `execute` call whose caller went away.

        Still queued: nothing was sent, so the call is cancelled. Running: the kernel is
        interrupted and the call ends with its result as usual.
        """
        for session in self.sessions.values():
            call = session.current_call
            if call is not None and call[0] is task:
                kernel = session.kernels.get(call[1])
                if kernel is not None:
                    await kernel.interrupt()
                return
        task.cancel()

    def limits_for(self, timeout_s: float | None) -> ExecutionLimits:
        """The limits of one execution; raises `InvalidInput` for a timeout past the cap."""
        if timeout_s is not None and not 0 < timeout_s <= self.settings.exec_timeout_s:
            raise InvalidInput(
                f"timeout must be between 0 and {self.settings.exec_timeout_s:g} seconds"
            )
        return ExecutionLimits(
            timeout_s=timeout_s or self.settings.exec_timeout_s,
            grace_s=self.settings.interrupt_grace_s,
            max_output_bytes=self.settings.max_output_bytes,
        )

    async def _after_kernel_loss(
        self, session: Session, language: str, result: ExecutionResult
    ) -> None:
        """A dead kernel is cleared (the next call starts a fresh one); a stuck one replaced."""
        if result.status == "died":
            await self._drop_kernel(session, language)
            session.lost.add(language)
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
            await self._drop_kernel(session, language)
        await self._start_kernel(session, language)
        session.lost.discard(language)
        return lost

    async def _replace_kernel(self, session: Session, language: str) -> None:
        await self._drop_kernel(session, language)
        await self._start_kernel(session, language)

    async def _start_kernel(self, session: Session, language: str) -> None:
        if not session.running:
            self._check_capacity()
        session.starting = True
        try:
            create_session_env(session.paths.env, self.runtime)
            socket = None
            if self.egress is not None:
                socket = await self.egress.socket_for(session.record.id)
            policy = default_policy(
                self.runtime,
                session.paths,
                self.identity_dir,
                tmp_size_bytes=self.settings.tmp_size_bytes,
                home_size_bytes=self.settings.home_size_bytes,
                egress_socket=socket,
            )
            kernel = SandboxedKernel(
                language,
                policy,
                bwrap=self.bwrap,
                python=self.runtime.sandbox_python,
                run_root=self.settings.run_root,
                launcher=egress_launcher(self.runtime) if socket is not None else None,
            )
            await kernel.start(self.settings.kernel_start_timeout_s)
            session.kernels[language] = kernel
            session.failed = self.last_start_failure = None
        except Exception as exc:
            session.failed = str(exc)
            if isinstance(exc, KernelStartFailed):
                self.last_start_failure = str(exc)
            raise
        finally:
            session.starting = False
            self._save(session)

    def _check_capacity(self) -> None:
        running = sum(1 for session in self.sessions.values() if session.running)
        if running >= self.settings.max_sessions:
            raise TooManySessions(self.settings.max_sessions)

    async def _drop_kernel(self, session: Session, language: str) -> None:
        kernel = session.kernels.pop(language, None)
        if kernel is not None:
            await kernel.stop()

    async def _stop_kernels(self, session: Session) -> None:
        for language in list(session.kernels):
            await self._drop_kernel(session, language)

    # -- idle ------------------------------------------------------------------------------

    async def reap_idle(self) -> list[str]:
        """Stop the kernels of sessions unused for longer than the idle timeout."""
        cutoff = now() - self.settings.idle_timeout_s
        stopped = []
        for session in list(self.sessions.values()):
            idle = session.kernels and not session.lock.locked() and not session.starting
            if idle and session.record.last_used_at < cutoff:
                await self._stop_kernels(session)
                self._save(session)
                stopped.append(session.record.id)
        return stopped

    async def _reap_forever(self) -> None:
        interval = min(60.0, max(1.0, self.settings.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(interval)
            await self.reap_idle()

    # -- helpers ---------------------------------------------------------------------------

    def session_for(self, session_id: str | None) -> Session:
        """The named session, or the default one (registered on first use) for None."""
        if session_id is None:
            if DEFAULT_SESSION not in self.sessions:
                self._register(DEFAULT_SESSION)
            return self.sessions[DEFAULT_SESSION]
        return self._get(session_id)

    def _get(self, session_id: str) -> Session:
        session = self.sessions.get(validate_session_id(session_id))
        if session is None:
            raise SessionNotFound(session_id)
        return session

    def _register(self, session_id: str) -> Session:
        created = now()
        record = SessionRecord(session_id, created, created, "stopped")
        paths = self._paths(session_id)
        paths.workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
        session = Session(record, paths)
        self.sessions[session_id] = session
        self.store.put(record)
        return session

    def _paths(self, session_id: str) -> SessionPaths:
        root = self.settings.sessions_dir / session_id
        return SessionPaths(workspace=root / "workspace", env=root / "env")

    def _touch(self, session: Session) -> None:
        # Kept in memory on the hot path; written with the next state change or at close.
        session.record.last_used_at = now()

    def _save(self, session: Session) -> None:
        session.record.state = session.state
        self.store.put(session.record)


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("execute must run inside an asyncio task")
    return task


def _new_id() -> str:
    return "s-" + secrets.token_hex(4)
