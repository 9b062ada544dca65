"""The dashboard's live parts: server-sent events whose data is HTML for htmx to swap.

Each message is an `update` event holding elements marked `hx-swap-oob`: htmx's SSE
extension puts each where the element of the same id is (or, for output, at the end of it).
A feed says what changed since its last message and waits for the next change; nothing is
sent when nothing changed, so a form being filled in on the page is not replaced under the
operator's hands. A stream ends when the browser goes away (Starlette notices), when the
login that opened it ends (logged out or expired), or when the service closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

from starlette.responses import StreamingResponse

from corral.dashboard.logins import Login
from corral.dashboard.render import HEADERS
from corral.dashboard.timeline import entries_after
from corral.dashboard.usage import session_rows
from corral.errors import NotFound
from corral.execution import Execution

if TYPE_CHECKING:
    from corral.dashboard.app import Dashboard

TICK_S = 1.0  # between two looks at figures that change without an event (usage)
KEEP_ALIVE_S = 15.0


class Feed(Protocol):
    async def changes(self) -> str:
        """The HTML of what changed since the last call (maybe empty), once there is some
        or a tick passed; raises `StopAsyncIteration` when there is nothing more to follow."""
        ...


def stream(feed: Feed, live: Callable[[], bool]) -> StreamingResponse:
    """The feed's changes as SSE while `live()` (the login that opened it has not ended)."""
    headers = {**HEADERS, "X-Accel-Buffering": "no"}
    return StreamingResponse(_events(feed, live), media_type="text/event-stream", headers=headers)


async def _events(feed: Feed, live: Callable[[], bool]) -> AsyncIterator[str]:
    quiet = 0.0
    while True:
        try:
            html = await feed.changes()
        except StopAsyncIteration:
            return
        if not live():  # logged out or expired: nothing more for this browser
            return
        if html:
            quiet = 0.0
            yield _message(html)
        else:
            quiet += TICK_S
            if quiet >= KEEP_ALIVE_S:
                quiet = 0.0
                yield ": keep-alive\n\n"


def _message(html: str) -> str:
    lines = html.splitlines() or [""]
    return "event: update\n" + "".join(f"data: {line}\n" for line in lines) + "\n"


class _Diff:
    """Fragments by element id; `changed` gives the ones whose HTML differs from last time."""

    def __init__(self) -> None:
        self.sent: dict[str, str] = {}

    def changed(self, fragments: dict[str, str]) -> str:
        fresh = [html for key, html in fragments.items() if self.sent.get(key) != html]
        self.sent = dict(fragments)
        return "".join(fresh)


class SessionsFeed:
    """The sessions page: each session's figures, and the whole list when sessions come,
    go or change state (its actions depend on the state)."""

    def __init__(self, board: Dashboard, login: Login) -> None:
        self.board = board
        self.login = login
        self.shape: tuple[tuple[str, bool], ...] | None = None
        self.diff = _Diff()
        self.first = True

    async def changes(self) -> str:
        if not self.first:
            await _tick(self.board)
        self.first = False
        rows = session_rows(self.board.service, self.board.history)
        pages = self.board.pages
        shape = tuple((row.info.id, row.info.open) for row in rows)
        head = ""
        if shape != self.shape:
            self.shape = shape
            head = pages.macro("parts.html", "session_list", rows, self.login.csrf, True)
            self.diff.sent.clear()
        figures = {row.info.id: pages.macro("parts.html", "figures", row, True) for row in rows}
        body = self.diff.changed(figures)
        return head + body if head else body


class NetworkFeed:
    """The network page: the requests (pending and answered) and each session's policy
    and counters."""

    def __init__(self, board: Dashboard, login: Login) -> None:
        self.board = board
        self.login = login
        self.diff = _Diff()
        self.first = True

    async def changes(self) -> str:
        if not self.first:
            await _tick(self.board)
        self.first = False
        service, pages, csrf = self.board.service, self.board.pages, self.login.csrf
        fragments = {
            "requests": pages.macro(
                "parts.html", "requests_block", await service.network.requests(), csrf, True
            )
        }
        for info in service.list_sessions():
            with contextlib.suppress(NotFound):
                status = service.network.policy(info.id)
                fragments[info.id] = pages.macro(
                    "parts.html", "policy_block", info.id, status, csrf, (), True
                )
        return self.diff.changed(fragments)


class TimelineFeed:
    """One session's page: executions as they start, their output as it arrives and their
    end, the audit log's new entries of the session, and its figures."""

    def __init__(self, board: Dashboard, session_id: str, after_entry: int, page_at: float) -> None:
        self.board = board
        self.session_id = session_id
        self.after_entry = after_entry  # the page shows the audit entries up to this one
        self.page_at = page_at  # and the executions made by then, as they were then
        self.shown: dict[str, int] = {}  # execution id: output events sent
        self.ended: set[str] = set()
        self.figures = _Diff()
        self.started = False
        self.looked_at = -TICK_S  # the figures and the audit log: at most once a tick
        events = board.service.session_events
        self.watch = events.follow(session_id, events.last(session_id), idle_s=TICK_S)

    async def changes(self) -> str:
        await self._wait()
        kept = self.board.service.executions.listed(self.session_id)
        parts = [self._execution(execution) for execution in reversed(kept)]
        if self._due():
            parts.insert(0, self._figures())
            entries, self.after_entry = await entries_after(
                self.board.service, self.session_id, self.after_entry
            )
            parts += [self._append(self._macro("entry_item", entry)) for entry in entries]
        return "".join(parts)

    def _due(self) -> bool:
        """Whether a tick passed since the figures and the audit log were last looked at
        (output can wake the feed many times a second)."""
        now = time.monotonic()
        if now - self.looked_at < TICK_S:
            return False
        self.looked_at = now
        return True

    async def _wait(self) -> None:
        """Until something may have changed: output of the running execution, an event of
        the session, or a tick. Raises `StopAsyncIteration` once the session is deleted."""
        if not self.started:
            self.started = True
            return
        running = next(
            (e for e in self.board.service.executions.listed(self.session_id) if not e.done),
            None,
        )
        if running is not None:
            await running.log.wait_past(self.shown.get(running.id, 0), TICK_S)
            return
        await anext(self.watch)

    def _figures(self) -> str:
        rows = session_rows(self.board.service, self.board.history, only=self.session_id)
        if not rows:
            return ""
        return self.figures.changed(
            {"figures": self.board.pages.macro("parts.html", "figures", rows[0], True)}
        )

    def _execution(self, execution: Execution) -> str:
        """What the page lacks of one kept execution: its card, new output, its end."""
        if execution.id in self.ended:
            return ""
        if execution.id not in self.shown:
            self.shown[execution.id] = len(execution.log.since(0))
            if execution.done:
                self.ended.add(execution.id)
            if execution.created_at <= self.page_at:  # on the page: brought up to date
                return self._macro("execution_item", execution, True)
            return self._append(self._macro("execution_item", execution))
        fresh = execution.log.since(self.shown[execution.id])
        html = ""
        if fresh:
            self.shown[execution.id] = fresh[-1][0]
            output = self._macro("outputs", fresh, execution.id)
            html += f'<div id="out-{execution.id}" hx-swap-oob="beforeend">{output}</div>'
        if execution.done:
            self.ended.add(execution.id)
            html += self._macro("status", execution, True)
        return html

    def _macro(self, name: str, *args: object) -> str:
        return self.board.pages.macro("parts.html", name, *args)

    @staticmethod
    def _append(html: str) -> str:
        return f'<ol id="timeline" hx-swap-oob="beforeend">{html}</ol>'


async def _tick(board: Dashboard) -> None:
    """One tick, or less when the service closes (then the stream ends)."""
    if board.service.session_events.closed:
        raise StopAsyncIteration
    await asyncio.sleep(TICK_S)
    if board.service.session_events.closed:
        raise StopAsyncIteration
