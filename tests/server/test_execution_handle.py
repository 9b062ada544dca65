"""One execution handle behind every front-end: the request is checked once, before anything
starts, against the session's own limits; a caller that leaves never stops the code (it runs
to its end and is audited); an explicit MCP cancel interrupts running code and drops a
queued call. Real server, real kernels, real clients.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx

from tests.server.conftest import RunningServer
from tests.server.test_mcp import connect, named_session, run, text_of

WAIT_S = 60


def wait_until(check: Callable[[], Any], what: str) -> Any:
    """`check()`'s first truthy answer, polled until a deadline."""
    deadline = time.monotonic() + WAIT_S
    while not (answer := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return answer


def executions(server: RunningServer, sid: str) -> list[dict[str, Any]]:
    """The session's audited executions, newest first."""
    with server.client("admin") as http:
        page = http.get("/v1/admin/audit", params={"kind": "execution", "session": sid})
    assert page.status_code == 200, page.text
    entries: list[dict[str, Any]] = page.json()["entries"]
    return entries


def audited(server: RunningServer, sid: str, marker: str) -> dict[str, Any] | None:
    """The execution's audit record once it has ended: the record written ahead, before the
    code ran, says "running" until the end is recorded (after the code's last write)."""
    entry = next((e for e in executions(server, sid) if marker in (e["code"] or "")), None)
    return entry if entry is not None and entry["status"] != "running" else None


def session_state(server: RunningServer, sid: str) -> dict[str, Any]:
    with server.client() as http:
        info: dict[str, Any] = http.get(f"/v1/sessions/{sid}").json()
    return info


def read_workspace(server: RunningServer, sid: str, path: str) -> bytes | None:
    with server.client() as http:
        response = http.get(f"/v1/sessions/{sid}/files/content", params={"path": path})
    return response.content if response.status_code == 200 else None


def slow_code(marker: str) -> str:
    """Prints, then keeps running a while, then leaves a file: proof it ran to its end."""
    return (
        f"import time  # {marker}\n"
        "print('started', flush=True)\n"
        "time.sleep(1.5)\n"
        f"open('/workspace/{marker}', 'w').write('finished')\n"
        "print('finished')\n"
    )


# -- validate once ---------------------------------------------------------------------------


def test_a_streamed_request_is_checked_against_the_sessions_raised_timeout(
    server: RunningServer, sid: str
) -> None:
    """After `corral limits set ID --timeout 900`, a streamed 600 s request runs, as the same
    JSON request does (it used to be checked against the default limits and refused)."""
    assert server.settings.limits.exec_timeout_s < 600
    with server.client("admin") as admin:
        raised = admin.patch(f"/v1/admin/sessions/{sid}/limits", json={"exec_timeout_s": 900})
        assert raised.status_code == 200, raised.text
    body = {"code": "print('long allowed')", "timeout_s": 600}
    with server.client() as http:
        plain = http.post(f"/v1/sessions/{sid}/execute", json=body)
        with http.stream(
            "POST",
            f"/v1/sessions/{sid}/execute",
            json=body,
            headers={"Accept": "application/x-ndjson"},
        ) as streamed:
            assert streamed.status_code == 200, streamed.read()
            lines = [json.loads(line) for line in streamed.iter_lines() if line]
    assert plain.status_code == 200 and plain.json()["stdout"] == "long allowed\n"
    assert lines[-1]["type"] == "result" and lines[-1]["stdout"] == "long allowed\n"


def test_a_timeout_that_is_not_positive_is_refused_before_a_kernel_starts(
    server: RunningServer, sid: str
) -> None:
    with server.client() as http:
        assert http.post(f"/v1/sessions/{sid}/stop").json()["state"] == "stopped"
        negative = {"code": "1", "timeout_s": -1}
        plain = http.post(f"/v1/sessions/{sid}/execute", json=negative)
        streamed = http.post(
            f"/v1/sessions/{sid}/execute",
            json=negative,
            headers={"Accept": "text/event-stream"},
        )
        compat = http.post("/execute", json={"code": "1", "session_id": sid, "timeout": 0})
    for response in (plain, streamed):
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "invalid_body"
    assert compat.status_code == 400 and "timeout" in compat.json()["stderr"]
    info = session_state(server, sid)
    assert (info["state"], info["kernels"]) == ("stopped", [])
    assert executions(server, sid) == []


def test_a_bad_language_is_refused_the_same_way_on_every_route(
    server: RunningServer, sid: str
) -> None:
    bad = {"code": "1", "language": "cobol"}
    with server.client() as http:
        plain = http.post(f"/v1/sessions/{sid}/execute", json=bad)
        streamed = http.post(
            f"/v1/sessions/{sid}/execute", json=bad, headers={"Accept": "text/event-stream"}
        )
    assert plain.status_code == streamed.status_code
    assert plain.json() == streamed.json()


# -- a caller that leaves --------------------------------------------------------------------


def test_a_stream_whose_client_leaves_runs_to_its_end_and_is_audited(
    server: RunningServer, sid: str
) -> None:
    marker = "stream-left"
    with (
        server.client() as http,
        http.stream(
            "POST",
            f"/v1/sessions/{sid}/execute",
            json={"code": slow_code(marker)},
            headers={"Accept": "text/event-stream"},
        ) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: ") and "started" in line:
                break  # the client goes away mid-run
    assert wait_until(lambda: read_workspace(server, sid, marker), "the code's end") == b"finished"
    entry = wait_until(lambda: audited(server, sid, marker), "the execution's audit record")
    assert entry["status"] == "ok"


def test_a_json_request_whose_client_leaves_runs_to_its_end_and_is_audited(
    server: RunningServer, sid: str
) -> None:
    marker = "json-left"
    with server.client() as http:
        try:
            http.post(f"/v1/sessions/{sid}/execute", json={"code": slow_code(marker)}, timeout=0.5)
        except httpx.ReadTimeout:
            pass  # the client gave up while the code ran
        else:
            raise AssertionError("the code ended before the client left")
    assert wait_until(lambda: read_workspace(server, sid, marker), "the code's end") == b"finished"
    entry = wait_until(lambda: audited(server, sid, marker), "the execution's audit record")
    assert entry["status"] == "ok"


def test_a_coderunner_request_whose_client_leaves_runs_to_its_end_and_is_audited(
    server: RunningServer, sid: str
) -> None:
    marker = "compat-left"
    with server.client() as http:
        try:
            http.post("/execute", json={"code": slow_code(marker), "session_id": sid}, timeout=0.5)
        except httpx.ReadTimeout:
            pass
        else:
            raise AssertionError("the code ended before the client left")
    assert wait_until(lambda: read_workspace(server, sid, marker), "the code's end") == b"finished"
    entry = wait_until(lambda: audited(server, sid, marker), "the execution's audit record")
    assert entry["status"] == "ok"


# -- an explicit cancel ----------------------------------------------------------------------


async def test_an_mcp_cancel_interrupts_the_running_code_and_audits_it(
    server: RunningServer,
) -> None:
    async with connect(server) as client, named_session(client, "cancel-run") as session_id:
        with anyio.move_on_after(1.5):
            await run(client, "import time  # cancel-me\ntime.sleep(60)", session_id=session_id)
        after = await run(client, "print('free')", session_id=session_id)
        assert text_of(after) == "free\n"
        entry = await asyncio.to_thread(
            wait_until, lambda: audited(server, session_id, "cancel-me"), "the audit record"
        )
    assert entry["status"] == "interrupted"


async def test_an_mcp_cancel_of_a_queued_call_means_it_never_runs(server: RunningServer) -> None:
    async with connect(server) as client, named_session(client, "cancel-queued") as session_id:
        first_code = (
            "import time  # first\n"
            "open('/workspace/first-running', 'w').write('yes')\n"
            "time.sleep(3)\n"
            "print('first')\n"
        )
        first = asyncio.create_task(run(client, first_code, session_id=session_id))
        await asyncio.to_thread(
            wait_until,
            lambda: read_workspace(server, session_id, "first-running"),
            "the first call to run",
        )
        with anyio.move_on_after(0.5):  # queued behind the first the whole time
            await run(
                client,
                "open('/workspace/queued', 'w').write('ran')  # queued",
                session_id=session_id,
            )
        assert text_of(await first) == "first\n"
        after = await run(
            client, "import os; os.path.exists('/workspace/queued')", session_id=session_id
        )
        assert text_of(after) == "False"
        codes = [e["code"] for e in executions(server, session_id)]
    assert not any("# queued" in code for code in codes)


async def test_mcp_progress_carries_the_output_as_it_arrives(server: RunningServer) -> None:
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    code = "import time\nprint('step one', flush=True)\ntime.sleep(3)\nprint('done')"
    async with connect(server) as client:
        result = await client.call_tool(
            "execute_python_code", {"command": code}, progress_callback=on_progress
        )
    assert text_of(result) == "step one\ndone\n"
    assert all(message.startswith("still running") for message in messages), messages
    assert sum(message.count("step one") for message in messages) == 1, messages
