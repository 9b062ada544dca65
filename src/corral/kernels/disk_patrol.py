"""The disk patrol: one thread that watches every running session's disk use, busy or idle.

Every `TICK_S` it reads the free space and inodes of the filesystems sessions write to (a
few statvfs calls) and looks at each session that is due (`DiskWatch.due`). It runs in a
thread of its own, so a busy event loop never delays a stop. A look past the limit stops
what writes, at once and whether code runs or not:

- the agent's processes that wrote since the look before, each with its branch of the
  process tree (`corral.sandbox.writers`), are killed;
- running code whose kernel wrote itself is interrupted (SIGINT, as the kernel's own
  interrupt does); so is any running code the limit stops a second time (it starts writers
  again), and its kernel is killed at the third; its result names the disk limit in any case;
- a kernel that wrote while no code of it ran (a background thread), or whose branches had
  to be killed twice in one idle period, is stopped; its next call starts a fresh kernel
  and says why;
- what wrote is named by the data pages it dirtied, or, when the session grew with none
  dirtied (files created empty), by the CPU it used meanwhile (`DiskWatch.look`); growth
  below that noise with no page dirtied stops nothing (the filesystem's own blocks, such as
  a file's extent tree written back after the host put it there).

Signals are sent from the patrol's thread; what needs the event loop (stopping a kernel for
good) is handed to it, and what was stopped is told in the session's next result
(`Session.notes`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable

from corral.kernels.session import Session
from corral.sandbox import writers
from corral.sandbox.disk import TICK_S, Hit, free_space
from corral.sandbox.limits import format_size

log = logging.getLogger(__name__)

DropKernel = Callable[[Session, str], Awaitable[None]]


class DiskPatrol:
    """`sessions` gives a snapshot of the sessions (taken from the patrol's thread); `drop`
    stops one of a session's kernels for good (its next call starts a fresh one)."""

    def __init__(self, sessions: Callable[[], list[Session]], drop: DropKernel) -> None:
        self.sessions = sessions
        self.drop = drop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._dropping: set[tuple[str, str]] = set()  # (session, language) being stopped

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._patrol, name="corral-disk-patrol")
        self._thread.daemon = True
        self._thread.start()

    async def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        for future in list(self._pending):
            with contextlib.suppress(Exception, concurrent.futures.CancelledError):
                await asyncio.wrap_future(future)

    def _patrol(self) -> None:
        # Every tick even with nothing running: a session that just started is looked at
        # within one tick, before it can write much (its first look is its baseline).
        while not self._stop.wait(TICK_S):
            watched = [session for session in self.sessions() if session.kernels]
            try:
                self.tick(watched)
            except Exception:  # one bad look must not end the patrol
                log.exception("the disk patrol's look failed")

    def tick(self, watched: list[Session]) -> None:
        devices: dict[int, str] = {}
        for session in watched:
            devices.update(session.disk.devices)
        free, now = free_space(devices), time.monotonic()
        for session in watched:
            if session.disk.due(now, session.lock.locked(), free):
                hit = session.disk.look()
                if hit is not None and session.kernels:
                    self.stop_writers(session, hit)

    def stop_writers(self, session: Session, hit: Hit) -> None:
        """Stop what wrote past the limit (see the module), at once where a signal does.

        The note goes to the session before any signal (the code stopped now must find it
        when its result is made), or, when a kernel is to be stopped for good, once it is."""
        if not hit.writers and not hit.grew_past_noise():
            # No process wrote and the growth is what the filesystem itself adds (blocks an
            # extent tree takes at writeback, say): no writer to stop, no strike. Growth
            # that goes on is judged at the next look, which is no baseline.
            log.debug("session %s: %s bytes of growth with no writer", session.id, hit.grown)
            return
        running = _running_kernel(session)
        if running is not None and not session.disk.stop_running_code(hit):
            log.debug("session %s: code began after the look that found growth", session.id)
            return
        culprits = writers.find_culprits(hit.writers)
        if running is None and not (culprits.branches or culprits.kernels):
            # Nothing named and nothing running: no strike (a second one stops the kernel
            # that started a branch) and no rebase: the next look is no baseline, so growth
            # that goes on is judged, and its writer named, at once.
            log.debug("session %s grew past its disk limit; no writer named yet", session.id)
            return
        names = [writers.name_of(top) for top in culprits.branches]
        session.disk.strikes += 1
        signals: list[tuple[int, signal.Signals]] = []
        idle: list[str] = []
        for language, kernel in list(session.kernels.items()):
            pid = kernel.pid
            if pid is None:
                continue
            if language == running:
                if signum := _stop_signal(session.disk.strikes, pid in culprits.kernels):
                    signals.append((pid, signum))
            elif (session.id, language) in self._dropping:
                continue  # already on its way out
            elif pid in culprits.kernels or (pid in culprits.parents and session.disk.strikes > 1):
                idle.append(language)
        note = _what_was_stopped(session, names, idle, running is not None)
        if not idle and (note or running is not None):
            _tell(session, note)
        elif not idle:
            log.debug("session %s grew past its disk limit; nothing to stop yet", session.id)
        writers.kill_branches(culprits.branches)
        for pid, signum in signals:
            _signal(pid, signum)
        session.disk.rebase()
        if idle and self._loop is not None:
            self._dropping.update((session.id, language) for language in idle)
            future = asyncio.run_coroutine_threadsafe(self._drop(session, idle, note), self._loop)
            self._pending.add(future)
            future.add_done_callback(self._pending.discard)

    async def _drop(self, session: Session, languages: list[str], note: str) -> None:
        """Stop, through the event loop, the kernels that wrote while idle; then tell the
        session (its next call, which starts a fresh kernel)."""
        try:
            for language in languages:
                await self.drop(session, language)
        finally:
            self._dropping.difference_update((session.id, language) for language in languages)
        _tell(session, note)


def _stop_signal(strikes: int, wrote: bool) -> signal.Signals | None:
    """For running code: SIGINT (what the kernel's own interrupt does, without waiting for
    the loop; a kernel ignores SIGINT between executions, so it lands in this code or
    nowhere) when its kernel wrote or it is stopped a second time; SIGKILL when it goes on
    after that (a thread of its own); nothing at a first stop of writers it started."""
    if strikes > 2:
        return signal.SIGKILL
    if wrote or strikes > 1:
        return signal.SIGINT
    return None


def _tell(session: Session, note: str) -> None:
    """The note for the session's next result (read by the event loop: one append)."""
    if note:
        session.notes.append(note)
    log.warning(
        "session %s went past its disk limit: %s", session.id, note or "its running code stopped"
    )


def _running_kernel(session: Session) -> str | None:
    call = session.current_call
    if call is None or call[1] not in session.kernels:
        return None
    return call[1]


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


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
