"""Calls to a served corral (`served.py`) for the endurance tests: each on a fresh client,
a dropped connection an answer too; and the waits and faults they share."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.endurance.served import Served

WAIT_S = 30.0  # the bound of every wait for something the test set in motion


@dataclass(frozen=True)
class Answer:
    """What one HTTP call got: a status and body, or the transport error instead."""

    status: int | None
    body: Any
    error: str | None = None

    @property
    def json_message(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return str(self.body["error"].get("message"))
        return None


def call(server: Served, method: str, path: str, **kwargs: Any) -> Answer:
    """One request on a fresh client; a dropped connection is an answer too."""
    with server.client(timeout_s=120) as http:
        try:
            response = http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            return Answer(None, None, f"{type(exc).__name__}: {exc}")
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return Answer(response.status_code, body)


def execute(server: Served, session_id: str, code: str, **extra: Any) -> dict[str, Any]:
    answer = call(
        server, "POST", f"/v1/sessions/{session_id}/execute", json={"code": code, **extra}
    )
    assert answer.status == 200, answer
    result: dict[str, Any] = answer.body
    return result


def create(server: Served, session_id: str) -> None:
    answer = call(server, "POST", "/v1/sessions", json={"id": session_id})
    assert answer.status == 201, answer


def put_file(server: Served, session_id: str, path: str, data: bytes) -> Answer:
    return call(
        server,
        "PUT",
        f"/v1/sessions/{session_id}/files/content",
        params={"path": path},
        content=data,
    )


def read_file(server: Served, session_id: str, path: str) -> bytes | None:
    with server.client() as http:
        response = http.get(f"/v1/sessions/{session_id}/files/content", params={"path": path})
    return response.content if response.status_code == 200 else None


def sessions(server: Served) -> dict[str, dict[str, Any]]:
    answer = call(server, "GET", "/v1/sessions")
    assert answer.status == 200, answer
    return {info["id"]: info for info in answer.body["sessions"]}


def audit(server: Served, **filters: str) -> list[dict[str, Any]]:
    with server.client("admin") as http:
        response = http.get("/v1/admin/audit", params={"limit": "1000", **filters})
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()["entries"]
    return entries


def wait_until(check: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(0.05)


@contextlib.contextmanager
def locked_database(path: Path) -> Iterator[None]:
    """Another program holding the write lock of the state database (BEGIN EXCLUSIVE)."""
    db = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        db.execute("BEGIN EXCLUSIVE")
        yield
        db.execute("ROLLBACK")
    finally:
        db.close()
