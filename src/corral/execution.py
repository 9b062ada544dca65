"""One execution in flight: its output as corral's events, its result and its cancel.

`Service.start_execution` checks the request before anything starts, then hands back an
`Execution`. Every front-end consumes the same handle: REST JSON and coderunner's routes
await `result()`, SSE/NDJSON streaming and MCP's progress read `events()` as well, MCP's
`notifications/cancelled` calls `cancel()`.

What happens when the caller goes away is decided here, once:

- An explicit cancel (`cancel()`) drops a call still queued behind others in its session
  (its code never runs and nothing is audited) and interrupts a running one, which then
  ends with its result (status `interrupted`), audited like any other.
- A caller that merely leaves (a closed connection, a cancelled wait on `result()`, a
  stream nobody reads any more) changes nothing: the code was sent, so it runs to its end
  and its result is audited. Events nobody reads are not kept.
- Nothing is left dangling: the service holds every execution until it ends and waits for
  them when it closes; the run's outcome is always retrieved, so a failure nobody awaited
  is never logged as an unhandled exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.kernels.execute import OutputHook
from corral.kernels.results import ExecutionResult, strip_ansi

EventKind = Literal["stdout", "stderr", "display", "error"]
Run = Callable[[OutputHook | None], Coroutine[Any, Any, ExecutionResult]]
Canceller = Callable[[asyncio.Future[ExecutionResult]], Awaitable[None]]
_DISPLAY_TYPES = ("execute_result", "display_data", "update_display_data")


@dataclass(frozen=True)
class Event:
    """Something the code produced while running, in corral's terms (not Jupyter's).

    `stdout`/`stderr` carry `text` (the kernel may split or join output into any number of
    events: only their joined text and order mean anything), `display` carries a MIME
    bundle in `data`, `error` the exception's `ename` and `evalue`.
    """

    kind: EventKind
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    ename: str = ""
    evalue: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The event's fields for its kind (the streamed JSON shape)."""
        if self.kind == "display":
            return {"data": self.data}
        if self.kind == "error":
            return {"ename": self.ename, "evalue": self.evalue}
        return {"text": self.text}


def event_of(msg_type: str, content: dict[str, Any]) -> Event | None:
    """The event for one Jupyter iopub message, or None for one with nothing to show."""
    if msg_type == "stream":
        kind: EventKind = "stderr" if content.get("name") == "stderr" else "stdout"
        return Event(kind, text=str(content.get("text", "")))
    if msg_type in _DISPLAY_TYPES:
        return Event("display", data=dict(content.get("data", {})))
    if msg_type == "error":
        evalue = strip_ansi(str(content.get("evalue", "")))
        return Event("error", ename=str(content.get("ename", "")), evalue=evalue)
    return None


class Execution:
    """The handle of one execution; made by `Service.start_execution`, inside the loop.

    `run` is the whole call (queue, kernel, audit) given the output hook or None;
    `canceller` interrupts or drops it; `on_end` is told when it has ended, however. With
    `keep_events` False nothing is kept for `events()`, which then only waits for the end.
    """

    def __init__(
        self,
        run: Run,
        canceller: Canceller,
        *,
        keep_events: bool,
        on_end: Callable[[Execution], None] = lambda _: None,
    ) -> None:
        self._events: asyncio.Queue[Event | None] = asyncio.Queue()
        self._reading = keep_events
        self._canceller = canceller
        self._on_end = on_end
        self._task = asyncio.create_task(run(self._note if keep_events else None))
        self._task.add_done_callback(self._ended)

    @property
    def done(self) -> bool:
        return self._task.done()

    async def events(self) -> AsyncIterator[Event]:
        """The output events as they arrive, ending when the execution ends; one reader.

        A reader that stops early (it was cancelled or closed the iterator) stops the
        keeping of events; the execution itself goes on.
        """
        try:
            while (event := await self._events.get()) is not None:
                yield event
        finally:
            self._reading = False

    def recent_text(self, max_chars: int) -> str:
        """The stdout and stderr text that arrived since the last call, at most its last
        `max_chars`, without waiting: for a reader that looks now and then (MCP's progress
        notes) instead of following `events()`. Other events are passed over."""
        parts: list[str] = []
        while not self._events.empty():
            event = self._events.get_nowait()
            if event is None:
                self._events.put_nowait(None)  # the end stays visible to `events()`
                break
            if event.kind in ("stdout", "stderr"):
                parts.append(event.text)
        return "".join(parts)[-max_chars:]

    async def result(self) -> ExecutionResult:
        """The result once the code ends; raises what the call raised before running
        (`corral.errors`), or `CancelledError` for a call `cancel()` dropped from the queue.
        Cancelling this wait leaves the execution running."""
        return await asyncio.shield(self._task)

    async def cancel(self) -> None:
        """The caller cancelled explicitly: drop the call if still queued, else interrupt
        its code (it then ends with its result). Nothing once it has ended."""
        if not self._task.done():
            await self._canceller(self._task)

    async def wait(self, timeout_s: float | None = None) -> bool:
        """Until the execution has ended, however it ended, or `timeout_s` passed; True
        when it has ended. Never raises."""
        await asyncio.wait({self._task}, timeout=timeout_s)
        return self._task.done()

    def abandon(self) -> None:
        """Cancel the call outright, wherever it is (only for a service that is closing and
        whose kernels are already stopped)."""
        self._task.cancel()

    async def _note(self, msg_type: str, content: Any) -> None:
        if self._reading and (event := event_of(msg_type, content)) is not None:
            self._events.put_nowait(event)

    def _ended(self, task: asyncio.Future[ExecutionResult]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: whoever awaits result() sees it, nobody else
        self._events.put_nowait(None)
        self._on_end(self)
