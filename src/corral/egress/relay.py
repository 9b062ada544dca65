"""Relaying bytes between two connected transports, both ways, with flow control.

After the proxy has answered a client, the two connections are bridged at the protocol level:
each side's `data_received` writes straight into the other transport, and a full write buffer
pauses reading on the side that fills it. No stream buffers or tasks sit in between. The
relay ends when either side closes, when both have finished sending, or when nothing has
moved for the idle timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

Counter = Callable[[int], None]


def _uncounted(count: int) -> None:
    """A relay nobody counts (the forwarder: the host proxy keeps the figures)."""


def take_buffered(reader: asyncio.StreamReader) -> bytes:
    """Bytes the stream already read but nobody consumed (a request body sent right after its
    head, or an early answer). StreamReader has no public way to hand them over."""
    buffer: bytearray = getattr(reader, "_buffer")  # noqa: B009
    data = bytes(buffer)
    buffer.clear()
    return data


async def bridge_streams(
    down: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    up: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    *,
    idle_timeout_s: float,
    a_to_b: Counter | None = None,
    b_to_a: Counter | None = None,
) -> None:
    """`bridge` for two asyncio stream pairs, handing over what their readers hold."""
    pending_down, pending_up = take_buffered(down[0]), take_buffered(up[0])
    await bridge(
        cast(asyncio.Transport, down[1].transport),
        cast(asyncio.Transport, up[1].transport),
        a_to_b=a_to_b or _uncounted,
        b_to_a=b_to_a or _uncounted,
        idle_timeout_s=idle_timeout_s,
        pending_a=pending_down,
        pending_b=pending_up,
        eof_a=down[0].at_eof(),
        eof_b=up[0].at_eof(),
    )


IDLE_CHECK_S = 5.0


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
        self.peer: _Half | None = None
        self.last_active = time.monotonic()
        self.eof = False

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        self.count(len(data))
        self.sink.write(data)

    def eof_received(self) -> bool:
        self.finish_sending()
        return True  # the other direction may still be running

    def finish_sending(self) -> None:
        """This side sent all it will: pass the end on, and end the relay if both are done."""
        self.eof = True
        if self.sink.can_write_eof() and not self.sink.is_closing():
            self.sink.write_eof()
        if self.peer is not None and self.peer.eof:
            self._finish()

    def pause_writing(self) -> None:
        # The source's own write buffer is full: stop reading from the side that feeds it.
        self.sink.pause_reading()

    def resume_writing(self) -> None:
        if not self.sink.is_closing():
            self.sink.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.sink.close()
        self._finish()

    def _finish(self) -> None:
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
    eof_a: bool = False,
    eof_b: bool = False,
) -> None:
    """Relay between `a` and `b` until it ends (see the module doc).

    `pending_*` are bytes already read from that side, sent first; `eof_*` say that side had
    already finished sending before the bridge began.
    """
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    half_a = _Half(a, b, a_to_b, finished)
    half_b = _Half(b, a, b_to_a, finished)
    half_a.peer, half_b.peer = half_b, half_a
    a.set_protocol(half_a)
    b.set_protocol(half_b)
    for data, sink, count in ((pending_a, b, a_to_b), (pending_b, a, b_to_a)):
        if data:
            count(len(data))
            sink.write(data)
    for done, half in ((eof_a, half_a), (eof_b, half_b)):
        if done:
            half.finish_sending()
    a.resume_reading()
    b.resume_reading()
    try:
        while not finished.done():
            idle = time.monotonic() - max(half_a.last_active, half_b.last_active)
            if idle >= idle_timeout_s:
                break
            await asyncio.wait({finished}, timeout=min(idle_timeout_s - idle, IDLE_CHECK_S))
    finally:
        a.close()
        b.close()
