"""The warm pool's hand-over: ready kernels started before anyone asks, given to sessions.

A pool slot is a `WarmSession`: a session-shaped holder (identity `@pool-N`, folders under
`sessions/.pool/`) of one ready python kernel with its own limit box and egress socket,
started by the kernel factory like any other. A session takes it by having the slot's
folders renamed into its own place; the sandbox's binds follow the directories, so nothing
inside changes. This module knows the factory and the pool, never the session registry: the
registry gives it `room` (how many more sessions may run).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from corral.config import Settings
from corral.kernels.factory import KernelFactory
from corral.kernels.pool import PoolConfig, WarmPool
from corral.kernels.session import Session
from corral.sandbox.profile import SessionPaths
from corral.store import SessionRecord, now

log = logging.getLogger(__name__)


@dataclass
class WarmSession:
    """A slot of the warm pool, until a session takes its kernel."""

    session: Session
    memory_bytes: int = 0  # the PSS of its sandbox when it became ready

    async def alive(self) -> bool:
        kernel = self.session.kernels.get("python")
        return kernel is not None and await kernel.is_alive()


class WarmHandOver:
    """The warm pool of one server and the hand-over of its kernels to fresh sessions."""

    def __init__(self, factory: KernelFactory, settings: Settings, room: Callable[[], int]) -> None:
        self.factory = factory
        self.settings = settings
        self.pool: WarmPool[WarmSession] = WarmPool(
            PoolConfig(
                settings.pool_size,
                settings.pool_memory_bytes,
                settings.pool_idle_s,
                settings.pool_refill_pause_s,
                settings.pool_max_size,
                parallel=len(os.sched_getaffinity(0)),
            ),
            self._spawn,
            self._discard,
            room,
        )

    @property
    def pool_dir(self) -> Path:
        return self.settings.sessions_dir / ".pool"  # never a session id: ids start alnum

    async def open(self) -> None:
        """Remove what a crashed server left of its pool, then start filling it."""
        await asyncio.to_thread(shutil.rmtree, self.pool_dir, True)
        self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    async def take(self, session: Session, language: str) -> bool:
        """Give `session` a ready pool kernel when its profile allows; False: start cold."""
        if not self._fits(session, language):
            return False
        warm = await self.pool.take()
        if warm is None:
            return False
        if not self._fits(session, language):
            self.pool.give_back(warm)  # the session changed while the pool was asked
            return False
        try:
            move_folders(warm.session.paths, session.paths)
            if self.factory.egress is not None:
                self.factory.egress.rename(warm.session.id, session.id)
        except (OSError, KeyError) as exc:
            log.warning("could not hand a pool kernel to session %s: %s", session.id, exc)
            session.paths.workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
            await self._discard(warm)
            return False
        self.factory.hand_over(warm.session, session)
        session.from_pool = True
        return True

    def _fits(self, session: Session, language: str) -> bool:
        """A pool kernel has the default profile: a fresh session that changed nothing."""
        return (
            language == "python"
            and session.run is None
            and not session.kernels
            and not session.options
            and session.limits == self.settings.limits
            and not session.paths.env.exists()
            and empty_or_missing(session.paths.workspace)
        )

    async def _spawn(self) -> WarmSession:
        """Start one pool kernel under its own identity, in its own folders."""
        slot = f"@pool-{secrets.token_hex(4)}"
        root = self.pool_dir / slot
        created = now()
        paths = SessionPaths(workspace=root / "workspace", env=root / "env")
        record = SessionRecord(slot, created, created, "stopped")
        warm = WarmSession(Session(record, paths, self.settings.limits, {}))
        try:
            paths.workspace.mkdir(mode=0o700, parents=True)
            await self.factory.launch(warm.session, "python")
            await warm.session.kernels["python"].prime(self.settings.kernel_start_timeout_s)
            sandbox = warm.session.run.sandbox if warm.session.run is not None else None
            pid = sandbox.pid if sandbox is not None else None
            warm.memory_bytes = await asyncio.to_thread(tree_pss, pid) if pid else 0
        except BaseException:
            await self._discard(warm)
            raise
        return warm

    async def _discard(self, warm: WarmSession) -> None:
        await self.factory.stop_kernels(warm.session)
        await self.factory.close_run(warm.session)
        if self.factory.egress is not None:
            await self.factory.egress.forget(warm.session.id)
        root = warm.session.paths.workspace.parent
        await asyncio.to_thread(shutil.rmtree, root, True)


def move_folders(warm: SessionPaths, session: SessionPaths) -> None:
    """Rename the slot's workspace and package prefix to the session's. The session's
    workspace must be empty; raises `OSError` (ENOTEMPTY when it has files)."""
    try:
        session.workspace.rmdir()
    except FileNotFoundError:
        session.workspace.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.rename(warm.workspace, session.workspace)
    os.rename(warm.env, session.env)
    with contextlib.suppress(OSError):
        warm.workspace.parent.rmdir()


def empty_or_missing(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except FileNotFoundError:
        return True


def tree_pss(pid: int) -> int:
    """The proportional set size of process `pid` and all its descendants."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.memory_full_info().pss
    return total
