"""`corral serve`, `mcp-config` and `audit` run as a user runs them: real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.server.conftest import free_port


@pytest.fixture
def env(tmp_path: Path, run_root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_CONFIG_DIR": str(tmp_path / "config"),
        "CORRAL_RUN_ROOT": str(run_root),
    }


def _corral(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def served(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    with (tmp_path / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "serve", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def _wait_healthy(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"corral serve did not become healthy: {proc.poll()}")


def test_serve_answers_with_its_token_and_stops_sandboxes_on_sigterm(
    served: tuple[subprocess.Popen[str], str], env: dict[str, str]
) -> None:
    proc, url = served
    token = (Path(env["CORRAL_CONFIG_DIR"]) / "agent.token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{url}/v1/sessions", timeout=10).status_code == 401
    result = httpx.post(
        f"{url}/v1/execute", json={"code": "print(1+1)"}, headers=headers, timeout=60
    ).json()
    assert result["stdout"] == "2\n"
    sandboxes = [
        p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "bwrap"
    ]
    assert sandboxes
    proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal so the exit status shows it.
    assert proc.wait(30) in (0, -signal.SIGTERM)
    # The kernels were stopped; what the signal kills may take a moment to go under load.
    _, alive = psutil.wait_procs(sandboxes, timeout=15)
    assert not [p for p in alive if _still_running(p)], alive


def test_serve_refuses_a_public_address_without_the_flag(env: dict[str, str]) -> None:
    done = _corral(env, "serve", "--host", "0.0.0.0")
    assert done.returncode == 2
    assert "--allow-remote" in done.stderr


@pytest.mark.parametrize(
    "client",
    ["claude-code", "cursor", "gemini", "opencode", "kiro", "claude-desktop", "openai-agents"],
)
def test_mcp_config_prints_a_snippet_with_the_token(env: dict[str, str], client: str) -> None:
    done = _corral(env, "mcp-config", client)
    assert done.returncode == 0, done.stderr
    token = (Path(env["CORRAL_CONFIG_DIR"]) / "agent.token").read_text().strip()
    if client == "claude-desktop":
        assert "mcp-stdio" in done.stdout
    else:
        assert token in done.stdout
        assert "http://127.0.0.1:8222/mcp" in done.stdout
    if client in JSON_CONFIGS:  # stdout is the file itself; where it goes is on stderr
        json.loads(done.stdout)
        assert done.stderr.strip() == f"# {JSON_CONFIGS[client]}"


JSON_CONFIGS = {
    "cursor": "~/.cursor/mcp.json",
    "gemini": "~/.gemini/settings.json",
    "opencode": "opencode.json",
    "kiro": ".kiro/settings/mcp.json",
    "claude-desktop": "claude_desktop_config.json (stdio: Desktop starts corral itself)",
}


def test_audit_lists_what_the_server_recorded(
    served: tuple[subprocess.Popen[str], str], env: dict[str, str]
) -> None:
    _, url = served
    token = (Path(env["CORRAL_CONFIG_DIR"]) / "agent.token").read_text().strip()
    httpx.post(
        f"{url}/v1/execute",
        json={"code": "21 * 2"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    done = _corral(env, "audit", "--kind", "execution", "--json")
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)["entries"]
    assert entries[0]["code"] == "21 * 2" and entries[0]["status"] == "ok"
    table = _corral(env, "audit")
    assert "execution" in table.stdout and "session" in table.stdout


def _still_running(process: psutil.Process) -> bool:
    """Alive and not a zombie waiting for its parent (gone counts as not running)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
