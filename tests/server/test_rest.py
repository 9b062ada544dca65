"""The /v1 REST API over real HTTP against real sandboxes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from starlette.routing import Route

from corral.server.routes import OPERATIONS
from tests.server.conftest import RunningServer


def test_session_lifecycle(server: RunningServer) -> None:
    with server.client() as http:
        created = http.post("/v1/sessions", json={"id": "rest-life"})
        assert created.status_code == 201
        assert created.json()["id"] == "rest-life" and created.json()["state"] == "idle"
        assert "rest-life" in [s["id"] for s in http.get("/v1/sessions").json()["sessions"]]
        assert http.get("/v1/sessions/rest-life").json()["kernels"] == ["python"]
        assert http.post("/v1/sessions", json={"id": "rest-life"}).status_code == 409
        assert http.post("/v1/sessions/rest-life/restart").json()["state"] == "idle"
        assert http.post("/v1/sessions/rest-life/stop").json()["state"] == "stopped"
        assert http.delete("/v1/sessions/rest-life").status_code == 204
        assert http.get("/v1/sessions/rest-life").status_code == 404


def test_execute_returns_the_result_model(server: RunningServer, sid: str) -> None:
    with server.client() as http:
        body = http.post(
            f"/v1/sessions/{sid}/execute",
            json={"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\n7"},
        ).json()
    assert (body["status"], body["stdout"], body["stderr"]) == ("ok", "out\n", "err\n")
    assert body["results"] == [{"text/plain": "7"}]


def test_execute_without_session_uses_the_default(server: RunningServer) -> None:
    with server.client() as http:
        body = http.post("/v1/execute", json={"code": "echo hi", "language": "bash"}).json()
    assert body["session_id"] == "default" and body["stdout"] == "hi\n"


def test_execute_streams_server_sent_events(server: RunningServer, sid: str) -> None:
    code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)"
    with (
        server.client() as http,
        http.stream(
            "POST",
            f"/v1/sessions/{sid}/execute",
            json={"code": code},
            headers={"Accept": "text/event-stream"},
        ) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.iter_lines())
    # The kernel may split or join its output: the text and the order are the contract,
    # never the number of events.
    assert joined(events, "stdout") == "0\n1\n2\n"
    assert events[0] == (
        "execution",
        {"id": response.headers["x-corral-execution-id"], "session_id": sid},
    )
    assert [name for name, _ in events][-1] == "result"
    assert {name for name, _ in events[1:-1]} == {"stdout"}
    assert [data["seq"] for _, data in events[1:-1]] == list(range(1, len(events) - 1))
    assert events[-1][1]["stdout"] == "0\n1\n2\n"


def test_execute_streams_ndjson(server: RunningServer) -> None:
    with (
        server.client() as http,
        http.stream(
            "POST",
            "/v1/execute",
            json={"code": "print(1)\n1/0"},
            headers={"Accept": "application/x-ndjson"},
        ) as response,
    ):
        lines = [json.loads(line) for line in response.iter_lines() if line]
    kinds = distinct_in_order([line["type"] for line in lines])
    assert kinds == ["execution", "stdout", "error", "result"]
    assert "".join(line["text"] for line in lines if line["type"] == "stdout") == "1\n"
    assert lines[-1]["status"] == "error"


def test_streaming_to_an_unknown_session_is_a_plain_404(server: RunningServer) -> None:
    with server.client() as http:
        response = http.post(
            "/v1/sessions/nobody/execute",
            json={"code": "1"},
            headers={"Accept": "text/event-stream"},
        )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "session_not_found"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"[1, 2]", 422),
        (b'{"code": 5}', 422),
        (b'{"code": "1", "language": "ruby"}', 422),
        (b'{"code": "1", "timeout_s": -1}', 422),
        (b'{"code": "1", "unexpected": true}', 422),
    ],
)
def test_malformed_bodies_are_refused_clearly(
    server: RunningServer, body: bytes, status: int
) -> None:
    with server.client() as http:
        response = http.post(
            "/v1/execute", content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == status
    assert response.json()["error"]["message"]


def test_a_timeout_over_the_cap_runs_with_the_cap(server: RunningServer) -> None:
    with server.client() as http:
        response = http.post("/v1/execute", json={"code": "6 * 7", "timeout_s": 10_000})
    assert response.status_code == 200, response.text
    assert response.json()["results"] == [{"text/plain": "42"}]


def _example(path: str) -> str:
    return re.sub(r"{(\w+)}", lambda m: "1" if m.group(1) == "rid" else "x", path)


def test_a_method_a_path_does_not_take_is_405_naming_those_it_does(server: RunningServer) -> None:
    methods: dict[str, set[str]] = {}
    for op in OPERATIONS:
        methods.setdefault(op.documented_path, set()).add(op.method)
    with server.client() as agent, server.client("admin") as admin:
        for path, allowed in methods.items():
            http = admin if path.startswith("/v1/admin/") else agent
            for method in ("TRACE", *({"PUT", "PATCH", "DELETE"} - allowed)):
                response = http.request(method, _example(path))
                assert response.status_code == 405, (method, path, response.status_code)
                named = set(response.headers["allow"].replace(" ", "").split(","))
                assert allowed <= named <= allowed | {"HEAD"}, (method, path, named)
                assert response.json()["error"]["code"] == "method_not_allowed"
        assert agent.get("/v1/nowhere").json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("bad", ["..", "a%2Fb", "-lead", "x" * 65])
def test_bad_session_ids_are_refused(server: RunningServer, bad: str) -> None:
    with server.client() as http:
        response = http.get(f"/v1/sessions/{bad}")
    assert response.status_code in (400, 404)
    if response.status_code == 400:
        assert "invalid session id" in response.json()["error"]["message"]


def test_unknown_session_is_404(server: RunningServer) -> None:
    with server.client() as http:
        response = http.post("/v1/sessions/ghost-rest/execute", json={"code": "1"})
    assert response.status_code == 404
    assert "ghost-rest" in response.json()["error"]["message"]


def test_files_upload_list_download_delete(server: RunningServer, sid: str) -> None:
    with server.client() as http:
        put = http.put(
            f"/v1/sessions/{sid}/files/content",
            params={"path": "d/data.bin"},
            content=b"\x00\x01binary",
        )
        assert put.status_code == 201 and put.json()["size_bytes"] == 8
        seen = http.post(
            f"/v1/sessions/{sid}/execute",
            json={"code": "open('/workspace/d/data.bin','rb').read()"},
        ).json()
        assert seen["results"] == [{"text/plain": "b'\\x00\\x01binary'"}]
        listing = http.get(
            f"/v1/sessions/{sid}/files", params={"path": ".", "recursive": "true"}
        ).json()
        assert [e["path"] for e in listing["entries"]] == ["d", "d/data.bin"]
        got = http.get(f"/v1/sessions/{sid}/files/content", params={"path": "d/data.bin"})
        assert got.content == b"\x00\x01binary"
        assert (
            http.delete(
                f"/v1/sessions/{sid}/files", params={"path": "d", "recursive": "true"}
            ).status_code
            == 204
        )
        assert http.get(f"/v1/sessions/{sid}/files").json()["entries"] == []


def test_an_empty_path_is_refused_and_no_body_writes_an_empty_file(
    server: RunningServer, sid: str
) -> None:
    with server.client() as http:
        listed = http.get(f"/v1/sessions/{sid}/files", params={"path": ""})
        assert listed.status_code == 400, listed.text
        assert "use '.' for /workspace" in listed.json()["error"]["message"]
        put = http.put(f"/v1/sessions/{sid}/files/content", params={"path": "empty.txt"})
        assert (put.status_code, put.json()["size_bytes"]) == (201, 0)


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../x", "link/x"])
def test_paths_that_escape_are_refused(server: RunningServer, sid: str, path: str) -> None:
    with server.client() as http:
        http.post(
            f"/v1/sessions/{sid}/execute",
            json={
                "code": "import os\nif not os.path.lexists('/workspace/link'):\n"
                "    os.symlink('/etc', '/workspace/link')"
            },
        )
        put = http.put(f"/v1/sessions/{sid}/files/content", params={"path": path}, content=b"x")
        get = http.get(f"/v1/sessions/{sid}/files/content", params={"path": path})
    assert put.status_code == 400 and get.status_code == 400
    assert put.json()["error"]["code"] == "path_refused"


def test_symlink_to_host_file_is_not_read(server: RunningServer, sid: str) -> None:
    with server.client() as http:
        http.post(
            f"/v1/sessions/{sid}/execute",
            json={"code": "import os; os.symlink('/etc/hostname', '/workspace/h')"},
        )
        response = http.get(f"/v1/sessions/{sid}/files/content", params={"path": "h"})
    assert response.status_code == 400


def test_upload_past_the_cap_is_413_and_writes_nothing(server: RunningServer, sid: str) -> None:
    cap = server.settings.max_upload_bytes
    with server.client() as http:
        response = http.put(
            f"/v1/sessions/{sid}/files/content", params={"path": "big"}, content=b"x" * (cap + 1)
        )
        assert response.status_code == 413
        assert http.get(f"/v1/sessions/{sid}/files").json()["entries"] == []


def test_body_past_the_cap_is_413(server: RunningServer) -> None:
    code = "#" * (server.settings.max_body_bytes + 10)
    with server.client() as http:
        response = http.post("/v1/execute", json={"code": code})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


def test_chunked_body_past_the_cap_is_413(server: RunningServer) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(50):
            yield b"x" * 10_000

    with server.client() as http:
        response = http.post(
            "/v1/execute", content=chunks(), headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 413


def test_missing_file_is_404(server: RunningServer, sid: str) -> None:
    with server.client() as http:
        response = http.get(f"/v1/sessions/{sid}/files/content", params={"path": "nope"})
    assert response.status_code == 404


def test_audit_records_executions_and_pages(server: RunningServer, sid: str) -> None:
    with server.client() as http:
        for i in range(3):
            http.post(f"/v1/sessions/{sid}/execute", json={"code": f"x = {i}"})
    with server.client("admin") as admin:
        first = admin.get(
            "/v1/admin/audit", params={"session": sid, "kind": "execution", "limit": 2}
        ).json()
        assert [e["code"] for e in first["entries"]] == ["x = 2", "x = 1"]
        rest = admin.get(
            "/v1/admin/audit",
            params={"session": sid, "kind": "execution", "before_id": first["next_before_id"]},
        ).json()
        assert [e["code"] for e in rest["entries"]] == ["x = 0"]
        events = admin.get("/v1/admin/audit", params={"session": sid, "kind": "session"}).json()
        assert [e["action"] for e in events["entries"]] == ["created"]


def test_an_audit_page_past_the_documented_limit_is_refused(server: RunningServer) -> None:
    """Found by the conformance run: ?limit=1001 used to be clamped where the document says
    at most 1000."""
    with server.client("admin") as admin:
        assert admin.get("/v1/admin/audit", params={"limit": 1000}).status_code == 200
        refused = admin.get("/v1/admin/audit", params={"limit": 1001})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "limit must be at most 1000, not 1001"


def test_admin_can_stop_any_session_and_it_is_audited(server: RunningServer, sid: str) -> None:
    with server.client("admin") as admin:
        stopped = admin.post(f"/v1/admin/sessions/{sid}/stop")
        assert stopped.json()["state"] == "stopped"
        entries = admin.get("/v1/admin/audit", params={"session": sid, "kind": "session"}).json()[
            "entries"
        ]
        assert (entries[0]["action"], entries[0]["actor"]) == ("stopped", "admin")
        actions = admin.get("/v1/admin/audit", params={"session": sid, "kind": "admin"}).json()
        assert [e["action"] for e in actions["entries"]] == ["stop_session"]


def test_openapi_documents_exactly_the_routes(server: RunningServer) -> None:
    from corral.server.app import build_app

    app = build_app(server.settings, server.service, tokens=None)
    routed = {
        (method, re.sub(r":\w+}", "}", route.path))  # "{filename:path}" is "{filename}"
        for route in app.app.app.routes  # type: ignore[attr-defined]
        if isinstance(route, Route) and route.path != "/mcp"
        for method in (route.methods or ())
        if method != "HEAD"
    }
    documented = {(op.method, op.documented_path) for op in OPERATIONS}
    assert routed == documented
    with server.client() as http:
        doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    served = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert served == documented


def iter_sse_events(lines: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a server-sent event stream, as they arrive."""
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name is not None:
            yield name, json.loads(line[6:])
            name = None


def sse_events(lines: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a whole server-sent event stream."""
    return list(iter_sse_events(lines))


def joined(events: list[tuple[str, dict[str, Any]]], name: str) -> str:
    """The text of every `name` event, in order."""
    return "".join(data["text"] for event, data in events if event == name)


def distinct_in_order(names: list[str]) -> list[str]:
    """`names` with runs of one name collapsed: the order of kinds, whatever the chunking."""
    return [name for i, name in enumerate(names) if i == 0 or names[i - 1] != name]
