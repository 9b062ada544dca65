"""corral behind its real server, and the clients that measure a round trip through it.

The server is `corral serve` in a process of its own, as users run it (so it does not share
this process's interpreter lock with the clients), on 127.0.0.1 with a free port, the warm
pool off unless asked for, and tokens in a throw-away config directory. The REST client is
one keep-alive HTTP/1.1 connection (`bench.http1`); the MCP client is the SDK's `Client` over
streamable HTTP on one `httpx2.AsyncClient`. Both are opened once and reused for every
sample.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bench.http1 import KeepAliveClient
from corral.tokens import Tokens, load_tokens

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
CLIENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServedCorral:
    """A running server: where it listens and its tokens."""

    base_url: str
    port: int
    tokens: Tokens

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    @property
    def auth(self) -> dict[str, str]:
        """The agent's Authorization header."""
        return {"Authorization": f"Bearer {self.tokens.agent}"}

    @property
    def admin_auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens.admin}"}


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def served_env(workdir: Path, run_root: Path, port: int, *, pool: bool) -> dict[str, str]:
    """The environment of the bench's server: this one without CORRAL_*, then its own.
    Without `pool`, the warm pool is off: no kernel starts in the background while a round
    trip is measured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        CORRAL_STATE_DIR=str(workdir / "state"),
        CORRAL_CONFIG_DIR=str(workdir / "config"),
        CORRAL_RUN_ROOT=str(run_root),
        CORRAL_PORT=str(port),
    )
    if not pool:
        env["CORRAL_POOL_SIZE"] = "0"
    return env


@asynccontextmanager
async def served_corral(workdir: Path, *, pool: bool = False) -> AsyncIterator[ServedCorral]:
    """`corral serve` on loopback whose state and tokens live in `workdir/state|config`,
    with its default warm pool when `pool`.

    Its run root is a new short directory in /tmp (unix socket paths must stay under 108
    bytes). On exit the server gets SIGTERM (which stops its kernels) and the run root, state
    and tokens are removed. Raises `RuntimeError` when it does not start.
    """
    run_root = Path(tempfile.mkdtemp(prefix="crw", dir="/tmp"))
    port = free_port()
    tokens = load_tokens(workdir / "config", env={})  # written now, read by the server
    log_file = (workdir / "serve.log").open("wb")
    process = subprocess.Popen(  # noqa: ASYNC220 (it only forks and execs)
        [sys.executable, "-m", "corral", "serve"],
        env=served_env(workdir, run_root, port, pool=pool),
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    try:
        base_url = f"http://{HOST}:{port}"
        await _healthy(base_url, process, workdir / "serve.log")
        yield ServedCorral(base_url, port, tokens)
    finally:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()
        for directory in (run_root, workdir / "state", workdir / "config"):
            shutil.rmtree(directory, ignore_errors=True)


async def _healthy(base_url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with httpx.AsyncClient(base_url=base_url, timeout=2.0) as client:
        while True:
            if process.poll() is not None:
                tail = log.read_text()[-2000:]  # noqa: ASYNC240 (the run is over)
                raise RuntimeError(f"the bench's corral server exited: {tail}")
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the bench's corral server did not start in {START_TIMEOUT_S} s"
                )
            await asyncio.sleep(0.1)


@asynccontextmanager
async def rest_client(
    served: ServedCorral, *, admin: bool = False
) -> AsyncIterator[KeepAliveClient]:
    """One keep-alive REST connection with the agent token (the admin's when `admin`)."""
    client = KeepAliveClient(HOST, served.port, served.admin_auth if admin else served.auth)
    await client.open()
    try:
        yield client
    finally:
        await client.close()


@asynccontextmanager
async def mcp_client(served: ServedCorral) -> AsyncIterator[Client]:
    """One connected MCP client (streamable HTTP) with the agent token."""
    async with (
        httpx2.AsyncClient(headers=served.auth, timeout=CLIENT_TIMEOUT_S) as http,
        Client(streamable_http_client(served.mcp_url, http_client=http)) as client,
    ):
        yield client


async def create_served_session(client: KeepAliveClient, session_id: str) -> None:
    """Create and start `session_id` over REST; raises `RuntimeError` unless it answers 201."""
    status, answer = await client.post("/v1/sessions", {"id": session_id})
    if status != 201:
        raise RuntimeError(f"creating session {session_id} answered {status}: {answer}")


async def rest_execute(client: KeepAliveClient, session_id: str, code: str) -> dict[str, Any]:
    """POST /v1/sessions/{id}/execute; the result, or `RuntimeError` unless it ran ok."""
    status, result = await client.post(f"/v1/sessions/{session_id}/execute", {"code": code})
    if status != 200:
        raise RuntimeError(f"REST {code!r} answered {status}: {result}")
    if not isinstance(result, dict):
        raise RuntimeError(f"REST {code!r} answered {result!r}, not a result")
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


async def delete_served_session(client: KeepAliveClient, session_id: str) -> None:
    """DELETE /v1/sessions/{id}; raises `RuntimeError` unless it answers 204."""
    status, answer = await client.request("DELETE", f"/v1/sessions/{session_id}")
    if status != 204:
        raise RuntimeError(f"deleting session {session_id} answered {status}: {answer}")


async def wait_pool_full(admin: KeepAliveClient, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll GET /v1/admin/pool (admin token) until the pool holds its target, a kernel or
    more; raises `RuntimeError` past `timeout_s` or when the pool is off."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, pool = await admin.request("GET", "/v1/admin/pool")
        if status != 200:
            raise RuntimeError(f"GET /v1/admin/pool answered {status}: {pool}")
        if pool["size"] == 0:
            raise RuntimeError("the bench's server has its warm pool off")
        if pool["ready"] >= pool["target"] > 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm pool was not full within {timeout_s} s: {pool}")
        await asyncio.sleep(0.05)
