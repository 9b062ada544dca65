"""A real server of the dashboard tests' own on loopback, and logged-in HTTP clients."""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.tokens import load_tokens
from tests.server.conftest import RunningServer, settings_at, start_server, stop_server

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server for one module: its tests stop, restart and delete sessions."""
    root = tmp_path_factory.mktemp("dashboard")
    run = Path(tempfile.mkdtemp(prefix="crd", dir="/tmp"))
    settings = settings_at(root, run, max_sessions=6)
    running, uv, thread = start_server(settings, load_tokens(settings.config_dir, env={}))
    try:
        yield running
    finally:
        stop_server(uv, thread)
        shutil.rmtree(run, ignore_errors=True)


@contextlib.contextmanager
def logged_in(server: RunningServer) -> Iterator[tuple[httpx.Client, str]]:
    """A client holding a dashboard login (its cookie), and the login's CSRF token."""
    assert server.tokens is not None
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client, _log_in(server, client)


def _log_in(server: RunningServer, client: httpx.Client) -> str:
    assert server.tokens is not None
    answer = client.post(
        "/ui/login",
        data={"token": server.tokens.admin, "next": "/ui/"},
        headers={"Origin": server.base_url},
    )
    assert answer.status_code == 303, answer.text
    page = client.get("/ui/")
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found is not None
    return found.group(1)
