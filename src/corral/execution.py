"""One execution in flight: its output as corral's events, its result and its cancel.

`ExecutionService.start` (`corral.areas.executions`) checks the request before anything
starts, then hands back an `Execution`. Every front-end consumes the same handle: REST JSON
and coderunner's routes await `result()`, SSE/NDJSON streaming and MCP's progress read
`events()` as well, MCP's `notifications/cancelled` calls `cancel()`.

What happens when the caller goes away is decided here, once:

- An explicit cancel (`cancel()`) drops a call still queued behind others in its session
  (its code never runs and nothing is audited) and interrupts a running one, which then
  ends with its result (status `interrupted`), audited like any other.
- A caller that merely leaves (a closed connection, a cancelled wait on `result()`, a
  stream nobody reads any more) changes nothing: the code was sent, so it runs to its end
  and its result is audited. Its events are kept in order, numbered from 1 (up to a byte
  bound), and `corral.executions` keeps the handle by its `id` for a while after the end,
  so a client that lost its connection comes back for the state, the result and the
  events after the last number it saw.
- Nothing is left dangling: the service holds every execution until it ends and waits for
  them when it closes; the run's outcome is always retrieved, so a failure nobody awaited
  is never logged as an unhandled exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.kernels.results import ExecutionResult, strip_ansi

EventKind = Literal["stdout", "stderr", "display", "error"]
State = Literal["queued", "running", "done"]
Run = Callable[["Execution"], Coroutine[Any, Any, ExecutionResult]]
Canceller = Callable[[asyncio.Future[ExecutionResult]], Awaitable[None]]
CODE_KEEP_CHARS = 100_000
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


class EventLog:
    """An execution's events in order, numbered 1, 2, ...; any number of readers follow it.

    It keeps at most `max_bytes` of them (text, or a display's JSON); past that it keeps
    none (`cut`), as the result's output is cut too. `close()` ends every reader.
    """

    def __init__(self, max_bytes: int) -> None:
        self._events: list[Event] = []
        self._bytes = 0
        self._max_bytes = max_bytes
        self.cut = False
        self.closed = False
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._events)

    def add(self, event: Event) -> None:
        size = (
            len(event.text) + len(event.evalue) + (len(json.dumps(event.data)) if event.data else 0)
        )
        if self.cut or self._bytes + size > self._max_bytes:
            self.cut = True
            return
        self._bytes += size
        self._events.append(event)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def since(self, after: int) -> list[tuple[int, Event]]:
        """The events numbered after `after`, with their numbers, as kept now."""
        start = max(after, 0)
        return list(enumerate(self._events[start:], start + 1))

    async def follow(self, after: int = 0) -> AsyncIterator[tuple[int, Event]]:
        """The events after number `after`, then each as it comes, until the log closes."""
        while True:
            changed = self._changed
            fresh = self.since(after)
            for number, event in fresh:
                yield number, event
                after = number
            if self.closed and not fresh:
                return
            if not fresh:
                await changed.wait()

    async def wait_past(self, number: int, timeout_s: float) -> None:
        """Until an event numbered past `number` is kept or the log closes, or `timeout_s`
        passes."""
        changed = self._changed
        if len(self._events) > number or self.closed or timeout_s <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout_s)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class Execution:
    """The handle of one execution; made by `ExecutionService.start`, inside the loop.

    `run` is the whole call (queue, kernel, audit), given this handle (its output hook is
    `note`; it sets `running` and `audit_key` once the code is sent); `canceller`
    interrupts or drops it; `on_end` is told when it has ended, however. Its events are
    kept in `log`, up to `keep_bytes`, for every reader of `events()`.
    """

    def __init__(
        self,
        run: Run,
        canceller: Canceller,
        *,
        session_id: str,
        keep_bytes: int,
        on_end: Callable[[Execution], None] = lambda _: None,
        code: str = "",
        language: str = "python",
    ) -> None:
        self.id = f"ex-{secrets.token_hex(8)}"
        self.session_id = session_id
        # What it runs, for the operator's timeline (the audit log keeps more of it).
        self.code = code[:CODE_KEEP_CHARS]
        self.code_cut = len(code) > CODE_KEEP_CHARS
        self.language = language
        self.created_at = time.time()
        self.ended_at: float | None = None
        self.running = False  # set when its code is sent to the kernel
        self.audit_key: str | None = None  # its audit entry's, once the code is sent
        self.log = EventLog(keep_bytes)
        self._recent = 0  # the last event `recent_text` passed
        self._canceller = canceller
        self._on_end = on_end
        self._task = asyncio.create_task(run(self))
        self._task.add_done_callback(self._ended)

    @property
    def done(self) -> bool:
        return self._task.done()

    @property
    def state(self) -> State:
        if self._task.done():
            return "done"
        return "running" if self.running else "queued"

    async def events(self, after: int = 0) -> AsyncIterator[tuple[int, Event]]:
        """The output events after number `after`, with their numbers, as they arrive;
        ending when the execution ends. Readers may come and go; the execution goes on."""
        async for numbered in self.log.follow(after):
            yield numbered

    def recent_text(self, max_chars: int) -> str:
        """The stdout and stderr text that arrived since the last call, at most its last
        `max_chars`, without waiting: for a reader that looks now and then (MCP's progress
        notes) instead of following `events()`. Other events are passed over."""
        fresh = self.log.since(self._recent)
        if fresh:
            self._recent = fresh[-1][0]
        text = "".join(e.text for _, e in fresh if e.kind in ("stdout", "stderr"))
        return text[-max_chars:]

    async def wait_for_output(self, timeout_s: float) -> bool:
        """Until output arrived that `recent_text` has not passed, the execution ended, or
        `timeout_s` passed; True when it has ended."""
        await self.log.wait_past(self._recent, timeout_s)
        return self.done

    def outcome(self) -> ExecutionResult | None:
        """The result once it ended with one; None while running or for a call that was
        refused or dropped before its code ran."""
        if not self._task.done() or self._task.cancelled() or self._task.exception():
            return None
        return self._task.result()

    def failure(self) -> str | None:
        """Why an ended call has no result (refused, or dropped from the queue), else None."""
        if not self._task.done():
            return None
        if self._task.cancelled():
            return "cancelled before its code ran"
        exc = self._task.exception()
        return str(exc) if exc is not None else None

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

    async def note(self, msg_type: str, content: Any) -> None:
        """The output hook: one message of the kernel's, kept as an event if it is one."""
        if (event := event_of(msg_type, content)) is not None:
            self.log.add(event)

    def _ended(self, task: asyncio.Future[ExecutionResult]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: whoever awaits result() sees it, nobody else
        self.ended_at = time.time()
        self.log.close()
        self._on_end(self)
