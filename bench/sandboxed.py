"""Corral's side: a `SessionManager` on throw-away state, and sessions that clean up.

The manager is the one a `Service` owns, as in `corral serve`: every sandbox's spawner relays
egress for its kernels (the forwarder) and has a proxy socket on the host.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from corral.config import Settings
from corral.kernels.sessions import SessionManager
from corral.service import Service


def bench_settings(
    workdir: Path, run_root: Path, *, pool: bool = False, **overrides: Any
) -> Settings:
    """Default settings with state under `workdir` and kernel sockets under `run_root`.

    `overrides` are other `Settings` fields. The warm pool is off unless `pool` is true
    (then it has its default size): a pool refilling in the background would start kernels
    during other measurements.
    """
    fields: dict[str, Any] = overrides if pool else {"pool_size": 0, **overrides}
    return Settings(state_dir=workdir / "state", run_root=run_root, **fields)


@asynccontextmanager
async def corral_manager(
    workdir: Path, *, pool: bool = False, **overrides: Any
) -> AsyncIterator[SessionManager]:
    """The opened `SessionManager` of a `Service` whose state lives in `workdir/state`.

    `pool` and `overrides` are as in `bench_settings`. Its run root is a new short
    directory in /tmp (unix socket paths must stay under 108 bytes). On exit every kernel is
    stopped and the run root and state are removed.
    """
    run_root = Path(tempfile.mkdtemp(prefix="crb", dir="/tmp"))
    settings = bench_settings(workdir, run_root, pool=pool, **overrides)
    try:
        async with Service(settings) as service:
            yield service.sessions
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
        shutil.rmtree(settings.state_dir, ignore_errors=True)


def new_session_id() -> str:
    """A session id no other bench session uses."""
    return "bench-" + secrets.token_hex(4)


@asynccontextmanager
async def corral_session(manager: SessionManager) -> AsyncIterator[str]:
    """A fresh session id, not created yet; on exit the session is deleted if it exists."""
    session_id = new_session_id()
    try:
        yield session_id
    finally:
        if manager.exists(session_id):
            await manager.delete(session_id)


def sandbox_pid(manager: SessionManager, session_id: str) -> int:
    """The host pid of the outer bwrap process of the session's sandbox, which holds its
    python kernel (with the spawner that started it, which also relays egress).

    Raises `RuntimeError` when the session has no running python kernel.
    """
    kernel = manager.session(session_id).kernels.get("python")
    process = kernel.sandbox.process if kernel is not None else None
    if process is None:
        raise RuntimeError(f"session {session_id} has no running python kernel")
    return process.pid
