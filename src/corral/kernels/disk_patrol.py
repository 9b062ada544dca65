"""The disk patrol: one task that watches every running session's disk use, busy or idle.

Every `TICK_S` it reads the free space and inodes of the filesystems sessions write to (a
few statvfs calls) and looks, in a thread, at each session that is due (`DiskWatch.due`).
A look past the limit stops what writes, at once and whether code runs or not:

- the agent's processes that wrote since the look before, each with its branch of the
  process tree (`corral.sandbox.writers`), are killed;
- running code whose kernel wrote itself is interrupted; so is any running code the limit
  stops a second time (it starts writers again), and its kernel is killed at the third;
  its result names the disk limit in any case;
- a kernel that wrote while no code of it ran (a background thread), or whose branches had
  to be killed twice in one idle period, is killed; its next call starts a fresh kernel and
  says why.

What was stopped is told in the session's next result (`Session.notes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterable

from corral.kernels.kernel import SandboxedKernel
from corral.kernels.session import Session
from corral.sandbox import writers
from corral.sandbox.disk import BUSY_S, TICK_S, DiskWatch, Hit, free_space
from corral.sandbox.limits import format_size

log = logging.getLogger(__name__)


DropKernel = Callable[[Session, str], Awaitable[None]]


class DiskPatrol:
    """`drop` stops one of a session's kernels for good (its next call starts a fresh one)."""

    def __init__(
        self, sessions: Callable[[], Iterable[Session]], drop: DropKernel, grace_s: float
    ) -> None:
        self.sessions = sessions
        self.drop = drop
        self.grace_s = grace_s

    async def run(self) -> None:
        while True:
            watched = [session for session in self.sessions() if session.kernels]
            await asyncio.sleep(TICK_S if watched else BUSY_S)
            try:
                await self.tick(watched)
            except Exception:  # one bad look must not end the patrol
                log.exception("the disk patrol's look failed")

    async def tick(self, watched: list[Session]) -> None:
        devices: dict[int, str] = {}
        for session in watched:
            devices.update(session.disk.devices)
        free, now = free_space(devices), time.monotonic()
        due = [s for s in watched if s.disk.due(now, s.lock.locked(), free)]
        if not due:
            return
        hits = await asyncio.to_thread(_look_all, [session.disk for session in due])
        for session, hit in zip(due, hits, strict=True):
            if hit is not None and session.kernels:
                await self.stop_writers(session, hit)

    async def stop_writers(self, session: Session, hit: Hit) -> None:
        """Stop what wrote past the limit (see the module); notes what was stopped."""
        culprits = writers.find_culprits(hit.writers)
        killed = writers.kill_branches(culprits.branches)
        session.disk.strikes += 1
        running = _running_kernel(session)
        stopped: list[str] = []
        for language, kernel in list(session.kernels.items()):
            pid = writers.kernel_interpreter(kernel.pid) if kernel.pid is not None else None
            if pid is None:
                continue
            if language == running:
                await self._stop_running(session, kernel, pid, pid in culprits.kernels)
            elif pid in culprits.kernels or (pid in culprits.parents and session.disk.strikes > 1):
                await self.drop(session, language)
                stopped.append(language)
        session.disk.rebase()
        note = _what_was_stopped(session, killed, stopped, running is not None)
        if note:
            session.notes.append(note)
        log.warning("session %s went past its disk limit: %s", session.id, note or "stopped")

    async def _stop_running(
        self, session: Session, kernel: SandboxedKernel, pid: int, wrote: bool
    ) -> None:
        """The running code: interrupted when its kernel wrote or the limit is hit again;
        its kernel killed when it goes on writing after that."""
        session.disk.stop_running_code()
        strikes = session.disk.strikes
        if strikes > 2:
            _kill(pid)
        elif wrote or strikes > 1:
            await kernel.interrupt(timeout_s=self.grace_s)


def _look_all(watches: list[DiskWatch]) -> list[Hit | None]:
    return [watch.look() for watch in watches]


def _running_kernel(session: Session) -> str | None:
    call = session.current_call
    if call is None or call[1] not in session.kernels:
        return None
    return call[1]


def _kill(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _what_was_stopped(session: Session, killed: list[str], kernels: list[str], busy: bool) -> str:
    """The note for the next result. A running execution's result names the limit itself
    (`describe_hit`); an idle session's next result must say it all."""
    parts = []
    if killed:
        parts.append(f"processes that kept writing were killed: {', '.join(sorted(set(killed)))}")
    for language in kernels:
        parts.append(
            f"the {language} kernel kept writing while none of its code ran (a background "
            "thread?) and was stopped: its next call starts a fresh kernel (variables lost, "
            "files kept)"
        )
    if not parts or busy:
        return "; ".join(parts)
    limits = session.limits
    return (
        f"while no code ran, the session went past its workspace limit "
        f"({format_size(limits.workspace_bytes)} and {limits.workspace_files} files): "
        f"{'; '.join(parts)}; delete files to make room"
    )
