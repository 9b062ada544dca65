"""corral behind its real server, and the clients that measure a round trip through it.

The server runs as `tests/server/conftest.py` runs it: uvicorn in a thread on 127.0.0.1 with a
free port, the whole app from `build_app`, tokens from a throw-away config directory. The REST
client is one `httpx.AsyncClient` (keep-alive); the MCP client is the SDK's `Client` over
streamable HTTP on one `httpx2.AsyncClient`. Both are opened once and reused for every sample.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from corral.config import Settings
from corral.server.app import build_app
from corral.service import Service
from corral.tokens import Tokens, load_tokens

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
CLIENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServedCorral:
    """A running server: where it listens and its tokens."""

    base_url: str
    tokens: Tokens

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    @property
    def auth(self) -> dict[str, str]:
        """The agent's Authorization header."""
        return {"Authorization": f"Bearer {self.tokens.agent}"}


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def served_settings(workdir: Path, run_root: Path, port: int) -> Settings:
    """Default settings with state and tokens under `workdir` and kernel sockets in `run_root`."""
    return Settings(
        state_dir=workdir / "state",
        run_root=run_root,
        config_dir=workdir / "config",
        host=HOST,
        port=port,
    )


@asynccontextmanager
async def served_corral(workdir: Path) -> AsyncIterator[ServedCorral]:
    """A real corral server on loopback whose state and tokens live in `workdir/state|config`.

    Its run root is a new short directory in /tmp (unix socket paths must stay under 108
    bytes). On exit the server shuts down, which stops its kernels, and the run root, state
    and tokens are removed. Raises `RuntimeError` when it does not start.
    """
    run_root = Path(tempfile.mkdtemp(prefix="crw", dir="/tmp"))
    settings = served_settings(workdir, run_root, free_port())
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    # Warnings and errors only: the MCP server would otherwise set the root logger to INFO
    # (a line per HTTP request); stdout stays Markdown either way.
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        tokens = load_tokens(settings.config_dir, env={})
        app = build_app(settings, Service(settings), tokens)
        config = uvicorn.Config(
            app, host=settings.host, port=settings.port, log_level="warning", lifespan="on"
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=asyncio.run, args=(server.serve(),), daemon=True)
        thread.start()
        await _started(server, thread)
        yield ServedCorral(f"http://{settings.host}:{settings.port}", tokens)
    finally:
        if server is not None and thread is not None:
            server.should_exit = True
            await asyncio.to_thread(thread.join, STOP_TIMEOUT_S)
        for directory in (run_root, settings.state_dir, settings.config_dir):
            shutil.rmtree(directory, ignore_errors=True)


async def _started(server: uvicorn.Server, thread: threading.Thread) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the bench's corral server exited while starting")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the bench's corral server did not start in {START_TIMEOUT_S} s")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def rest_client(served: ServedCorral) -> AsyncIterator[httpx.AsyncClient]:
    """One keep-alive REST client with the agent token."""
    async with httpx.AsyncClient(
        base_url=served.base_url, headers=served.auth, timeout=CLIENT_TIMEOUT_S
    ) as client:
        yield client


@asynccontextmanager
async def mcp_client(served: ServedCorral) -> AsyncIterator[Client]:
    """One connected MCP client (streamable HTTP) with the agent token."""
    async with (
        httpx2.AsyncClient(headers=served.auth, timeout=CLIENT_TIMEOUT_S) as http,
        Client(streamable_http_client(served.mcp_url, http_client=http)) as client,
    ):
        yield client


async def create_served_session(client: httpx.AsyncClient, session_id: str) -> None:
    """Create and start `session_id` over REST; raises `RuntimeError` unless it answers 201."""
    response = await client.post("/v1/sessions", json={"id": session_id})
    if response.status_code != 201:
        raise RuntimeError(f"creating session {session_id} answered {response.status_code}")


async def rest_execute(client: httpx.AsyncClient, session_id: str, code: str) -> dict[str, Any]:
    """POST /v1/sessions/{id}/execute; the result, or `RuntimeError` unless it ran ok."""
    response = await client.post(f"/v1/sessions/{session_id}/execute", json={"code": code})
    if response.status_code != 200:
        raise RuntimeError(f"REST {code!r} answered {response.status_code}: {response.text}")
    result: dict[str, Any] = response.json()
    if result["status"] != "ok" or result["kernel_restarted"]:
        raise RuntimeError(f"REST {code!r} ended {result['status']}: {result['message']}")
    return result


async def mcp_execute(client: Client, session_id: str, code: str) -> dict[str, Any]:
    """The execute_python_code tool; its structured result, or `RuntimeError` unless ok."""
    reply = await client.call_tool(
        "execute_python_code", {"command": code, "session_id": session_id}
    )
    result = reply.structured_content
    if reply.is_error or not isinstance(result, dict):
        raise RuntimeError(f"MCP {code!r} failed: {reply.content}")
    if result["status"] != "ok" or result["kernel_restarted"]:
        raise RuntimeError(f"MCP {code!r} ended {result['status']}: {result['message']}")
    return result
