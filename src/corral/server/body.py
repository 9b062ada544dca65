"""Caps on request bodies, enforced before a route reads them: their size and their time.

A declared Content-Length over the cap is refused at once; a chunked body is counted as it
arrives and cut off with 413 when it passes the cap. A body that stops (the next part not
there within `idle_s`) or trickles (not whole within `total_s` of the first read) is cut off
with 408, and the connection closed. Once the body is whole nothing is timed: a stream
that waits for its client to leave waits as long as it likes.
"""

from __future__ import annotations

import asyncio
import time

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.errors import BodyTimedOut, TooLarge
from corral.server.responses import error_response


class BodyTooLarge(TooLarge):
    """Raised from `receive` when a streamed body passes its cap; the app maps it to 413."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"the request body is over its cap of {cap} bytes")


class BodyLimit:
    """413 for bodies over `max_bytes`, or over `upload_bytes` on upload routes."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        upload_bytes: int,
        upload_suffix: str = "/files/content",
        idle_s: float = 30.0,
        total_s: float = 300.0,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.upload_bytes = upload_bytes
        self.upload_suffix = upload_suffix
        self.idle_s = idle_s
        self.total_s = total_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.upload_bytes if scope["path"].endswith(self.upload_suffix) else self.max_bytes
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            await _too_large(cap)(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            timed = _timed(receive, self.idle_s, self.total_s)
            await self.app(scope, _counting(timed, cap), tracking_send)
        except BodyTooLarge:
            if not started:
                await _too_large(cap)(scope, receive, send)
        except BodyTimedOut as exc:  # raised where no route turned it into its 408
            if not started:
                response = error_response(408, "body_timeout", str(exc))
                response.headers["connection"] = "close"
                await response(scope, receive, send)


def _counting(receive: Receive, cap: int) -> Receive:
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > cap:
                raise BodyTooLarge(cap)
        return message

    return wrapped


def _timed(receive: Receive, idle_s: float, total_s: float) -> Receive:
    whole = False
    deadline: float | None = None

    async def wrapped() -> Message:
        nonlocal whole, deadline
        if whole:
            return await receive()
        now = time.monotonic()
        deadline = deadline or now + total_s
        wait_s = min(idle_s, deadline - now)
        try:
            message = await asyncio.wait_for(receive(), timeout=max(wait_s, 0.0))
        except TimeoutError:
            late = "stopped arriving" if wait_s == idle_s else "took too long"
            limit = idle_s if wait_s == idle_s else total_s
            raise BodyTimedOut(f"the request body {late} (limit {limit:g} s)") from None
        whole = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    return wrapped


def _too_large(cap: int) -> ASGIApp:
    return error_response(413, "body_too_large", f"the request body is over its cap of {cap} bytes")
