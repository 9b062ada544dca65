"""A session's limits through the edges: the admin REST routes over real HTTP, and `corral limits`
against the running server.

Runs against the shared real server (tests/server/conftest.py), with its default limits and the
mechanism this host offers. Every test changes only the session made for it (`sid`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import httpx
import pytest

from corral.sandbox.boxes import CgroupV1Box
from corral.sandbox.limits import best_effort, detect_mechanism
from tests.server.conftest import RunningServer, corral

MIB = 1024 * 1024
GIB = 1024 * MIB


def call(
    server: RunningServer, role: str | None, method: str, path: str, body: Any = None
) -> httpx.Response:
    """A request with the agent's or the admin's token (None: no token); bytes go as they are."""
    with server.client(role) as http:
        if isinstance(body, bytes):
            return http.request(
                method, path, content=body, headers={"Content-Type": "application/json"}
            )
        return http.request(method, path, json=body)


def limits_path(sid: str) -> str:
    return f"/v1/admin/sessions/{sid}/limits"


def current(server: RunningServer, sid: str) -> dict[str, Any]:
    response = call(server, "admin", "GET", limits_path(sid))
    assert response.status_code == 200, response.text
    limits: dict[str, Any] = response.json()["limits"]
    return limits


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["message"]


# -- GET and PATCH ---------------------------------------------------------------------------


def test_admin_reads_limits_mechanism_and_usage(server: RunningServer, sid: str) -> None:
    response = call(server, "admin", "GET", limits_path(sid))
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["session_id"] == sid
    assert report["limits"] == asdict(server.settings.limits)
    assert report["mechanism"] == detect_mechanism().name
    assert {"memory", "cpu", "tasks", "workspace", "tmpfs", "time", "output", "idle"} <= set(
        report["enforcement"]
    )
    assert report["usage"]["memory_bytes"] > 0 and report["usage"]["tasks"] >= 1
    assert report["usage"]["cpu_seconds"] > 0  # starting the kernel took some
    assert report["best_effort"] == list(best_effort(detect_mechanism().name))


def test_admin_changes_limits_of_a_running_session_at_once(server: RunningServer, sid: str) -> None:
    response = call(server, "admin", "PATCH", limits_path(sid), {"memory_bytes": "1G", "tasks": 64})
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["limits"]["memory_bytes"], report["limits"]["tasks"]) == (GIB, 64)
    assert (report["changed_now"], report["changed_at_next_start"]) == (
        ["memory_bytes", "tasks"],
        [],
    )
    assert current(server, sid)["memory_bytes"] == GIB

    box = server.service.sessions.session(sid).box
    assert box is not None and box.limits.tasks == 64
    if isinstance(box, CgroupV1Box):
        assert (box.dirs["pids"] / "pids.max").read_text().strip() == "64"
        assert int((box.dirs["memory"] / "memory.limit_in_bytes").read_text()) == GIB


def test_tmp_size_changes_at_the_next_start(server: RunningServer, sid: str) -> None:
    response = call(server, "admin", "PATCH", limits_path(sid), {"tmp_bytes": "256M"})
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["changed_now"], report["changed_at_next_start"]) == ([], ["tmp_bytes"])
    assert report["limits"]["tmp_bytes"] == 256 * MIB


def test_a_change_is_audited_as_an_admin_action(server: RunningServer, sid: str) -> None:
    changed = call(server, "admin", "PATCH", limits_path(sid), {"cpus": 0.5})
    assert changed.status_code == 200, changed.text
    with server.client("admin") as admin:
        entries = admin.get("/v1/admin/audit", params={"session": sid, "kind": "admin"}).json()
    [entry] = entries["entries"]
    assert (entry["action"], entry["actor"]) == ("set_limits", "admin")
    assert entry["detail"] == {"changes": {"cpus": 0.5}}


def test_changes_stay_through_a_stop_and_start(server: RunningServer, sid: str) -> None:
    assert call(server, "admin", "PATCH", limits_path(sid), {"tasks": 100}).status_code == 200
    with server.client() as http:
        assert http.post(f"/v1/sessions/{sid}/stop").status_code == 200
        assert call(server, "admin", "GET", limits_path(sid)).json()["usage"] is None
        started = http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})  # starts it
        assert started.json()["status"] == "ok", started.text
    assert current(server, sid)["tasks"] == 100
    box = server.service.sessions.session(sid).box
    assert box is not None and box.limits.tasks == 100


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PATCH"])
def test_agent_token_is_refused(server: RunningServer, sid: str, method: str) -> None:
    response = call(server, "agent", method, limits_path(sid), {"tasks": 9})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "admin_only"
    assert current(server, sid)["tasks"] == server.settings.tasks


def test_no_token_is_refused(server: RunningServer, sid: str) -> None:
    assert call(server, None, "GET", limits_path(sid)).status_code == 401


@pytest.mark.parametrize(
    ("body", "status", "code", "words"),
    [
        # What the schema admits but the limit's meaning refuses is 400.
        ({"memory_bytes": "1M"}, 400, "invalid_input", "at least 128 MiB"),
        ({"workspace_bytes": "0"}, 400, "invalid_input", "must be positive"),
        ({"memory_bytes": "9999999T"}, 400, "invalid_input", "must be at most 8192 TiB"),
        ({"memory_bytes": 2**71}, 422, "invalid_body", "less than or equal to"),
        ({"tasks": 2**40}, 422, "invalid_body", "less than or equal to 4194304"),
        (b"{not json", 400, "invalid_input", "not valid JSON"),
        # Schema violations are 422 by the API's convention (server/errors.py).
        ({}, 422, "invalid_body", "name at least one limit"),
        ({"cpus": None}, 422, "invalid_body", "give a value for cpus, or leave it out"),
        ({"memory_bytes": "lots"}, 422, "invalid_body", "'lots' is not a size"),
        ({"workspace_bytes": -5}, 422, "invalid_body", "greater than or equal to 1"),
        ({"swap_bytes": "1G"}, 422, "invalid_body", "swap_bytes"),
        ({"tasks": 4}, 422, "invalid_body", "tasks"),
        ({"cpus": 0}, 422, "invalid_body", "cpus"),
        ({"cpus": "many"}, 422, "invalid_body", "cpus"),
        ({"output_bytes": True}, 422, "invalid_body", "output_bytes"),
        ({"workspace_bytes": 1.5}, 422, "invalid_body", "workspace_bytes"),
        (b'{"cpus": NaN}', 422, "invalid_body", "cpus"),
    ],
)
def test_a_bad_body_is_refused_and_changes_nothing(
    server: RunningServer, sid: str, body: Any, status: int, code: str, words: str
) -> None:
    before = current(server, sid)
    response = call(server, "admin", "PATCH", limits_path(sid), body)
    got_status, got_code, message = error_of(response)
    assert (got_status, got_code) == (status, code), response.text
    assert words in message
    assert current(server, sid) == before


@pytest.mark.parametrize("method", ["GET", "PATCH"])
def test_unknown_session_is_404(server: RunningServer, method: str) -> None:
    response = call(server, "admin", method, limits_path("ghost-limits"), {"tasks": 9})
    assert error_of(response)[:2] == (404, "session_not_found")


def test_memory_below_usage_is_409_and_changes_nothing(server: RunningServer, sid: str) -> None:
    if detect_mechanism().name == "rlimit":
        pytest.skip("rlimit mode cannot refuse: RLIMIT_DATA may be set below what is in use")
    with server.client() as http:
        held = http.post(f"/v1/sessions/{sid}/execute", json={"code": "x = b'x' * (150 << 20)"})
        assert held.json()["status"] == "ok", held.text
    usage = call(server, "admin", "GET", limits_path(sid)).json()["usage"]["memory_bytes"]
    assert usage > 128 * MIB
    response = call(server, "admin", "PATCH", limits_path(sid), {"memory_bytes": "128M"})
    status, code, message = error_of(response)
    assert (status, code) == (409, "conflict"), response.text
    assert "refused memory=134217728" in message
    assert current(server, sid)["memory_bytes"] == server.settings.memory_bytes
    with server.client() as http:
        still = http.post(f"/v1/sessions/{sid}/execute", json={"code": "len(x)"}).json()
    assert still["results"] == [{"text/plain": str(150 * MIB)}]


# -- corral limits ---------------------------------------------------------------------------


def test_corral_limits_show(server: RunningServer, sid: str) -> None:
    code, text = corral(server, "limits", "show", sid)
    assert code == 0, text
    assert text.startswith(f"session {sid}: limits enforced by {detect_mechanism().name}\n")
    assert "  memory_bytes     2 GiB\n" in text
    assert "  tasks            256\n" in text
    assert "  cpus             1\n" in text
    assert " tasks\n" in text and "  using " in text
    weak = ", ".join(best_effort(detect_mechanism().name))
    assert f"  best effort here (held by a watchdog, not the kernel): {weak}\n" in text


def test_corral_limits_set_changes_the_running_server(server: RunningServer, sid: str) -> None:
    code, text = corral(
        server,
        "limits",
        "set",
        sid,
        *("--memory", "1G", "--cpus", "0.5", "--tasks", "64", "--workspace", "2G"),
        *("--tmp", "256M", "--timeout", "60", "--idle", "600", "--output", "100000"),
        *("--files", "5000"),
    )
    assert code == 0, text
    assert "  memory_bytes     1 GiB\n" in text and "  tasks            64\n" in text
    assert "from the next start: tmp_bytes\n" in text
    assert current(server, sid) == {
        "memory_bytes": GIB,
        "cpus": 0.5,
        "tasks": 64,
        "workspace_bytes": 2 * GIB,
        "tmp_bytes": 256 * MIB,
        "exec_timeout_s": 60.0,
        "idle_timeout_s": 600.0,
        "output_bytes": 100_000,
        "workspace_files": 5000,
    }


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--memory", "lots"), "'lots' is not a size"),
        (("--memory", "1M"), "at least 128 MiB"),
        (("--tasks", "2"), "tasks: Input should be greater than or equal to 8"),
    ],
)
def test_corral_limits_set_refuses_bad_values(
    server: RunningServer, sid: str, args: tuple[str, ...], words: str
) -> None:
    code, text = corral(server, "limits", "set", sid, *args)
    assert code == 1 and words in text, text
    assert current(server, sid) == asdict(server.settings.limits)


def test_corral_limits_set_needs_a_limit(server: RunningServer, sid: str) -> None:
    code, text = corral(server, "limits", "set", sid)
    assert code == 2 and "name at least one limit" in text, text


def test_corral_limits_show_of_an_unknown_session(server: RunningServer) -> None:
    code, text = corral(server, "limits", "show", "ghost-limits")
    assert code == 1 and "Session 'ghost-limits' not found." in text, text
