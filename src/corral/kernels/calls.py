"""Running code in sessions: each call waits its turn in its session's queue, gets a kernel,
runs once (`corral.kernels.execute.run_code`) under the session's limits, and ends with one
result that says what struck (a limit, a lost kernel, the server shutting down).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from corral.config import Settings
from corral.errors import KernelUnreachable, ShuttingDown
from corral.kernels.execute import BeforeSend, ExecutionLimits, OutputHook, run_code
from corral.kernels.limit_hits import attribute_limit, counters
from corral.kernels.results import ExecutionResult
from corral.kernels.session import Session
from corral.kernels.starter import KernelStarter

SHUTDOWN_NOTE = "interrupted because the server is shutting down"


class CallRunner:
    """`sessions` gives the sessions (to find a call's kernel); `touch` marks one used;
    `ended` is told each call's end."""

    def __init__(
        self,
        kernels: KernelStarter,
        settings: Settings,
        sessions: Callable[[], Iterable[Session]],
        touch: Callable[[Session], None],
        ended: Callable[[], None] = lambda: None,
    ) -> None:
        self.kernels = kernels
        self.settings = settings
        self.sessions = sessions
        self.touch = touch
        self.ended = ended  # after each call: the warm pool may start its refill
        self.closing = False  # set by begin_shutdown: no new call starts
        self._interrupts: set[asyncio.Task[bool]] = set()

    async def execute(
        self,
        session: Session,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        on_output: OutputHook | None = None,
        before_send: BeforeSend | None = None,
    ) -> ExecutionResult:
        """Run `code` in `session` (from `SessionManager.session_for`), after its earlier
        calls; the language and the timeout were checked by the caller
        (`ExecutionService.start`).

        `before_send` is called once, just before the code goes to the kernel; what it
        raises stops the call there, with nothing sent.
        """
        queued = time.monotonic()
        async with session.turn():
            if self.closing:
                raise ShuttingDown(
                    "the server is shutting down and did not run this code; send it again "
                    "once the server is back"
                )
            session.current_call = (_current_task(), language)
            try:
                return await self._run(
                    session, code, language, timeout_s, (on_output, before_send), queued
                )
            finally:
                session.current_call = None

    async def _run(
        self,
        session: Session,
        code: str,
        language: str,
        timeout_s: float | None,
        hooks: tuple[OutputHook | None, BeforeSend | None],
        queued: float,
    ) -> ExecutionResult:
        result = ExecutionResult(language=language, session_id=session.record.id)
        result.queued_s = time.monotonic() - queued
        restarted = await self.kernels.for_call(session, language)
        session.open = True
        limits = self.limits_for(timeout_s, session)
        session.disk.begin()
        before = counters(session.box)
        session.refused = []
        try:
            outcome = await run_code(session.kernels[language], code, limits, result, *hooks)
        except KernelUnreachable:
            # Nothing was sent: it is safe to try once more on a fresh kernel.
            await self.kernels.replace(session, language)
            restarted = True
            outcome = await run_code(session.kernels[language], code, limits, result, *hooks)
        finally:
            result.network_refused, session.refused = session.refused or [], None
        session.disk.ended()
        outcome.result.limit = outcome.result.limit or session.disk.stopped()
        attribute_limit(outcome.result, before, counters(session.box), session.limits)
        if not outcome.kernel_usable:
            await self.kernels.after_loss(session, language, outcome.result)
        outcome.result.kernel_restarted = outcome.result.kernel_restarted or restarted
        if session.notes:
            _add_notes(outcome.result, session.notes)
            session.notes = []
        if self.closing and outcome.result.status == "interrupted":
            _add_notes(outcome.result, [SHUTDOWN_NOTE], first=True)
        self.touch(session)
        self.ended()
        return outcome.result

    def limits_for(self, timeout_s: float | None, session: Session) -> ExecutionLimits:
        """The limits of one execution: a timeout past the session's cap is cut to the cap
        (the result says so if it strikes); the timeout was checked (`check_timeout`)."""
        limits = session.limits
        cap = limits.exec_timeout_s
        return ExecutionLimits(
            timeout_s=min(timeout_s or cap, cap),
            asked_s=timeout_s if timeout_s is not None and timeout_s > cap else None,
            grace_s=self.settings.interrupt_grace_s,
            max_output_bytes=limits.output_bytes,
            guard=session.disk,
        )

    def begin_shutdown(self) -> None:
        """Refuse calls not yet started and interrupt the running ones, which then end
        with their result (status interrupted) before the server closes."""
        self.closing = True
        for session in self.sessions():
            call = session.current_call
            kernel = session.kernels.get(call[1]) if call is not None else None
            if kernel is not None:
                task = asyncio.create_task(kernel.interrupt())
                self._interrupts.add(task)
                task.add_done_callback(self._interrupts.discard)

    async def cancel(self, task: asyncio.Future[Any]) -> None:
        """Stop an `execute` call whose caller went away.

        Still queued, or its kernel still starting: nothing was sent, so the call is
        cancelled. Running: the kernel is interrupted and the call ends with its result as
        usual.
        """
        for session in self.sessions():
            call = session.current_call
            if call is not None and call[0] is task:
                kernel = session.kernels.get(call[1])
                if kernel is not None and not session.starting:
                    await kernel.interrupt()
                    return
                break
        task.cancel()


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("execute must run inside an asyncio task")
    return task


def _add_notes(result: ExecutionResult, notes: list[str], *, first: bool = False) -> None:
    """Tell the agent, once, what happened to its session since the last result."""
    note = "; ".join(notes)
    if not result.message:
        result.message = note
    else:
        result.message = f"{note}; {result.message}" if first else f"{result.message}; {note}"
