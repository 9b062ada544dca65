"""The CLI beside a running `corral serve`: one owner of the state, everything through its API.

Every test runs real `corral serve` processes (`tests/endurance/served.py`) on loopback with a
random free port and temporary folders, and the `corral` command as the operator runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import stat
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import TextContent

from corral.owner import LOCK_NAME, RUNTIME_NAME, find_server
from tests.endurance.served import Served, alive, served
from tests.server.conftest import free_port
from tests.server.test_mcp import INITIALIZE

pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(300)]

NO_SERVER = "no corral server is running"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Served]:
    """A server without a warm pool (the pool test starts its own)."""
    with served(tmp_path, pool_size="0") as running:
        yield running


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def execute(server: Served, session_id: str, code: str) -> dict[str, object]:
    with server.client() as http:
        answer = http.post(f"/v1/sessions/{session_id}/execute", json={"code": code})
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()
    return result


def create(server: Served, session_id: str) -> dict[str, object]:
    with server.client() as http:
        answer = http.post("/v1/sessions", json={"id": session_id})
    assert answer.status_code == 201, answer.text
    created: dict[str, object] = answer.json()
    return created


def sandbox_of(marker: str) -> list[psutil.Process]:
    """The sandbox holding the process whose command line ends with `marker`: its outermost
    bwrap and everything under it."""
    for proc in psutil.process_iter(["cmdline"]):
        if (proc.info["cmdline"] or [])[-1:] == [marker]:
            outer = proc
            with contextlib.suppress(psutil.Error):
                for parent in proc.parents():
                    if parent.name() == "bwrap":
                        outer = parent
            return [outer, *outer.children(recursive=True)]
    raise AssertionError(f"no process runs {marker}")


def pool_kernel_exists(server: Served) -> bool:
    pool = server.state_dir / "sessions" / ".pool"
    return pool.is_dir() and any((entry / "workspace").is_dir() for entry in pool.iterdir())


def one_line(done: object) -> str:
    text = str(getattr(done, "stderr", "")).strip()
    assert len(text.splitlines()) == 1, text
    return text


def test_cli_stop_stops_the_kernel_and_leaves_the_pool_and_other_sessions(
    tmp_path: Path,
) -> None:
    with served(tmp_path, pool_size="1") as server:
        wait_for(lambda: pool_kernel_exists(server), "the pool's first kernel")
        create(server, "keep")
        assert execute(server, "keep", "kept = 41")["status"] == "ok"
        create(server, "victim")
        marker = "86399.25"
        started = execute(
            server, "victim", f"import subprocess; subprocess.Popen(['sleep', '{marker}'])"
        )
        assert started["status"] == "ok", started
        sandbox = sandbox_of(marker)
        wait_for(lambda: pool_kernel_exists(server), "the pool's refill")

        for command in (
            ["sessions", "list"],
            ["audit"],
            ["net", "show", "victim"],
            ["limits", "show", "victim"],
            ["sessions", "stop", "victim"],
        ):
            done = server.corral(*command)
            assert done.returncode == 0, (command, done.stderr)
        assert done.stdout == "victim: stopped\n"

        wait_for(lambda: not any(alive(proc) for proc in sandbox), "the sandbox to end")
        with server.client() as http:
            assert http.get("/v1/sessions/victim").json()["state"] == "stopped"
        kept = execute(server, "keep", "print(kept + 1)")
        assert (kept["stdout"], kept["kernel_restarted"]) == ("42\n", False)
        assert pool_kernel_exists(server)
        assert create(server, "fresh")["from_pool"] is True
        listed = json.loads(server.corral("sessions", "list", "--json").stdout)
        states = {row["id"]: row["state"] for row in listed}
        assert states["victim"] == "stopped" and states["keep"] != "stopped", states


def test_a_second_server_on_the_same_state_refuses_and_the_first_keeps_serving(
    server: Served,
) -> None:
    create(server, "first")
    done = server.corral("serve", "--port", str(free_port()), timeout_s=60)
    assert done.returncode != 0
    line = one_line(done)
    assert f"pid {server.pid}" in line and server.url in line, line
    assert "token" not in done.stderr + done.stdout
    assert execute(server, "first", "print('still here')")["stdout"] == "still here\n"


def test_serve_on_a_port_in_use_fails_in_one_line_before_the_banner(
    server: Served, tmp_path: Path
) -> None:
    env = {**server.env, "CORRAL_STATE_DIR": str(tmp_path / "other-state")}
    done = server.corral("serve", "--port", str(server.port), timeout_s=60, env=env)
    assert done.returncode != 0
    line = one_line(done)
    assert f"127.0.0.1:{server.port} is already in use" in line and "--port" in line, line
    assert "token" not in done.stderr + done.stdout


async def test_mcp_stdio_beside_a_server_sees_its_sessions_and_variables(
    server: Served, tmp_path: Path
) -> None:
    create(server, "shared")
    assert execute(server, "shared", "secret = 'set over REST'")["status"] == "ok"
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "corral", "mcp-stdio"], env=server.env
    )
    with (tmp_path / "stdio.log").open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            listed = await client.call_tool("list_python_sessions", {})
            result = await client.call_tool(
                "execute_python_code", {"command": "print(secret)", "session_id": "shared"}
            )
            # The relay opened no service of its own: every sandbox is the server's.
            owner = find_server(server.state_dir)
            servers = {proc.pid for proc in server.descendants()}
            strays = [p for p in server.sandboxes() if p.pid not in servers]
    texts = [part.text for part in result.content if isinstance(part, TextContent)]
    assert texts[0] == "set over REST\n", (tmp_path / "stdio.log").read_text()
    assert "shared" in str(listed.content)
    assert owner is not None and owner.pid == server.pid
    assert not strays, strays
    assert relay_answers_and_ends_with_stdin(server) == 0


def relay_answers_and_ends_with_stdin(server: Served) -> int:
    """`corral mcp-stdio` answers one initialize, then exits once its stdin closes."""
    with subprocess.Popen(
        [sys.executable, "-m", "corral", "mcp-stdio"],
        env=server.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as relay:
        assert relay.stdin is not None and relay.stdout is not None
        try:
            relay.stdin.write(json.dumps(INITIALIZE) + "\n")
            relay.stdin.flush()
            answer = json.loads(relay.stdout.readline())
            assert answer["result"]["serverInfo"]["name"] == "corral", answer
            relay.stdin.close()
            return relay.wait(60)
        finally:
            if relay.poll() is None:
                relay.kill()


def test_operator_commands_reach_the_server_on_its_own_port(server: Served) -> None:
    assert server.port != 8222
    create(server, "ported")
    snippet = server.corral("mcp-config", "claude-code")
    assert snippet.returncode == 0, snippet.stderr
    assert f"http://127.0.0.1:{server.port}/mcp" in snippet.stdout
    for command in (["net", "show", "ported"], ["limits", "show", "ported"]):
        done = server.corral(*command)
        assert done.returncode == 0, (command, done.stderr)
    desktop = json.loads(server.corral("mcp-config", "claude-desktop").stdout)
    entry = desktop["mcpServers"]["corral"]
    assert Path(entry["command"]).is_absolute() and "mcp-stdio" in entry["args"]
    assert os.access(entry["command"], os.X_OK)


def test_without_a_server_net_show_fails_in_one_line(tmp_path: Path) -> None:
    with served(tmp_path, start=False) as server:
        done = server.corral("net", "show", "default")
    assert done.returncode != 0
    assert NO_SERVER in one_line(done)


def test_the_runtime_file_is_private_and_gone_after_a_clean_stop(server: Served) -> None:
    runtime = server.state_dir / RUNTIME_NAME
    info = json.loads(runtime.read_text())
    assert (info["pid"], info["port"], info["url"]) == (server.pid, server.port, server.url)
    for name in (RUNTIME_NAME, LOCK_NAME):
        assert stat.S_IMODE((server.state_dir / name).lstat().st_mode) == 0o600, name
    server.terminate()
    assert not runtime.exists()
    assert NO_SERVER in one_line(server.corral("net", "show", "default"))


def test_a_killed_servers_runtime_file_is_not_trusted(server: Served) -> None:
    process = server.process
    assert process is not None
    process.kill()
    process.wait(30)
    assert (server.state_dir / RUNTIME_NAME).exists()  # SIGKILL leaves it behind
    done = server.corral("net", "show", "default")
    assert done.returncode != 0 and NO_SERVER in one_line(done)
    assert not (server.state_dir / RUNTIME_NAME).exists()
    server.start()  # the state is free again
    assert json.loads((server.state_dir / RUNTIME_NAME).read_text())["pid"] == server.pid


def test_run_delete_and_skills_add_go_through_the_running_server(
    server: Served, tmp_path: Path
) -> None:
    ran = server.corral("run", "print(6*7)")
    assert (ran.returncode, ran.stdout) == (0, "42\n"), ran.stderr
    audit = json.loads(server.corral("audit", "--kind", "execution", "--json").stdout)
    assert audit["entries"][0]["code"] == "print(6*7)"  # run by the server, in its state
    with server.client() as http:
        assert http.get("/v1/sessions").json()["sessions"] == []  # its session is gone

    create(server, "made")
    deleted = server.corral("sessions", "delete", "--yes", "made")
    assert deleted.returncode == 0, deleted.stderr
    with server.client() as http:
        assert http.get("/v1/sessions/made").status_code == 404

    # Elsewhere, with only the URL and the admin token: the server unpacks the archive.
    archive = tmp_path / "mine.zip"
    with zipfile.ZipFile(archive, "w") as packed:
        packed.writestr("mine/SKILL.md", "---\nname: mine\ndescription: A test skill.\n---\n")
    elsewhere = {k: v for k, v in server.env.items() if not k.startswith("CORRAL_")}
    elsewhere.update(
        CORRAL_URL=server.url,
        CORRAL_ADMIN_TOKEN=server.token("admin"),
        CORRAL_CONFIG_DIR=str(tmp_path / "other-config"),
        CORRAL_STATE_DIR=str(tmp_path / "other-state"),
    )
    added = server.corral("skills", "add", str(archive), env=elsewhere)
    assert added.returncode == 0, added.stderr
    assert (server.config_dir / "skills" / "mine" / "SKILL.md").is_file()
    with server.client() as http:
        assert "mine" in [skill["name"] for skill in http.get("/v1/skills").json()["skills"]]
    # The listing is the server's too: the config directory here has no skill "mine".
    listed = server.corral("skills", "list", env=elsewhere)
    assert listed.returncode == 0, listed.stderr
    assert "  - mine: A test skill." in listed.stdout
    assert not (tmp_path / "other-config" / "skills").exists()


def test_serve_raises_its_open_file_limit_to_what_the_account_allows(tmp_path: Path) -> None:
    # A login shell gives an ordinary user 1024 open files by default; 32 sessions, each with
    # kernel sockets, pipes and proxy connections, need more than that.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 1024:
        pytest.skip(f"this account may open only {hard} files: nothing to raise to")

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    with served(tmp_path, pool_size="0", start=False) as server:
        server.start(preexec=lower)
        assert server.process is not None
        limits = psutil.Process(server.process.pid).rlimit(psutil.RLIMIT_NOFILE)
        assert limits == (hard, hard)
