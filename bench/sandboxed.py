"""Corral's side: a `SessionManager` on throw-away state, and sessions that clean up."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from corral.config import Settings
from corral.kernels.sessions import SessionManager


def bench_settings(workdir: Path, run_root: Path) -> Settings:
    """Default settings with state under `workdir` and kernel sockets under `run_root`."""
    return Settings(state_dir=workdir / "state", run_root=run_root)


@asynccontextmanager
async def corral_manager(workdir: Path) -> AsyncIterator[SessionManager]:
    """An opened `SessionManager` whose state lives in `workdir/state`.

    Its run root is a new short directory in /tmp (unix socket paths must stay under 108
    bytes). On exit every kernel is stopped and the run root and state are removed.
    """
    run_root = Path(tempfile.mkdtemp(prefix="crb", dir="/tmp"))
    manager: SessionManager | None = None
    try:
        manager = SessionManager(bench_settings(workdir, run_root))
        await manager.open()
        yield manager
    finally:
        try:
            if manager is not None:
                await manager.close()
        finally:
            shutil.rmtree(run_root, ignore_errors=True)
            shutil.rmtree(workdir / "state", ignore_errors=True)


@asynccontextmanager
async def corral_session(manager: SessionManager) -> AsyncIterator[str]:
    """A fresh session id, not created yet; on exit the session is deleted if it exists."""
    session_id = "bench-" + secrets.token_hex(4)
    try:
        yield session_id
    finally:
        if session_id in manager.sessions:
            await manager.delete(session_id)


def kernel_pid(manager: SessionManager, session_id: str) -> int:
    """The host pid of the outer bwrap process of the session's python kernel.

    Raises `RuntimeError` when the session has no running python kernel.
    """
    kernel = manager.sessions[session_id].kernels.get("python")
    pid = kernel.pid if kernel is not None else None
    if pid is None:
        raise RuntimeError(f"session {session_id} has no running python kernel")
    return pid
