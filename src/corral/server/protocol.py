"""uvicorn's h11 protocol with a bound on how long a request's headers may take.

uvicorn closes a connection idle between requests (`timeout_keep_alive`) but waits for ever
for headers that trickle in: 200 connections sending a header byte now and then stayed open
as long as their clients liked. Here a request's headers have `header_timeout_s` from the
moment the connection opened or, on a kept-alive connection, from the request's first byte;
past it the server answers 408 and closes. An idle kept-alive connection is uvicorn's to
close (silently, after `timeout_keep_alive`), so a client reusing it never meets a 408. The
count of open connections is bounded by uvicorn's `limit_concurrency` (503 past it), the
body's read time by `corral.server.body`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

_BODY = b"the request headers took too long to arrive\n"
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)
_REPORT_EVERY_S = 10.0  # one log line for the connections closed in that time, not one each


class HeaderBoundProtocol(H11Protocol):
    """`header_timeout_s` is set on the class `bounded_protocol` makes."""

    header_timeout_s = 10.0
    _closed = 0
    _reported_at = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._await_headers()  # the first byte of the next request on this connection
        super().data_received(data)

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a request's headers were read
            self._headers_arrived()

    def _await_headers(self) -> None:
        self._headers_arrived()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _headers_arrived(self) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()  # type: ignore[union-attr]
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or (
            self.cycle is not None and not self.cycle.response_complete
        ):
            return
        self.transport.write(_TIMED_OUT)
        self.transport.close()
        _note_closed(type(self))


def _note_closed(cls: type[HeaderBoundProtocol]) -> None:
    cls._closed += 1
    now = time.monotonic()
    if now - cls._reported_at >= _REPORT_EVERY_S:
        log.info(
            "closed %d connections whose request headers took over %g s",
            cls._closed,
            cls.header_timeout_s,
        )
        cls._closed, cls._reported_at = 0, now


def bounded_protocol(header_timeout_s: float) -> type[HeaderBoundProtocol]:
    """The protocol class for uvicorn's `http` setting, with this bound."""
    return type(
        "HeaderBoundProtocol", (HeaderBoundProtocol,), {"header_timeout_s": header_timeout_s}
    )
