"""A real corral server on loopback, run by uvicorn in a thread, with real tokens."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from corral.config import Settings
from corral.owner import ServerInfo
from corral.server.app import build_app
from corral.service import Service
from corral.tokens import Tokens, load_tokens
from tests.conftest import make_settings


@dataclass
class RunningServer:
    settings: Settings
    tokens: Tokens | None
    base_url: str
    service: Service

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    def client(
        self, token: str | None = "agent", headers: dict[str, str] | None = None
    ) -> httpx.Client:
        """An HTTP client; `token` is "agent", "admin", a literal token, or None for none."""
        merged = dict(headers or {})
        if token is not None and self.tokens is not None:
            value = {"agent": self.tokens.agent, "admin": self.tokens.admin}.get(token, token)
            merged.setdefault("Authorization", f"Bearer {value}")
        return httpx.Client(base_url=self.base_url, headers=merged, timeout=120)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_server(
    settings: Settings, tokens: Tokens | None, problem: str | None = None
) -> tuple[RunningServer, uvicorn.Server, threading.Thread]:
    service = Service(settings)
    app = build_app(settings, service, tokens, problem)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    # What `corral serve` does once it listens, so the CLI finds this server the same way.
    service.owner.publish(ServerInfo.for_address("127.0.0.1", settings.port))
    url = f"http://127.0.0.1:{settings.port}"
    return RunningServer(settings, tokens, url, service), server, thread


def stop_server(server: uvicorn.Server, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(60)


def settings_at(root: Path, run: Path, **changes: Any) -> Settings:
    """Test settings for a server with its state and config under `root`, on a free port."""
    settings = make_settings(root / "state", run)
    return replace(settings, config_dir=root / "config", port=free_port(), **changes)


@contextlib.contextmanager
def generated_requests_server(root: Path) -> Iterator[RunningServer]:
    """A server of its own for generated requests: they create, restart and delete sessions
    up to its small cap and run generated code, which would disturb a shared server. Its
    limits are short, so no generated code holds a request long. It has no Chromium: a
    browser route checks its request and answers that no browser is there, at once (loading
    pages is tested in tests/browser and test_browser_api)."""
    run = Path(tempfile.mkdtemp(prefix="crgr", dir="/tmp"))
    settings = settings_at(
        root,
        run,
        max_sessions=4,
        exec_timeout_s=5.0,
        interrupt_grace_s=1.0,
        max_output_bytes=20_000,
        max_body_bytes=200_000,
        max_upload_bytes=1_000_000,
        browser_chromium=str(root / "no-chromium"),
    )
    tokens = load_tokens(settings.config_dir, env={})
    running, uv, thread = start_server(settings, tokens)
    try:
        yield running
    finally:
        stop_server(uv, thread)
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="session")
def server_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    root = tmp_path_factory.mktemp("server")
    run = Path(tempfile.mkdtemp(prefix="crv", dir="/tmp"))
    settings = settings_at(
        root,
        run,
        max_upload_bytes=1_000_000,
        max_body_bytes=200_000,
        progress_interval_s=0.5,
        max_sessions=8,
    )
    yield settings
    shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="session")
def server(server_settings: Settings) -> Iterator[RunningServer]:
    """One server for the whole run: tests use their own session ids."""
    tokens = load_tokens(server_settings.config_dir, env={})
    running, uv, thread = start_server(server_settings, tokens)
    try:
        yield running
    finally:
        stop_server(uv, thread)


@pytest.fixture
def sid(server: RunningServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A running session named after the test, deleted afterwards (the server is shared)."""
    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name)[:50]
    with server.client() as http:
        response = http.post("/v1/sessions", json={"id": name})
        assert response.status_code == 201, response.text
    yield name
    with server.client() as http:
        http.delete(f"/v1/sessions/{name}")


@contextlib.contextmanager
def variant_server(
    base: Settings, *, with_tokens: bool = True, token_problem: str | None = None, **changes: Any
) -> Iterator[RunningServer]:
    """A second real server with `changes` to `base`, in fresh directories, stopped on exit.

    `with_tokens=False` starts it without tokens (failing closed with `token_problem`).
    """
    run = Path(tempfile.mkdtemp(prefix="crw", dir="/tmp"))
    settings = replace(
        base,
        port=free_port(),
        run_root=run,
        state_dir=run / "state",
        config_dir=run / "config",
        **changes,
    )
    tokens = load_tokens(settings.config_dir, env={}) if with_tokens else None
    running, uv, thread = start_server(settings, tokens, token_problem)
    try:
        yield running
    finally:
        stop_server(uv, thread)
        shutil.rmtree(run, ignore_errors=True)


def corral(server: RunningServer, *args: str, port: int | None = None) -> tuple[int, str]:
    """`corral ARGS...` as a subprocess against `server`, found from its state directory's
    runtime file (or at `port` on loopback, through CORRAL_URL): (exit code, stdout + stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        CORRAL_CONFIG_DIR=str(server.settings.config_dir),
        CORRAL_STATE_DIR=str(server.settings.state_dir),
        COLUMNS="200",
    )
    if port is not None:
        env["CORRAL_URL"] = f"http://127.0.0.1:{port}"
    done = subprocess.run(
        [sys.executable, "-m", "corral", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).parent,
    )
    return done.returncode, done.stdout + done.stderr
