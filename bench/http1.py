"""A minimal keep-alive HTTP/1.1 client for the REST round trip, so that the bench measures
the server rather than a client library (httpx adds about 1 ms per request of its own here).

It speaks only what the bench needs: JSON requests and responses with a Content-Length, on
one connection that stays open.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

MAX_HEADER_LINES = 100


class KeepAliveClient:
    """One open connection to `host:port`; requests go one at a time."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host = host
        self.port = port
        self.headers = headers
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """POST `body` as JSON; the status and the decoded JSON answer."""
        return await self.request("POST", path, body)

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        """`method` with `body` as JSON (none when None); the status and the decoded JSON
        answer (None for an empty one, such as a 204's)."""
        if self._reader is None or self._writer is None:
            raise RuntimeError("the client is not open")
        payload = b"" if body is None else json.dumps(body).encode()
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        head += [f"{name}: {value}" for name, value in self.headers.items()]
        if body is not None:
            head.append("Content-Type: application/json")
        head += [f"Content-Length: {len(payload)}", "", ""]
        self._writer.write("\r\n".join(head).encode() + payload)
        status, length = await self._read_head(self._reader)
        answer = await self._reader.readexactly(length)
        return status, json.loads(answer) if answer else None

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> tuple[int, int]:
        status = int((await reader.readline()).split()[1])
        length = 0
        for _ in range(MAX_HEADER_LINES):
            line = (await reader.readline()).strip()
            if not line:
                return status, length
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        raise RuntimeError("the server sent more header lines than a response needs")
