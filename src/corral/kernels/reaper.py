"""The idle reaper: the kernels of sessions unused past their idle timeout are stopped
(their files stay; the next call starts a kernel again)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

from corral.kernels.session import Session
from corral.store import now


class IdleReaper:
    """Looks every `interval_s` at `sessions`; `stop` stops one's kernels, `save` stores it."""

    def __init__(
        self,
        sessions: Callable[[], Iterable[Session]],
        stop: Callable[[Session], Awaitable[None]],
        save: Callable[[Session], None],
        interval_s: float,
    ) -> None:
        self.sessions = sessions
        self.stop = stop
        self.save = save
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._reap_forever(), name="corral-idle-reaper")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def reap_idle(self) -> list[str]:
        """Stop the kernels of sessions unused for longer than the idle timeout; their ids."""
        stopped = []
        for session in list(self.sessions()):
            idle = session.kernels and not session.lock.locked() and not session.starting
            if idle and session.record.last_used_at < now() - session.limits.idle_timeout_s:
                await self.stop(session)
                self.save(session)
                stopped.append(session.record.id)
        return stopped

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.reap_idle()
