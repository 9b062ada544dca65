"""Relaying bytes between two connected transports, both ways, with flow control.

After the proxy has answered a client, the two connections are bridged at the protocol level:
each side's `data_received` writes straight into the other transport, and a full write buffer
pauses reading on the side that fills it. No stream buffers or tasks sit in between, which is
what keeps a large download close to the speed of the sockets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

Counter = Callable[[int], None]


class _Half(asyncio.Protocol):
    """Reads one transport (`source`) and writes what it gets to the other (`sink`)."""

    def __init__(
        self,
        source: asyncio.Transport,
        sink: asyncio.Transport,
        count: Counter,
        finished: asyncio.Future[None],
    ) -> None:
        self.source = source
        self.sink = sink
        self.count = count
        self.finished = finished
        self.last_active = time.monotonic()
        self.eof = False

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        self.count(len(data))
        self.sink.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        if self.sink.can_write_eof() and not self.sink.is_closing():
            self.sink.write_eof()
        return True  # keep the other direction open

    def pause_writing(self) -> None:
        # The source's own write buffer is full: stop reading from the side that feeds it.
        self.sink.pause_reading()

    def resume_writing(self) -> None:
        if not self.sink.is_closing():
            self.sink.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.sink.close()
        if not self.finished.done():
            self.finished.set_result(None)


async def bridge(
    a: asyncio.Transport,
    b: asyncio.Transport,
    *,
    a_to_b: Counter,
    b_to_a: Counter,
    idle_timeout_s: float,
    pending_a: bytes = b"",
    pending_b: bytes = b"",
) -> None:
    """Relay between `a` and `b` until either closes, both reach EOF, or nothing moves for
    `idle_timeout_s`. `pending_*` are bytes already read from that side, sent first."""
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    half_a = _Half(a, b, a_to_b, finished)
    half_b = _Half(b, a, b_to_a, finished)
    a.set_protocol(half_a)
    b.set_protocol(half_b)
    if pending_a:
        a_to_b(len(pending_a))
        b.write(pending_a)
    if pending_b:
        b_to_a(len(pending_b))
        a.write(pending_b)
    a.resume_reading()
    b.resume_reading()
    try:
        while not finished.done():
            idle = time.monotonic() - max(half_a.last_active, half_b.last_active)
            if idle >= idle_timeout_s or (half_a.eof and half_b.eof):
                break
            await asyncio.wait({finished}, timeout=min(idle_timeout_s - idle, 5.0))
    finally:
        a.close()
        b.close()
