"""The MCP tools through real MCP clients: streamable HTTP against the test server, and stdio.

Every test opens its own client (the SDK's task groups must stay in the task that made them).
The server is shared by the whole run: a test that keeps state uses a session of its own (and
stops it, to free capacity); stateless calls use the default session.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, ImageContent, TextContent

from tests.server.conftest import RunningServer

TOOLS = {
    "execute_python_code",
    "execute_shell_command",
    "start_python_session",
    "list_python_sessions",
    "stop_python_session",
    "list_files",
    "read_file",
    "write_file",
    "request_network_access",
    "navigate_and_get_all_visible_text",
    "list_skills",
    "get_skill_info",
    "get_skill_file",
}
NO_OUTPUT = "[Execution successful with no output]"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "corral-tests", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def connect(server: RunningServer, role: str = "agent") -> AsyncIterator[Client]:
    """An MCP client over streamable HTTP, holding the agent's (or the admin's) token."""
    assert server.tokens is not None
    token = server.tokens.admin if role == "admin" else server.tokens.agent
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(server.mcp_url, http_client=http)) as client,
    ):
        yield client


@contextlib.asynccontextmanager
async def named_session(client: Client, prefix: str) -> AsyncIterator[str]:
    """A session started through the tool, stopped afterwards so it holds no capacity."""
    session_id = unique(prefix)
    started = await client.call_tool("start_python_session", {"session_id": session_id})
    assert not started.is_error, text_of(started)
    try:
        yield session_id
    finally:
        await client.call_tool("stop_python_session", {"session_id": session_id})


def text_of(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


def structured(result: CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None
    return dict(result.structured_content)


async def run(client: Client, code: str, **args: Any) -> CallToolResult:
    return await client.call_tool("execute_python_code", {"command": code, **args})


# -- tools/list ----------------------------------------------------------------------------


async def test_tools_list_is_coderunners_tools_plus_shell_and_files(server: RunningServer) -> None:
    async with connect(server) as client:
        listed = await client.list_tools()
    assert {tool.name for tool in listed.tools} == TOOLS
    assert len(listed.tools) == len(TOOLS)


async def test_every_tool_has_an_input_and_an_output_schema(server: RunningServer) -> None:
    async with connect(server) as client:
        listed = await client.list_tools()
    for tool in listed.tools:
        assert tool.input_schema["type"] == "object", tool.name
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name


READ_ONLY_TOOLS = {
    "list_python_sessions",
    "list_files",
    "read_file",
    "list_skills",
    "get_skill_info",
    "get_skill_file",
    "navigate_and_get_all_visible_text",
}


async def test_every_tool_and_parameter_is_described_for_a_model(server: RunningServer) -> None:
    async with connect(server) as client:
        tools = (await client.list_tools()).tools
    for tool in tools:
        assert tool.annotations is not None and tool.annotations.title, tool.name
        properties = tool.input_schema["properties"]
        undescribed = [name for name, schema in properties.items() if not schema.get("description")]
        assert undescribed == [], (tool.name, undescribed)
    hints = {tool.name: tool.annotations for tool in tools if tool.annotations is not None}
    assert {name for name, hint in hints.items() if hint.read_only_hint} == READ_ONLY_TOOLS
    assert hints["stop_python_session"].destructive_hint is True
    assert hints["start_python_session"].destructive_hint is False
    execute = next(tool for tool in tools if tool.name == "execute_python_code")
    described = execute.input_schema["properties"]["session_id"]["description"]
    assert "default session" in described and "start_python_session" in described


async def test_execute_python_code_takes_coderunners_parameters(server: RunningServer) -> None:
    async with connect(server) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    schema = tools["execute_python_code"].input_schema
    assert set(schema["properties"]) == {"command", "session_id"}
    assert schema["required"] == ["command"]
    assert set(tools["stop_python_session"].input_schema["required"]) == {"session_id"}
    assert "session_id" in tools["start_python_session"].input_schema["properties"]
    assert {"path", "content"} <= set(tools["write_file"].input_schema["required"])


# -- execute_python_code -------------------------------------------------------------------


async def test_output_comes_back_as_coderunners_text(server: RunningServer) -> None:
    async with connect(server) as client:
        result = await run(client, "print(6 * 7)")
    assert not result.is_error
    assert text_of(result) == "42\n"


async def test_code_without_output_says_so(server: RunningServer) -> None:
    async with connect(server) as client:
        result = await run(client, f"_{uuid.uuid4().hex} = 1")
    assert not result.is_error
    assert text_of(result) == NO_OUTPUT


async def test_an_exception_comes_back_as_error_text(server: RunningServer) -> None:
    async with connect(server) as client:
        result = await run(client, "print('before')\n1 / 0")
    text = text_of(result)
    assert "Error: Execution Error:" in text
    assert text.startswith("before\n")
    assert "ZeroDivisionError" in text


async def test_an_exception_alone_starts_with_the_error_marker(server: RunningServer) -> None:
    async with connect(server) as client:
        result = await run(client, "raise KeyError('missing')")
    assert text_of(result).startswith("Error: Execution Error:")
    assert "KeyError" in text_of(result)


async def test_structured_content_is_the_whole_result(server: RunningServer) -> None:
    async with connect(server) as client:
        result = await run(client, "import sys\nprint('out')\nprint('err', file=sys.stderr)\n7")
    body = structured(result)
    assert (body["status"], body["stdout"], body["stderr"]) == ("ok", "out\n", "err\n")
    assert body["results"] == [{"text/plain": "7"}]
    assert body["error"] is None and body["language"] == "python"


async def test_structured_content_carries_coderunners_result_beside_corrals_fields(
    server: RunningServer,
) -> None:
    async with connect(server) as client:
        result = await run(client, "print('out')\n7")
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    body = structured(result)
    assert body["result"] == text_of(result) == "out\n7"
    assert body["status"] == "ok" and body["stdout"] == "out\n"
    schema = tools["execute_python_code"].output_schema
    assert schema is not None and "result" in schema["properties"]
    assert "result" in schema["required"]


@pytest.mark.parametrize(
    ("code", "shown"),
    [
        ("import sys; print('to stderr', file=sys.stderr)", "to stderr"),
        ("import warnings; warnings.warn('careful')", "UserWarning: careful"),
        ("import logging; logging.warning('logged')", "WARNING:root:logged"),
    ],
)
async def test_what_the_code_wrote_to_stderr_reaches_the_model(
    server: RunningServer, code: str, shown: str
) -> None:
    async with connect(server) as client:
        result = await run(client, code)
    assert not result.is_error
    assert shown in text_of(result)
    assert "[Execution successful with no output]" not in text_of(result)


REFUSED_FETCH = (
    "import urllib.request\n"
    "try:\n"
    "    urllib.request.urlopen('http://example.com/', timeout=20)\n"
    "except Exception as error:\n"
    "    print(type(error).__name__)\n"
)


async def test_a_request_the_proxy_refused_is_named_with_how_to_ask(
    server: RunningServer,
) -> None:
    async with connect(server) as client, named_session(client, "mcp-refused") as session_id:
        result = await run(client, REFUSED_FETCH, session_id=session_id)
        quiet = await run(client, "print(1)", session_id=session_id)
    text = text_of(result)
    assert text.startswith("HTTPError\n[corral] "), text
    assert (
        "The network policy refused example.com:80 (mode none: this session has no network)" in text
    )
    assert "request_network_access" in text and "'example.com'" in text
    refused = structured(result)["network_refused"]
    assert refused == [
        {
            "target": "example.com:80",
            "host": "example.com",
            "rule": "mode none: this session has no network",
        }
    ]
    assert structured(quiet)["network_refused"] == [] and "refused" not in text_of(quiet)


async def test_structured_content_of_an_exception_names_it(server: RunningServer) -> None:
    async with connect(server) as client:
        result = await run(client, "1 / 0")
    body = structured(result)
    assert body["status"] == "error"
    assert body["error"]["ename"] == "ZeroDivisionError"


async def test_a_plot_comes_back_as_a_png_image(server: RunningServer) -> None:
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\n"
    async with connect(server) as client, named_session(client, "mcp-plot") as session_id:
        result = await run(client, code, session_id=session_id)
    images = [block for block in result.content if isinstance(block, ImageContent)]
    assert len(images) == 1, text_of(result)
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)
    assert "<Figure" not in text_of(result)
    # The bytes are sent once: the structured result names the image instead of repeating it.
    assert images[0].data not in json.dumps(structured(result))
    [bundle] = [b for b in structured(result)["results"] if "image/png" in b]
    assert bundle["image/png"] == "[sent as image content 1]"


async def test_a_long_execution_reports_progress(server: RunningServer) -> None:
    assert server.settings.progress_interval_s == 0.5
    updates: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, total, message))

    async with connect(server) as client:
        result = await client.call_tool(
            "execute_python_code",
            {"command": "import time\ntime.sleep(2)\nprint('done')"},
            progress_callback=on_progress,
        )
    assert text_of(result) == "done\n"
    assert len(updates) >= 2, updates
    progress = [update[0] for update in updates]
    assert progress == sorted(progress) and progress[0] > 0
    assert all("still running" in (update[2] or "") for update in updates)


# -- sessions ------------------------------------------------------------------------------


async def test_start_python_session_returns_the_session(server: RunningServer) -> None:
    async with connect(server) as client:
        session_id = unique("mcp-start")
        started = await client.call_tool("start_python_session", {"session_id": session_id})
        await client.call_tool("stop_python_session", {"session_id": session_id})
    body = structured(started)
    assert (body["session_id"], body["status"]) == (session_id, "active")
    assert body["created_at"]
    assert session_id in text_of(started)


async def test_variables_persist_in_a_named_session(server: RunningServer) -> None:
    name = f"answer_{uuid.uuid4().hex[:8]}"
    async with connect(server) as client, named_session(client, "mcp-vars") as session_id:
        first = await run(client, f"{name} = 41", session_id=session_id)
        second = await run(client, f"print({name} + 1)", session_id=session_id)
        elsewhere = await run(client, f"print({name!r} in globals())")
    assert text_of(first) == NO_OUTPUT
    assert text_of(second) == "42\n"
    assert structured(second)["session_id"] == session_id
    assert text_of(elsewhere) == "False\n"


async def test_list_python_sessions_shows_a_started_session(server: RunningServer) -> None:
    async with connect(server) as client, named_session(client, "mcp-list") as session_id:
        listed = await client.call_tool("list_python_sessions", {})
    # coderunner's shape: structuredContent["result"] is the list (test-sessions.py reads it)
    sessions = {view["session_id"]: view for view in structured(listed)["result"]}
    assert sessions[session_id]["status"] == "active"


async def test_stop_python_session_says_stopped(server: RunningServer) -> None:
    async with connect(server) as client:
        session_id = unique("mcp-stop")
        await client.call_tool("start_python_session", {"session_id": session_id})
        stopped = await client.call_tool("stop_python_session", {"session_id": session_id})
        listed = await client.call_tool("list_python_sessions", {})
    assert not stopped.is_error, text_of(stopped)
    body = structured(stopped)
    assert (body["session_id"], body["status"]) == (session_id, "stopped")
    # coderunner lists the active sessions: a stopped one is gone from the list
    assert session_id not in [view["session_id"] for view in structured(listed)["result"]]


async def test_a_stopped_session_refuses_code_until_it_is_started_again(
    server: RunningServer,
) -> None:
    async with connect(server) as client:
        session_id = unique("mcp-again")
        await client.call_tool("start_python_session", {"session_id": session_id})
        await run(client, "open('kept.txt', 'w').write('k'); v = 1", session_id=session_id)
        await client.call_tool("stop_python_session", {"session_id": session_id})
        closed = await run(client, "print(1)", session_id=session_id)
        again = await client.call_tool("stop_python_session", {"session_id": session_id})
        started = await client.call_tool("start_python_session", {"session_id": session_id})
        kept = await run(
            client, "print(open('kept.txt').read(), 'v' in dir())", session_id=session_id
        )
        listed = await client.call_tool("list_python_sessions", {})
        await client.call_tool("stop_python_session", {"session_id": session_id})
    assert closed.is_error
    assert text_of(closed).startswith(f"Error: Session {session_id!r} is closed. Start it again")
    assert again.is_error and f"Session {session_id!r} not found." in text_of(again)
    assert not started.is_error and structured(started)["status"] == "active"
    assert text_of(kept).strip() == "k False"
    assert session_id in [view["session_id"] for view in structured(listed)["result"]]


async def test_an_invalid_session_id_is_an_error_result(server: RunningServer) -> None:
    async with connect(server) as client:
        result = await run(client, "print(1)", session_id="not a valid id!")
    assert result.is_error
    assert "invalid session id" in text_of(result)


async def test_an_unknown_session_is_an_error_result(server: RunningServer) -> None:
    session_id = unique("mcp-nobody")
    async with connect(server) as client:
        result = await run(client, "print(1)", session_id=session_id)
    assert result.is_error
    assert f"Session {session_id!r} not found." in text_of(result)


async def test_stopping_an_unknown_session_is_an_error_result(server: RunningServer) -> None:
    session_id = unique("mcp-nobody")
    async with connect(server) as client:
        result = await client.call_tool("stop_python_session", {"session_id": session_id})
    assert result.is_error
    assert f"Session {session_id!r} not found." in text_of(result)


async def test_starting_an_existing_session_is_an_error_result(server: RunningServer) -> None:
    async with connect(server) as client, named_session(client, "mcp-twice") as session_id:
        again = await client.call_tool("start_python_session", {"session_id": session_id})
    assert again.is_error
    assert "already exists" in text_of(again)


# -- files ---------------------------------------------------------------------------------


async def test_write_file_then_read_file_round_trips(server: RunningServer) -> None:
    content = "héllo\nwörld\n"
    async with connect(server) as client, named_session(client, "mcp-files") as session_id:
        written = await client.call_tool(
            "write_file", {"path": "notes/a.txt", "content": content, "session_id": session_id}
        )
        read = await client.call_tool(
            "read_file", {"path": "notes/a.txt", "session_id": session_id}
        )
    assert not written.is_error, text_of(written)
    assert structured(written) == {"path": "notes/a.txt", "size_bytes": len(content.encode())}
    assert not read.is_error
    assert text_of(read) == content


async def test_the_kernel_sees_a_written_file(server: RunningServer) -> None:
    async with connect(server) as client, named_session(client, "mcp-fsee") as session_id:
        await client.call_tool(
            "write_file", {"path": "data.csv", "content": "a,b\n1,2\n", "session_id": session_id}
        )
        result = await run(client, "print(open('data.csv').read().split())", session_id=session_id)
    assert text_of(result) == "['a,b', '1,2']\n"


async def test_list_files_lists_the_workspace(server: RunningServer) -> None:
    async with connect(server) as client, named_session(client, "mcp-ls") as session_id:
        for path in ("top.txt", "sub/inner.txt"):
            await client.call_tool(
                "write_file", {"path": path, "content": "x", "session_id": session_id}
            )
        top = await client.call_tool("list_files", {"session_id": session_id})
        everything = await client.call_tool(
            "list_files", {"session_id": session_id, "recursive": True}
        )
    assert not top.is_error, text_of(top)
    kinds = {entry["path"]: entry["kind"] for entry in structured(top)["entries"]}
    assert kinds == {"top.txt": "file", "sub": "dir"}
    paths = {entry["path"] for entry in structured(everything)["entries"]}
    assert {"top.txt", "sub", "sub/inner.txt"} <= paths
    assert structured(everything)["truncated"] is False


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x"])
async def test_reading_outside_the_workspace_is_an_error_result(
    server: RunningServer, path: str
) -> None:
    async with connect(server) as client:
        result = await client.call_tool("read_file", {"path": path})
    assert result.is_error
    assert text_of(result)
    assert "root:" not in text_of(result)


@pytest.mark.parametrize("path", ["../x", "/etc/evil"])
async def test_writing_outside_the_workspace_is_an_error_result(
    server: RunningServer, path: str
) -> None:
    async with connect(server) as client:
        result = await client.call_tool("write_file", {"path": path, "content": "no"})
    assert result.is_error
    assert text_of(result)


async def test_reading_a_missing_file_is_an_error_result(server: RunningServer) -> None:
    async with connect(server) as client:
        result = await client.call_tool("read_file", {"path": f"{unique('missing')}.txt"})
    assert result.is_error
    assert text_of(result)


# -- execute_shell_command -----------------------------------------------------------------


async def test_shell_commands_run_bash_in_the_same_workspace(server: RunningServer) -> None:
    async with connect(server) as client, named_session(client, "mcp-sh") as session_id:
        await run(
            client, "open('from_python.txt', 'w').write('hi from python')", session_id=session_id
        )
        result = await client.call_tool(
            "execute_shell_command",
            {
                "command": 'pwd; cat from_python.txt; echo; echo "$BASH_VERSION" | cut -c1',
                "session_id": session_id,
            },
        )
    assert not result.is_error, text_of(result)
    lines = text_of(result).splitlines()
    assert lines[:2] == ["/workspace", "hi from python"]
    assert lines[2].isdigit()
    assert structured(result)["language"] == "bash"


# -- HTTP: tokens and Origin ---------------------------------------------------------------


def test_mcp_without_a_token_is_401(server: RunningServer) -> None:
    with server.client(token=None) as http:
        response = http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_mcp_with_a_wrong_token_is_401(server: RunningServer) -> None:
    with server.client(token="x" * 43) as http:
        response = http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
    assert response.status_code == 401


def test_mcp_initialize_with_the_agent_token_is_200(server: RunningServer) -> None:
    with server.client("agent") as http:
        response = http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
    assert response.status_code == 200
    assert "corral" in response.text


async def test_the_admin_token_works_too(server: RunningServer) -> None:
    async with connect(server, role="admin") as client:
        listed = await client.list_tools()
        result = await run(client, "print(6 * 7)")
    assert {tool.name for tool in listed.tools} == TOOLS
    assert text_of(result) == "42\n"


def test_a_foreign_origin_is_403(server: RunningServer) -> None:
    headers = {**MCP_HEADERS, "Origin": "http://evil.example"}
    with server.client("agent") as http:
        response = http.post("/mcp", json=INITIALIZE, headers=headers)
    assert response.status_code == 403


def test_the_servers_own_origin_is_allowed(server: RunningServer) -> None:
    headers = {**MCP_HEADERS, "Origin": server.base_url}
    with server.client("agent") as http:
        response = http.post("/mcp", json=INITIALIZE, headers=headers)
    assert response.status_code == 200


def test_a_foreign_host_is_refused(server: RunningServer) -> None:
    headers = {**MCP_HEADERS, "Host": "evil.example"}
    with server.client("agent") as http:
        response = http.post("/mcp", json=INITIALIZE, headers=headers)
    assert response.status_code == 403  # coderunner's status and body on its endpoint
    assert response.json() == {"error": "Invalid Host or Origin header"}


# -- stdio ---------------------------------------------------------------------------------


@pytest.fixture
def stdio_params(tmp_path: Path) -> Iterator[StdioServerParameters]:
    run_root = tempfile.mkdtemp(prefix="crp", dir="/tmp")
    env = {
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_CONFIG_DIR": str(tmp_path / "config"),
        "CORRAL_RUN_ROOT": run_root,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(tmp_path)),
    }
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "corral", "mcp-stdio"], env=env
    )
    yield params
    shutil.rmtree(run_root, ignore_errors=True)


async def test_stdio_lists_the_tools_and_runs_code(
    stdio_params: StdioServerParameters, tmp_path: Path
) -> None:
    with (tmp_path / "stderr.log").open("w") as errlog:
        async with Client(stdio_client(stdio_params, errlog=errlog)) as client:
            listed = await client.list_tools()
            result = await run(client, "print(6*7)")
    assert {tool.name for tool in listed.tools} == TOOLS
    assert text_of(result) == "42\n", (tmp_path / "stderr.log").read_text()


async def test_cancelled_call_interrupts_the_running_code(server: RunningServer) -> None:
    """A client that gives up must not leave its code holding the session for minutes."""
    import anyio

    async with connect(server) as client, named_session(client, "mcp-cancel") as session_id:
        with anyio.move_on_after(1.5):
            await client.call_tool(
                "execute_python_code",
                {"command": "import time; time.sleep(60)", "session_id": session_id},
            )
        started = anyio.current_time()
        after = await client.call_tool(
            "execute_python_code", {"command": "print('free')", "session_id": session_id}
        )
        waited = anyio.current_time() - started
    assert text_of(after) == "free\n"
    # Bounded by the interrupt, not by the 60 s sleep: a logical bound, not a speed check.
    assert waited < 30
