"""What the session manager needs to hand a warm pool kernel to a session.

A pool slot is a `WarmSession`: a session-shaped holder (identity `@pool-N`, folders under
`sessions/.pool/`) of one ready python kernel with its own limit box and egress socket. A
session takes it by having the slot's folders renamed into its own place; the sandbox's
binds follow the directories, so nothing inside changes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from corral.sandbox.profile import SessionPaths

if TYPE_CHECKING:
    from corral.kernels.sessions import Session


@dataclass
class WarmSession:
    """A slot of the warm pool, until a session takes its kernel."""

    session: Session
    memory_bytes: int = 0  # the PSS of its sandbox when it became ready

    async def alive(self) -> bool:
        kernel = self.session.kernels.get("python")
        return kernel is not None and await kernel.is_alive()


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
