"""`corral mcp-stdio` beside a running server: the client's stdio relayed to the server's /mcp.

A client that only speaks stdio (Claude Desktop) then shares the server's sessions with its
HTTP clients, and no second service is opened on the state (`corral.owner`). Both ends are
the MCP SDK's own transports: its stdio server streams on one side, its streamable-HTTP
client streams on the other; messages are pumped both ways unchanged, so the HTTP transport
keeps the MCP session id the server assigns at `initialize`.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterable
from typing import Protocol, TypeVar

import anyio
from mcp.client.streamable_http import streamable_http_client
from mcp.server.stdio import stdio_server
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage

T_contra = TypeVar("T_contra", contravariant=True)


class _Sink(Protocol[T_contra]):
    async def send(self, item: T_contra, /) -> None: ...


async def relay_stdio(mcp_url: str, token: str) -> None:
    """Relay MCP between this process's stdin/stdout and `mcp_url` until stdin closes."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        stdio_server() as (from_client, to_client),
        to_client,  # closed at the end, so the stdio server's writer ends and we exit
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(mcp_url, http_client=http) as (from_server, to_server),
        anyio.create_task_group() as pumps,
    ):

        async def client_to_server() -> None:
            await _pump(from_client, to_server, "the client")
            pumps.cancel_scope.cancel()  # stdin closed: the client is gone

        async def server_to_client() -> None:
            await _pump(from_server, to_client, "the server")
            pumps.cancel_scope.cancel()

        pumps.start_soon(client_to_server)
        pumps.start_soon(server_to_client)


async def _pump(
    source: AsyncIterable[SessionMessage | Exception], sink: _Sink[SessionMessage], side: str
) -> None:
    """Forward every message; a transport's error (a line that is not JSON-RPC, a failed
    POST) is reported on stderr, never on the protocol stream."""
    async for message in source:
        if isinstance(message, Exception):
            print(f"corral mcp-stdio: from {side}: {message}", file=sys.stderr)
            continue
        await sink.send(message)
