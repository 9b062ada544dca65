"""Each session's status changes as a numbered feed that any number of clients follow.

The service publishes what a watcher of a session needs: `created`, `busy` (code was sent
to a kernel, with the execution's id), `idle` (it ended: status, and the limit that stopped
it), `kernel_died`, `kernel_restarted`, `limit`, `restarted`, `stopped`, `deleted`, and the
sandbox's own notes (`protected`, `bridge`). Each event has a number, per session, from 1;
the newest `keep` are kept, so a client that reconnects with the last number it saw gets
what it missed (or, past the bound, the oldest kept and `missed` counting the rest).
Following ends when the session is deleted or the service closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SessionEvent:
    seq: int
    kind: str
    at: float
    detail: dict[str, Any] = field(default_factory=dict)


class _Feed:
    def __init__(self, keep: int) -> None:
        self.events: deque[SessionEvent] = deque(maxlen=keep)
        self.last = 0
        self.closed = False
        self.changed = asyncio.Event()

    def add(self, kind: str, detail: dict[str, Any]) -> None:
        self.last += 1
        self.events.append(SessionEvent(self.last, kind, time.time(), detail))
        self.wake()

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class SessionEvents:
    """The feeds of every session; a deleted session's feed is kept for late readers, the
    newest `keep_deleted` of them."""

    def __init__(self, keep: int = 500, keep_deleted: int = 100) -> None:
        self._keep = keep
        self._keep_deleted = keep_deleted
        self._feeds: dict[str, _Feed] = {}
        self._deleted: OrderedDict[str, None] = OrderedDict()
        self._closed = False

    def publish(self, session_id: str, kind: str, **detail: Any) -> None:
        if self._closed:
            return
        feed = self._feeds.get(session_id)
        if feed is None or feed.closed:
            feed = self._feeds[session_id] = _Feed(self._keep)
        self._deleted.pop(session_id, None)
        feed.add(kind, detail)
        if kind == "deleted":
            feed.closed = True
            feed.wake()
            self._deleted[session_id] = None
            if len(self._deleted) > self._keep_deleted:
                self._feeds.pop(self._deleted.popitem(last=False)[0], None)

    def deleted(self, session_id: str) -> bool:
        """Whether the session's newest event is `deleted` (not created again since)."""
        feed = self._feeds.get(session_id)
        return feed is not None and feed.closed

    @property
    def closed(self) -> bool:
        """Whether the service is closing (every follower ends)."""
        return self._closed

    def last(self, session_id: str) -> int:
        """The number of the session's newest event (0 before its first)."""
        feed = self._feeds.get(session_id)
        return feed.last if feed is not None else 0

    def missed(self, session_id: str, after: int) -> int:
        """How many events after `after` are no longer kept."""
        feed = self._feeds.get(session_id)
        if feed is None or not feed.events:
            return 0
        return max(0, feed.events[0].seq - after - 1)

    async def follow(
        self, session_id: str, after: int = 0, idle_s: float | None = None
    ) -> AsyncIterator[SessionEvent | None]:
        """The kept events after number `after`, then each as it comes, until the session is
        deleted or the service closes; None after each `idle_s` without one (for a reader
        that keeps its connection alive)."""
        feed = self._feeds.setdefault(session_id, _Feed(self._keep))
        while True:
            changed = feed.changed
            fresh = [event for event in feed.events if event.seq > after]
            for event in fresh:
                yield event
                after = event.seq
            if (feed.closed or self._closed) and not fresh:
                return
            if not fresh:
                quiet = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), idle_s)
                    quiet = False
                if quiet:
                    yield None

    def close(self) -> None:
        """The service is closing: every follower ends after what it has not read yet."""
        self._closed = True
        for feed in self._feeds.values():
            feed.wake()
