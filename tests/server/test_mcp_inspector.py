"""A client nobody here wrote: the official MCP Inspector's CLI mode, against the test server.

scripts/install-mcp-inspector puts a pinned Inspector into .cache/mcp-inspector; the fixture
runs it first (a no-op once installed), so a clean clone needs only node and npm. The tests
skip only when node is missing, or when the Inspector is not installed and npm's registry
cannot be reached at all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import RunningServer, free_port

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install-mcp-inspector"
INSPECTOR = ROOT / ".cache" / "mcp-inspector" / "node_modules" / ".bin" / "mcp-inspector"
REGISTRY_UNREACHABLE = 3  # install-mcp-inspector's exit code when npm's registry is unreachable
EXIT_TOOL_ERROR = 5  # the Inspector CLI's exit code for a result with isError: true

pytestmark = [
    pytest.mark.skipif(
        shutil.which("node") is None, reason="node is not on PATH: the MCP Inspector needs it"
    ),
    # The first test may install the Inspector from npm.
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def inspector() -> Path:
    installed = subprocess.run(
        ["bash", str(INSTALL)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    if installed.returncode == REGISTRY_UNREACHABLE:
        pytest.skip(f"the MCP Inspector is not installed and {installed.stderr.strip()}")
    if installed.returncode != 0 or not INSPECTOR.exists():
        pytest.fail(f"{INSTALL.name} failed:\n{installed.stdout}\n{installed.stderr}")
    return INSPECTOR


def inspect(
    inspector: Path, server: RunningServer, home: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run the Inspector's CLI mode against the server's /mcp with the agent token."""
    assert server.tokens is not None
    command = [
        str(inspector),
        "--cli",
        server.mcp_url,
        "--transport",
        "http",
        "--header",
        f"Authorization: Bearer {server.tokens.agent}",
        *args,
    ]
    # Its own state (~/.mcp-inspector) goes to a temporary home, not the developer's.
    env = {**os.environ, "HOME": str(home), "MCP_CATALOG_PATH": str(home / "mcp.json")}
    return subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        check=False,
    )


def output_of(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


def test_the_inspector_lists_execute_python_code(
    inspector: Path, server: RunningServer, tmp_path: Path
) -> None:
    done = inspect(inspector, server, tmp_path, "--method", "tools/list")
    assert done.returncode == 0, done.stderr
    tools = {tool["name"]: tool for tool in output_of(done)["tools"]}
    assert "execute_python_code" in tools
    assert tools["execute_python_code"]["inputSchema"]["required"] == ["command"]


def test_the_inspector_runs_python_through_execute_python_code(
    inspector: Path, server: RunningServer, tmp_path: Path
) -> None:
    done = inspect(
        inspector,
        server,
        tmp_path,
        "--method",
        "tools/call",
        "--tool-name",
        "execute_python_code",
        "--tool-arg",
        "command=print(6*7)",
    )
    assert done.returncode == 0, done.stderr
    result = output_of(done)
    assert result.get("isError") is not True
    assert [block["text"] for block in result["content"]] == ["42\n"]
    assert result["structuredContent"]["stdout"] == "42\n"


def test_the_inspector_finds_the_tool_schemas_portable(
    inspector: Path, server: RunningServer, tmp_path: Path
) -> None:
    done = inspect(inspector, server, tmp_path, "--method", "tools/list", "--strict")
    assert done.returncode == 0, done.stderr


def test_the_inspector_sees_a_refused_path_as_a_tool_error(
    inspector: Path, server: RunningServer, tmp_path: Path
) -> None:
    done = inspect(
        inspector,
        server,
        tmp_path,
        "--method",
        "tools/call",
        "--tool-name",
        "read_file",
        "--tool-arg",
        "path=../x",
    )
    assert done.returncode == EXIT_TOOL_ERROR, done.stderr
    result = output_of(done)
    assert result["isError"] is True
    assert "refused" in result["content"][0]["text"]


def test_an_unreachable_registry_is_said_at_once(tmp_path: Path) -> None:
    """Not installed and no registry: exit 3 naming the registry (the fixture then skips),
    not a failure after npm's retries."""
    registry = f"https://127.0.0.1:{free_port()}/"  # nothing listens there
    env = {**os.environ, "HOME": str(tmp_path), "npm_config_registry": registry}
    done = subprocess.run(
        ["bash", str(INSTALL), str(tmp_path / "inspector")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == REGISTRY_UNREACHABLE, done.stderr
    assert f"the npm registry cannot be reached (request to {registry}-/ping" in done.stderr
    assert not (tmp_path / "inspector").exists()
