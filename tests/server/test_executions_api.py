"""Executions a client can come back to, over real HTTP against real sandboxes.

A client that lost its connection asks for the execution by the id it was given at once
(a header, and the first event of a stream) and resumes its events after the last number
it saw: nothing kept is missed or repeated. The registry's forgetting is tested alone.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import httpx

from corral.errors import ExecutionNotFound
from corral.execution import Execution
from corral.executions import ExecutionRegistry
from tests.server.conftest import RunningServer
from tests.server.test_rest import iter_sse_events, sse_events

COUNTING = "import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.25)"
ALL_LINES = "".join(f"{i}\n" for i in range(8))
DEADLINE_S = 60.0


def _stream(http: httpx.Client, method: str, url: str, **kwargs: Any) -> Any:
    headers = {"Accept": "text/event-stream", **kwargs.pop("headers", {})}
    return http.stream(method, url, headers=headers, **kwargs)


def _numbered(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, str]]:
    return [(data["seq"], data["text"]) for name, data in events if name == "stdout"]


def _read_until(lines: Iterator[str], text: str) -> list[tuple[str, dict[str, Any]]]:
    """The events of a stream up to the first stdout event whose text holds `text`."""
    events: list[tuple[str, dict[str, Any]]] = []
    for name, data in iter_sse_events(lines):
        events.append((name, data))
        if name == "stdout" and text in data["text"]:
            return events
    raise AssertionError(f"the stream ended before {text!r}: {events}")


@contextlib.contextmanager
def _counting(http: httpx.Client, sid: str, upto: str) -> Iterator[tuple[str, list[Any]]]:
    """Start COUNTING as a stream, read it up to `upto`; the connection closes on exit."""
    with _stream(http, "POST", f"/v1/sessions/{sid}/execute", json={"code": COUNTING}) as r:
        yield r.headers["x-corral-execution-id"], _read_until(r.iter_lines(), upto)


def test_a_dropped_stream_resumes_after_its_last_event_with_nothing_lost_or_repeated(
    server: RunningServer, sid: str
) -> None:
    with server.client() as http:
        with _counting(http, sid, "2\n") as (execution_id, seen):
            pass
        # The connection is closed here, mid-run: the code goes on.
        assert seen[0] == ("execution", {"id": execution_id, "session_id": sid})
        before = _numbered(seen)
        last = before[-1][0]
        assert [n for n, _ in before] == list(range(1, last + 1))
        with _stream(http, "GET", f"/v1/executions/{execution_id}/events?after={last}") as r:
            assert r.status_code == 200
            resumed = sse_events(r.iter_lines())
        after = _numbered(resumed)
        assert [n for n, _ in after] == list(range(last + 1, last + 1 + len(after)))
        assert "".join(text for _, text in before + after) == ALL_LINES
        assert resumed[-1][0] == "result" and resumed[-1][1]["stdout"] == ALL_LINES
        # The SSE way to say the same: Last-Event-ID, as a browser's EventSource sends it.
        again_headers = {"Last-Event-ID": str(last)}
        url = f"/v1/executions/{execution_id}/events"
        with _stream(http, "GET", url, headers=again_headers) as r:
            assert _numbered(sse_events(r.iter_lines())) == after
        state = http.get(f"/v1/executions/{execution_id}").json()
    assert (state["state"], state["session_id"], state["events"]) == (
        "done",
        sid,
        last + len(after),
    )
    assert state["result"]["stdout"] == ALL_LINES and state["events_cut"] is False


def test_a_plain_call_names_its_execution_which_keeps_its_result(
    server: RunningServer, sid: str
) -> None:
    with server.client() as http:
        response = http.post(f"/v1/sessions/{sid}/execute", json={"code": "print('hi')\n6 * 7"})
        execution_id = response.headers["x-corral-execution-id"]
        state = http.get(f"/v1/executions/{execution_id}").json()
        listed = http.get("/v1/executions", params={"session_id": sid}).json()["executions"]
        ndjson = http.get(
            f"/v1/executions/{execution_id}/events",
            headers={"Accept": "application/x-ndjson"},
        )
    assert state["state"] == "done" and state["failure"] is None
    assert state["result"] == response.json()
    assert listed[0]["id"] == execution_id and "result" not in listed[0]
    kinds = [json.loads(line)["type"] for line in ndjson.text.splitlines()]
    assert (kinds[0], kinds[-1]) == ("stdout", "result")


def test_a_running_execution_says_so_and_its_stream_follows_to_the_end(
    server: RunningServer, sid: str
) -> None:
    with server.client() as http:
        with _counting(http, sid, "0\n") as (execution_id, _):
            pass
        state = http.get(f"/v1/executions/{execution_id}").json()
        assert state["state"] in ("running", "done")  # it may end before the look
        with _stream(http, "GET", f"/v1/executions/{execution_id}/events") as r:
            followed = sse_events(r.iter_lines())
    assert "".join(text for _, text in _numbered(followed)) == ALL_LINES
    assert followed[-1][0] == "result"


def test_an_unknown_execution_is_a_404_saying_how_long_they_are_kept(
    server: RunningServer,
) -> None:
    with server.client() as http:
        for path in ("/v1/executions/ex-0123456789abcdef", "/v1/executions/nope/events"):
            response = http.get(path)
            assert response.status_code == 404, path
            error = response.json()["error"]
            assert error["code"] == "execution_not_found"
            assert "ended executions are kept for 600 s" in error["message"]


@dataclass
class Ended:
    """What the registry reads of an execution."""

    id: str
    session_id: str
    created_at: float
    ended_at: float | None


def _ended(name: str, ago_s: float) -> Execution:
    now = time.time()
    return cast(Execution, Ended(name, "s", now - ago_s - 1, now - ago_s))


def test_the_registry_forgets_ended_executions_by_age_and_by_count() -> None:
    registry = ExecutionRegistry(keep_s=60, keep_count=2)
    running = _ended("running", 0)
    running.ended_at = None
    registry.add(running)
    for name, ago_s in (("old", 120), ("a", 3), ("b", 2), ("c", 1)):
        execution = _ended(name, ago_s)
        registry.add(execution)
        registry.ended(execution)
    assert [e.id for e in registry.listed()] == ["running", "c", "b"]
    assert registry.get("running") is running
    for forgotten in ("old", "a"):
        try:
            registry.get(forgotten)
        except ExecutionNotFound as exc:
            assert "kept for 60 s (the newest 2)" in str(exc)
        else:
            raise AssertionError(f"{forgotten} is still kept")
