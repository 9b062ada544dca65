"""A session's status changes as an event stream, over real HTTP against real sandboxes.

The events are kept, so the test acts first and reads after, and a client that reconnects
with the last number it saw gets exactly what followed; one part follows live.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from corral.errors import SessionNotFound
from corral.kernels.session import DEFAULT_SESSION
from corral.service import Service
from tests.server.conftest import RunningServer

WATCHED = {"created", "busy", "idle", "kernel_died", "limit", "restarted", "deleted"}


def _lines(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.strip():
            yield json.loads(line)


def _read(http: httpx.Client, sid: str, until: str, **headers: str) -> list[dict[str, Any]]:
    """The session's events (NDJSON) from the number given, up to the first `until`."""
    got: list[dict[str, Any]] = []
    with http.stream(
        "GET",
        f"/v1/sessions/{sid}/events",
        headers={"Accept": "application/x-ndjson", **headers},
    ) as response:
        assert response.status_code == 200, response.read()
        for event in _lines(response):
            got.append(event)
            if event["type"] == until:
                return got
    raise AssertionError(f"the stream ended before {until!r}: {got}")


def test_a_sessions_status_changes_are_a_stream_a_client_resumes(
    server: RunningServer, sid: str
) -> None:
    url = f"/v1/sessions/{sid}/execute"
    with server.client() as http:
        assert http.post(url, json={"code": "1 + 1"}).json()["status"] == "ok"
        spun = http.post(url, json={"code": "while True: pass", "timeout_s": 1}).json()
        assert spun["status"] == "timeout"
        died = http.post(url, json={"code": "import os\nos._exit(1)"}).json()
        assert died["status"] == "died"
        assert http.post(f"/v1/sessions/{sid}/restart").status_code == 200
        events = _read(http, sid, until="restarted")
        kinds = [e["type"] for e in events if e["type"] in WATCHED]
        assert kinds == [
            *("created", "busy", "idle"),
            *("busy", "limit", "idle"),
            *("busy", "kernel_died", "idle"),
            "restarted",
        ]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        limit = next(e for e in events if e["type"] == "limit")
        assert limit["limit"] == "time" and "time limit" in limit["message"]
        idles = [e for e in events if e["type"] == "idle"]
        assert [e["status"] for e in idles] == ["ok", "timeout", "died"]
        # A client that saw up to number 3 gets 4 onwards, nothing twice.
        resumed = _read(http, sid, until="restarted", **{"Last-Event-ID": "3"})
        assert resumed == events[3:]


def test_a_follower_sees_live_changes_until_the_session_is_deleted(
    server: RunningServer, sid: str
) -> None:
    with server.client() as http, server.client() as actor:
        seen = _read(http, sid, until="created")
        acted = threading.Event()

        def act() -> None:
            acted.wait(30)
            actor.post(f"/v1/sessions/{sid}/execute", json={"code": "print('live')"})
            actor.delete(f"/v1/sessions/{sid}")

        worker = threading.Thread(target=act)
        worker.start()
        try:
            with http.stream(
                "GET",
                f"/v1/sessions/{sid}/events",
                params={"after": seen[-1]["seq"]},
                headers={"Accept": "application/x-ndjson"},
            ) as response:
                acted.set()  # the stream is open: now the changes come
                live = list(_lines(response))  # ends when the session is deleted
        finally:
            acted.set()
            worker.join(60)
    assert [e["type"] for e in live if e["type"] in WATCHED] == ["busy", "idle", "deleted"]


def test_events_of_an_unknown_session_are_a_404(server: RunningServer) -> None:
    with server.client() as http:
        response = http.get("/v1/sessions/nobody-here/events")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "session_not_found"


async def test_the_default_session_is_followed_before_its_first_use_not_once_deleted(
    service: Service,
) -> None:
    """Found by the conformance run's stateful phase: a deleted default session's events
    answered an empty 200 where any other deleted session's answer 404."""
    service.follow_session(DEFAULT_SESSION)  # not created yet: a client may wait for it
    assert (await service.executions.run("1 + 1")).status == "ok"
    await service.delete_session(DEFAULT_SESSION)
    with pytest.raises(SessionNotFound):
        service.follow_session(DEFAULT_SESSION)
    assert (await service.executions.run("2 + 2")).status == "ok"  # it comes back at its next use
    service.follow_session(DEFAULT_SESSION)
