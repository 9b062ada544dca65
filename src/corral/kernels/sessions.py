"""Sessions: a workspace, a package prefix and the kernels that share them.

A session's metadata is stored, so it is listed after a server restart (as stopped) and
resumes on first use with the same workspace and installed packages. Executions in one
session run one at a time, in arrival order; sessions run in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from corral.config import Settings
from corral.errors import (
    InvalidInput,
    KernelStartFailed,
    KernelUnreachable,
    SandboxError,
    SessionExists,
    SessionNotFound,
    ShuttingDown,
    TooManySessions,
)
from corral.kernels.execute import ExecutionLimits, OutputHook, run_code
from corral.kernels.kernel import SandboxedKernel
from corral.kernels.limit_hits import attribute_limit, counters
from corral.kernels.pool import PoolConfig, WarmPool
from corral.kernels.projects import PreparedMount, choose_mounts, prepare_mounts
from corral.kernels.results import ExecutionResult
from corral.kernels.run import SessionRun, open_bridge
from corral.kernels.warm import WarmSession, empty_or_missing, move_folders, tree_pss
from corral.mounts import configured_mounts, overlapping
from corral.protect import validate_protected_names
from corral.sandbox.boxes import LimitBox, make_box, sweep_stale_v1
from corral.sandbox.bwrap import find_bwrap
from corral.sandbox.disk import DiskWatch
from corral.sandbox.limits import LIVE_LIMITS, Limits, choose_mechanism, enforcement
from corral.sandbox.profile import (
    SessionPaths,
    default_policy,
    egress_launcher,
    forwarded_env,
    skill_binds,
    write_identity_files,
)
from corral.sandbox.runtime import PythonRuntime, create_session_env, current_runtime
from corral.store import SessionRecord, Store, now

log = logging.getLogger(__name__)
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
LANGUAGES = ("python", "bash")
DEFAULT_SESSION = "default"


class EgressSockets(Protocol):
    """Gives a session's proxy socket, listening; the network layer implements it."""

    async def socket_for(self, session_id: str) -> Path: ...

    async def forget(self, session_id: str) -> None: ...

    def rename(self, old_id: str, new_id: str) -> None: ...


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
    mounts: tuple[str, ...] = ()
    from_pool: bool = False  # its python kernel came ready from the warm pool

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "created_at": self.created_at,
            "last_used_at": self.last_used_at,
            "kernels": list(self.kernels),
            "mounts": list(self.mounts),
            "from_pool": self.from_pool,
        }


class Session:
    def __init__(
        self, record: SessionRecord, paths: SessionPaths, limits: Limits, options: dict[str, Any]
    ) -> None:
        self.record = record
        self.paths = paths
        self.limits = limits
        self.options = options  # what the operator chose: limit changes, mounts, bridge
        self.run: SessionRun | None = None  # while any kernel runs
        self.disk = DiskWatch([paths.workspace, paths.env], lambda: self.limits.workspace_bytes)
        self.kernels: dict[str, SandboxedKernel] = {}
        self.lock = asyncio.Lock()
        self.starting = False
        self.failed: str | None = None
        self.lost: set[str] = set()  # languages whose kernel died since the last call
        self.current_call: tuple[asyncio.Task[Any], str] | None = None  # holds the lock
        self.from_pool = False

    @property
    def box(self) -> LimitBox | None:
        return self.run.box if self.run is not None else None

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
            mounts=tuple(self.options.get("mounts", ())),
            from_pool=self.from_pool,
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
        defaults = settings.default_limits()
        defaults.changed(defaults.to_dict())  # the configured limits pass the same checks
        self.mechanism = choose_mechanism(settings.limit_mechanism)
        self.forward_names = settings.forwarded_names
        self.mounts = configured_mounts(settings)
        self.protected_extra = validate_protected_names(settings.protected_names)
        self.skill_binds = skill_binds(settings)
        # Called as (kind, session, action, detail) for the audit log: "bridge", "protected".
        self.on_event: Callable[[str, str, str, dict[str, Any]], None] | None = None
        self.store = Store(settings.db_path)
        self.identity_dir = settings.state_dir / "sandbox-etc"
        self.sessions: dict[str, Session] = {}
        self.last_start_failure: str | None = None  # cleared by the next successful start
        self._reaper: asyncio.Task[None] | None = None
        self.closing = False  # set by begin_shutdown: no new execution starts
        self._interrupts: set[asyncio.Task[None]] = set()
        self.pool: WarmPool[WarmSession] = WarmPool(
            PoolConfig(settings.pool_size, settings.pool_memory_bytes, settings.pool_idle_s),
            self._spawn_warm,
            self._discard_warm,
            self._room,
        )

    async def open(self) -> None:
        """Load stored sessions (all stopped now) and start the idle reaper."""
        if self.mechanism.name == "cgroup1" and self.mechanism.path is not None:
            await asyncio.to_thread(sweep_stale_v1, self.mechanism.path)
        write_identity_files(self.identity_dir)
        self.settings.sessions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.store.mark_all_stopped()
        options = self.store.options()
        for record in self.store.all():
            record.state = "stopped"
            self.sessions[record.id] = self._session(record, options.get(record.id, {}))
        self._reaper = asyncio.create_task(self._reap_forever(), name="corral-idle-reaper")
        await asyncio.to_thread(shutil.rmtree, self._pool_dir, True)  # left by a crash
        self.pool.start()

    async def close(self) -> None:
        """Stop every kernel; workspaces and records stay."""
        await self.pool.close()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self._stop_kernels(s) for s in self.sessions.values()))
        for session in self.sessions.values():
            self._save(session)
        self.store.close()

    # -- lifecycle -----------------------------------------------------------------------

    async def create(
        self, session_id: str | None = None, *, start: bool = True, mounts: Sequence[str] = ()
    ) -> SessionInfo:
        """A new session (a generated id when none is given), started unless `start` is False.

        `mounts` names some of the operator's project mounts (never a path); raises
        `InvalidInput` for one the operator did not configure.
        """
        session_id = validate_session_id(session_id) if session_id else _new_id()
        if session_id in self.sessions:
            raise SessionExists(session_id)
        chosen = choose_mounts(mounts, self.mounts)
        session = self._register(session_id)
        if chosen:
            session.options["mounts"] = chosen
            self.store.put_options(session_id, session.options)
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
            if self.closing:
                raise ShuttingDown(
                    "the server is shutting down and did not run this code; send it again "
                    "once the server is back"
                )
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
        limits = self.limits_for(timeout_s, session)
        session.disk.begin()
        before = counters(session.box)
        try:
            outcome = await run_code(session.kernels[language], code, limits, result, on_output)
        except KernelUnreachable:
            # Nothing was sent: it is safe to try once more on a fresh kernel.
            await self._replace_kernel(session, language)
            restarted = True
            outcome = await run_code(session.kernels[language], code, limits, result, on_output)
        attribute_limit(outcome.result, before, counters(session.box), session.limits)
        if not outcome.kernel_usable:
            await self._after_kernel_loss(session, language, outcome.result)
        outcome.result.kernel_restarted = outcome.result.kernel_restarted or restarted
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

    def limits_for(
        self, timeout_s: float | None, session: Session | None = None
    ) -> ExecutionLimits:
        """The limits of one execution; raises `InvalidInput` for a timeout past the cap."""
        limits = session.limits if session is not None else self.settings.default_limits()
        if timeout_s is not None and not 0 < timeout_s <= limits.exec_timeout_s:
            raise InvalidInput(f"timeout must be between 0 and {limits.exec_timeout_s:g} seconds")
        return ExecutionLimits(
            timeout_s=timeout_s or limits.exec_timeout_s,
            grace_s=self.settings.interrupt_grace_s,
            max_output_bytes=limits.output_bytes,
            guard=session.disk if session is not None else None,
        )

    def set_bridge(self, session_id: str, enabled: bool) -> dict[str, Any]:
        """Enable or disable the SSH agent bridge of a session (operator only).

        It takes effect when the session's kernels next start; the answer says whether a
        restart is needed.
        """
        session = self._get(session_id)
        session.options["bridge"] = enabled
        self.store.put_options(session.record.id, session.options)
        active = session.run is not None and session.run.bridge is not None
        return {
            "session_id": session.record.id,
            "ssh_agent": enabled,
            "active": active,
            "restart_needed": session.run is not None and active != enabled,
        }

    # -- limits ----------------------------------------------------------------------------

    def get_limits(self, session_id: str) -> dict[str, Any]:
        """The session's limits, what enforces them, and its usage while it runs."""
        session = self._get(session_id)
        box = session.box
        usage = None
        if box is not None:
            current = box.usage()
            usage = {"memory_bytes": current.memory_bytes, "tasks": current.tasks}
        return {
            "session_id": session.record.id,
            "limits": session.limits.to_dict(),
            "mechanism": self.mechanism.name,
            "enforcement": enforcement(self.mechanism.name),
            "usage": usage,
            "workspace_bytes_used": session.disk.usage,
        }

    def set_limits(self, session_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Change a session's limits (operator only); running sandboxes change at once.

        Raises `InvalidInput` for an unknown or bad value, `LimitRefused` when the kernel
        refuses (memory below what is in use). Limits that cannot change a running sandbox
        (the tmpfs size) apply from its next start.
        """
        session = self._get(session_id)
        new = session.limits.changed(changes)
        deferred: set[str] = set()
        if session.box is not None:
            deferred = session.box.apply(new)
        session.limits = new
        overrides = dict(session.options.get("limits", {}))
        overrides.update({name: getattr(new, name) for name in changes})
        session.options["limits"] = overrides
        self.store.put_options(session.record.id, session.options)
        report = self.get_limits(session_id)
        running = session.box is not None
        live = {n for n in changes if running and n in LIVE_LIMITS and n not in deferred}
        report["changed_now"] = sorted(live)
        report["changed_at_next_start"] = sorted(set(changes) - live)
        return report

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
            if not await self._take_warm(session, language):
                await self._launch(session, language)
            session.failed = self.last_start_failure = None
        except Exception as exc:
            session.failed = str(exc)
            if isinstance(exc, KernelStartFailed):
                self.last_start_failure = str(exc)
            raise
        finally:
            session.starting = False
            if not session.kernels:
                await self._close_run(session)
            self._save(session)

    async def _launch(self, session: Session, language: str) -> None:
        """Start a kernel cold: package prefix, egress socket, the run, then the sandbox."""
        session.from_pool = False
        create_session_env(session.paths.env, self.runtime)
        socket = None
        if self.egress is not None:
            socket = await self.egress.socket_for(session.record.id)
        run = await self._open_run(session)
        kernel = self._new_kernel(session, language, run, socket)
        await self._start_beside_siblings(session, run, kernel)
        session.kernels[language] = kernel

    # -- the warm pool ---------------------------------------------------------------------

    @property
    def _pool_dir(self) -> Path:
        return self.settings.sessions_dir / ".pool"  # never a session id: ids start alnum

    def _room(self) -> int:
        running = sum(1 for session in self.sessions.values() if session.running)
        return self.settings.max_sessions - running

    async def _spawn_warm(self) -> WarmSession:
        """Start one pool kernel under its own identity, in its own folders."""
        slot = f"@pool-{secrets.token_hex(4)}"
        root = self._pool_dir / slot
        created = now()
        paths = SessionPaths(workspace=root / "workspace", env=root / "env")
        session = Session(
            SessionRecord(slot, created, created, "stopped"),
            paths,
            self.settings.default_limits(),
            {},
        )
        warm = WarmSession(session)
        try:
            paths.workspace.mkdir(mode=0o700, parents=True)
            await self._launch(session, "python")
            pid = session.kernels["python"].pid
            warm.memory_bytes = await asyncio.to_thread(tree_pss, pid) if pid else 0
        except BaseException:
            await self._discard_warm(warm)
            raise
        return warm

    async def _discard_warm(self, warm: WarmSession) -> None:
        await self._stop_kernels(warm.session)
        await self._close_run(warm.session)
        if self.egress is not None:
            await self.egress.forget(warm.session.record.id)
        root = warm.session.paths.workspace.parent
        await asyncio.to_thread(shutil.rmtree, root, True)

    def _fits_pool(self, session: Session, language: str) -> bool:
        """A pool kernel has the default profile: a fresh session that changed nothing."""
        return (
            language == "python"
            and session.run is None
            and not session.kernels
            and not session.options
            and session.limits == self.settings.default_limits()
            and not session.paths.env.exists()
            and empty_or_missing(session.paths.workspace)
        )

    async def _take_warm(self, session: Session, language: str) -> bool:
        """Give `session` a ready pool kernel when its profile allows; False: start cold."""
        if not self._fits_pool(session, language):
            return False
        warm = await self.pool.take()
        if warm is None:
            return False
        if not self._fits_pool(session, language):
            self.pool.give_back(warm)  # the session changed while the pool was asked
            return False
        try:
            move_folders(warm.session.paths, session.paths)
            if self.egress is not None:
                self.egress.rename(warm.session.record.id, session.record.id)
        except (OSError, KeyError) as exc:
            log.warning("could not hand a pool kernel to session %s: %s", session.record.id, exc)
            session.paths.workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
            await self._discard_warm(warm)
            return False
        session.run, warm.session.run = warm.session.run, None
        session.kernels.update(warm.session.kernels)
        warm.session.kernels.clear()
        session.from_pool = True
        return True

    def _new_kernel(
        self, session: Session, language: str, run: SessionRun, socket: Path | None
    ) -> SandboxedKernel:
        extras = run.extras(self.runtime.sandbox_python)
        policy = default_policy(
            self.runtime,
            session.paths,
            self.identity_dir,
            tmp_size_bytes=session.limits.tmp_bytes,
            home_size_bytes=self.settings.home_size_bytes,
            egress_socket=socket,
            forward_env=forwarded_env(self.forward_names, dict(os.environ)) + extras.env,
            extra_binds=self.skill_binds + extras.binds,
        )
        launcher = [*extras.launcher]
        if socket is not None:
            launcher += egress_launcher(self.runtime)
        return SandboxedKernel(
            language,
            policy,
            bwrap=self.bwrap,
            python=self.runtime.sandbox_python,
            run_root=self.settings.run_root,
            launcher=launcher or None,
            box=run.box,
        )

    async def _start_beside_siblings(
        self, session: Session, run: SessionRun, kernel: SandboxedKernel
    ) -> None:
        """Start `kernel`; with protected mounts, the session's other kernels stay frozen
        (and the protected paths are checked again) until its sandbox is set up."""
        guard = run.protects and bool(session.kernels)
        if guard:
            await asyncio.to_thread(run.box.freeze)
        try:
            if guard:
                await asyncio.to_thread(run.verify_mounts)
            await kernel.start(self.settings.kernel_start_timeout_s)
        finally:
            if guard:
                await asyncio.to_thread(run.box.thaw)

    async def _open_run(self, session: Session) -> SessionRun:
        """The session's run, opened with its first kernel: limit box, bridge, mounts."""
        if session.run is not None:
            return session.run
        box = make_box(self.mechanism, session.record.id, session.limits)
        run = SessionRun(box, asyncio.create_task(box.watch(), name="corral-limit-watchdog"))
        try:
            await asyncio.to_thread(box.create)
            if session.options.get("bridge"):
                hook = functools.partial(self._bridge_used, session.record.id)
                run.bridge, run.bridge_dir = await open_bridge(self.settings.run_root, hook)
            run.mounts = await asyncio.to_thread(self._prepare_mounts, session)
        except BaseException:
            await run.close()
            raise
        session.run = run
        return run

    def _prepare_mounts(self, session: Session) -> list[PreparedMount]:
        names = session.options.get("mounts", [])
        missing = [name for name in names if name not in self.mounts]
        if missing:
            raise InvalidInput(
                f"session {session.record.id!r} uses mount {missing[0]!r}, which the operator "
                "no longer configures"
            )
        return prepare_mounts(
            [self.mounts[name] for name in names],
            session.paths.workspace,
            self.settings.sessions_dir / session.record.id / "protected",
            self.protected_extra,
            functools.partial(self._rw_holder, session.record.id),
        )

    def _rw_holder(self, session_id: str, path: Path) -> str | None:
        """Another running session holding a folder overlapping `path` read-write."""
        for other in self.sessions.values():
            if other.record.id == session_id or other.run is None:
                continue
            for mount in other.run.mounts:
                if mount.spec.writable and overlapping(mount.spec.path, path):
                    return other.record.id
        return None

    async def _close_run(self, session: Session) -> None:
        run, session.run = session.run, None
        if run is None:
            return
        changed = await run.close()
        copies = self.settings.sessions_dir / session.record.id / "protected"
        await asyncio.to_thread(shutil.rmtree, copies, True)
        if changed:
            log.warning(
                "session %s changed or created protected files: %s",
                session.record.id,
                ", ".join(changed),
            )
            self._emit("protected", session.record.id, "changed", {"names": changed})

    def _bridge_used(self, session_id: str, service: str, outcome: str) -> None:
        self._emit("bridge", session_id, outcome, {"service": service})

    def _emit(self, kind: str, session_id: str, action: str, detail: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(kind, session_id, action, detail)

    def _check_capacity(self) -> None:
        running = sum(1 for session in self.sessions.values() if session.running)
        if running >= self.settings.max_sessions:
            raise TooManySessions(self.settings.max_sessions)

    async def _drop_kernel(self, session: Session, language: str) -> None:
        kernel = session.kernels.pop(language, None)
        if kernel is not None:
            await kernel.stop()
            if session.box is not None and kernel.pid is not None:
                session.box.forget(kernel.pid)
        if not session.kernels and not session.starting:
            await self._close_run(session)

    async def _stop_kernels(self, session: Session) -> None:
        for language in list(session.kernels):
            await self._drop_kernel(session, language)

    # -- idle ------------------------------------------------------------------------------

    async def reap_idle(self) -> list[str]:
        """Stop the kernels of sessions unused for longer than the idle timeout."""
        stopped = []
        for session in list(self.sessions.values()):
            idle = session.kernels and not session.lock.locked() and not session.starting
            if idle and session.record.last_used_at < now() - session.limits.idle_timeout_s:
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
        self.store.put(record)  # first: a refused write leaves no half-made session
        session = self._session(record, {})
        session.paths.workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.sessions[session_id] = session
        return session

    def _session(self, record: SessionRecord, options: dict[str, Any]) -> Session:
        limits = self.settings.default_limits()
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
        """Store the session's state. A refused write (database locked, disk full) is logged:
        the record is written again at its next change and at close, and every session is
        stopped at the next start anyway, so the caller's action stands."""
        session.record.state = session.state
        try:
            self.store.put(session.record)
        except SandboxError as exc:
            log.warning("could not store the state of session %s: %s", session.record.id, exc)


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("execute must run inside an asyncio task")
    return task


def _new_id() -> str:
    return "s-" + secrets.token_hex(4)
