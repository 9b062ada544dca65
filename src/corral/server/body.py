"""Caps on request bodies, enforced before a route reads them.

A declared Content-Length over the cap is refused at once; a chunked body is counted as it
arrives and cut off with 413 when it passes the cap.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.errors import TooLarge
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
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.upload_bytes = upload_bytes
        self.upload_suffix = upload_suffix

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
            await self.app(scope, _counting(receive, cap), tracking_send)
        except BodyTooLarge:
            if not started:
                await _too_large(cap)(scope, receive, send)


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


def _too_large(cap: int) -> ASGIApp:
    return error_response(413, "body_too_large", f"the request body is over its cap of {cap} bytes")
