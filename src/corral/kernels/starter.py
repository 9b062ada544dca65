"""Starting, replacing and dropping the kernels of sessions, within the session cap.

`KernelStarter` decides nothing about when: the registry (`corral.kernels.sessions`) and
the call runner (`corral.kernels.calls`) ask it. A start takes a warm kernel when the pool
has one (`corral.kernels.warm`), else has the factory launch one; it refuses past the cap
(`TooManySessions`) unless the session already runs, and remembers the last start failure
for `/health`.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.errors import KernelStartFailed, TooManySessions
from corral.kernels.factory import KernelFactory
from corral.kernels.results import ExecutionResult
from corral.kernels.session import Session
from corral.kernels.warm import WarmHandOver


class KernelStarter:
    """`room` says how many more sessions may run; `save` stores a session's state."""

    def __init__(
        self,
        factory: KernelFactory,
        warm: WarmHandOver,
        max_sessions: int,
        room: Callable[[], int],
        save: Callable[[Session], None],
    ) -> None:
        self.factory = factory
        self.warm = warm
        self.max_sessions = max_sessions
        self.room = room
        self.save = save
        self.last_start_failure: str | None = None  # cleared by the next successful start

    async def ensure(self, session: Session, language: str) -> bool:
        """Make sure a live kernel runs; True when one had to be (re)started after a loss."""
        kernel = session.kernels.get(language)
        if kernel is not None and await kernel.is_alive():
            return False
        if kernel is not None:
            await self.drop_lost(session, language)
        return await self.for_call(session, language)

    async def for_call(self, session: Session, language: str) -> bool:
        """A kernel for a call, started when there is none; True when that replaces one the
        session lost. A kernel that died is found by `run_code`, which asks once, just
        before the code would be sent (`KernelUnreachable`)."""
        if language in session.kernels:
            return False
        lost = language in session.lost
        await self.start(session, language)
        session.lost.discard(language)
        return lost

    async def replace(self, session: Session, language: str) -> None:
        await self.factory.drop_kernel(session, language)
        await self.start(session, language)

    async def drop_lost(self, session: Session, language: str) -> None:
        """Stop a kernel the server had to end; the next call says it was restarted."""
        await self.factory.drop_kernel(session, language)
        session.lost.add(language)

    async def after_loss(self, session: Session, language: str, result: ExecutionResult) -> None:
        """A dead kernel is cleared (the next call starts a fresh one); a stuck one replaced."""
        if result.status == "died":
            await self.drop_lost(session, language)
            return
        await self.replace(session, language)
        result.kernel_restarted = True

    def check_capacity(self) -> None:
        if self.room() <= 0:
            raise TooManySessions(self.max_sessions)

    async def start(self, session: Session, language: str) -> None:
        if not session.running:
            self.check_capacity()
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
            self.save(session)
