"""The SSH agent bridge of a real session: a real ssh-agent on the host, ssh-add inside.

The agent holds a throw-away key made for the test; the server finds it through its own
SSH_AUTH_SOCK, as `corral serve` would. Keys must stay on the host: the sandbox only ever sees
a relayed socket, and connections that do not present the session's token get nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.config import Settings
from corral.controls import BridgeReport
from corral.errors import InvalidInput
from corral.kernels.run import SANDBOX_AGENT_SOCK, SANDBOX_BRIDGE_DIR
from corral.server.operation import wire
from corral.server.schemas import AuditPageModel
from corral.service import Service

EXEC_S = 30.0


@dataclass(frozen=True)
class HostAgent:
    socket: Path
    key: Path
    fingerprint: str  # "SHA256:..."
    public: str  # "ssh-ed25519 AAAA... comment"


def _tools() -> None:
    missing = [t for t in ("ssh-agent", "ssh-add", "ssh-keygen") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"OpenSSH client tools missing on this host: {', '.join(missing)}")


@pytest.fixture
def host_agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostAgent]:
    """A running ssh-agent holding one new ed25519 key, named by the server's SSH_AUTH_SOCK."""
    _tools()
    home = Path(tempfile.mkdtemp(prefix="cra", dir="/tmp"))  # short: a unix socket path
    socket = home / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(socket)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not socket.is_socket():
            if time.monotonic() > deadline or agent.poll() is not None:
                raise RuntimeError("ssh-agent did not start")
            time.sleep(0.05)
        key = home / "id_ed25519"
        _ssh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "corral-test", "-f", str(key))
        _ssh("ssh-add", "-q", str(key), agent=socket)
        fingerprint = _ssh("ssh-keygen", "-l", "-f", f"{key}.pub").split()[1]
        public = Path(f"{key}.pub").read_text().strip()
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket))
        yield HostAgent(socket, key, fingerprint, public)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(10)
        shutil.rmtree(home, ignore_errors=True)


def _ssh(*argv: str, agent: Path | None = None) -> str:
    env = dict(os.environ)
    if agent is not None:
        env["SSH_AUTH_SOCK"] = str(agent)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


async def bridged(service: Service, sid: str) -> None:
    """Create `sid` stopped, enable its bridge as the operator does, then start it."""
    await service.sessions.create(sid, start=False)
    report = await service.controls.set_bridge(sid, True)
    assert report == BridgeReport(
        session_id=sid,
        ssh_agent=True,
        active=False,
        restart_needed=False,
    )
    await service.start_session(sid)


async def run(service: Service, sid: str, code: str, language: str = "python") -> str:
    """Run `code` (Python with `os` imported, or bash); its stdout, once it succeeded."""
    if language == "python":
        code = f"import os\n{code}"
    result = await service.executions.run(code, session_id=sid, language=language, timeout_s=EXEC_S)
    assert result.status == "ok", result.text()
    return result.stdout


async def bridge_actions(service: Service, sid: str) -> list[str]:
    entries = wire(AuditPageModel, await service.audit.page(kind="bridge", session=sid))["entries"]
    return [entry["action"] for entry in reversed(entries)]


async def test_the_host_key_is_listed_inside_but_never_enters(
    service: Service, host_agent: HostAgent
) -> None:
    await bridged(service, "keys")
    out = await run(
        service, "keys", 'echo "$SSH_AUTH_SOCK"; ssh-add -l; ssh-add -L', language="bash"
    )
    sock, listed, public = out.splitlines()
    assert sock == SANDBOX_AGENT_SOCK
    assert listed.split()[1] == host_agent.fingerprint
    assert public == host_agent.public
    private = await run(
        service,
        "keys",
        "grep -rlI 'PRIVATE KEY' /home /tmp /workspace /run 2>/dev/null; echo end",
        "bash",
    )
    assert private == "end\n"
    host_paths = [str(p) for p in (host_agent.key, host_agent.socket, host_agent.key.parent)]
    seen = await run(service, "keys", f"print([os.path.lexists(p) for p in {host_paths!r}])")
    assert seen == "[False, False, False]\n"
    assert (await bridge_actions(service, "keys")).count("relayed") >= 2
    assert len(list(service.settings.run_root.glob("b-*"))) == 1  # the bridge's socket and token
    await service.stop_session("keys")
    assert list(service.settings.run_root.glob("b-*")) == []


async def test_the_bridge_directory_is_read_only_inside(
    service: Service, host_agent: HostAgent
) -> None:
    await bridged(service, "ro")
    out = await run(
        service,
        "ro",
        "import errno, os\n"
        "for op in (lambda: os.unlink('/run/corral-bridge/agent.sock'),\n"
        "           lambda: open('/run/corral-bridge/x', 'w'),\n"
        "           lambda: os.rename('/run/corral-bridge/token', '/run/corral-bridge/t')):\n"
        "    try:\n"
        "        op(); print('ok')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])",
    )
    assert out.split() == ["EROFS", "EROFS", "EROFS"]


RAW = """
import json, socket
def attempt(first, close_write):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(15)
    s.connect('/run/corral-bridge/agent.sock')
    if first:
        s.sendall(first)
    if close_write:
        s.shutdown(socket.SHUT_WR)
    got = b''
    while chunk := s.recv(4096):
        got += chunk
    s.close()
    return got.hex()
ask = bytes([0, 0, 0, 1, 11])  # SSH_AGENTC_REQUEST_IDENTITIES
print(json.dumps([
    attempt(b'', True),
    attempt(b'corral-bridge 1 ' + b'0' * 64 + b' ssh-agent\\n' + ask, False),
    attempt(b'GET / HTTP/1.0\\r\\n\\r\\n', True),
    attempt(ask, True),
]))
"""


async def test_raw_connections_without_the_token_get_no_byte_and_are_audited(
    service: Service, host_agent: HostAgent
) -> None:
    await bridged(service, "raw")
    answers = json.loads(await run(service, "raw", RAW))
    assert answers == ["", "", "", ""]
    refusals = [a for a in await bridge_actions(service, "raw") if a.startswith("refused")]
    assert refusals == [
        "refused: closed before the handshake",
        "refused: wrong token",
        "refused: malformed handshake",
        "refused: closed before the handshake",  # agent bytes with no line: no handshake
    ]
    token = (await run(service, "raw", "print(open('/run/corral-bridge/token').read())")).strip()
    assert len(token) == 64
    assert token not in json.dumps(
        wire(AuditPageModel, await service.audit.page(limit=1000))["entries"]
    )


async def test_a_session_without_the_bridge_has_no_agent(
    service: Service, host_agent: HostAgent
) -> None:
    await service.create_session("plain")
    out = await run(
        service,
        "plain",
        f'echo "sock=${{SSH_AUTH_SOCK-unset}}"; ls -d {SANDBOX_AGENT_SOCK} {SANDBOX_BRIDGE_DIR} '
        f"{host_agent.socket} 2>&1 | grep -c 'No such file'; ssh-add -l; echo rc=$?",
        language="bash",
    )
    lines = out.splitlines()
    assert lines[0] == "sock=unset"
    assert lines[1] == "3"
    assert lines[-1] == "rc=2"  # ssh-add: cannot connect to an agent
    assert await bridge_actions(service, "plain") == []


async def test_enabling_the_bridge_takes_effect_at_the_next_start(
    service: Service, host_agent: HostAgent
) -> None:
    await service.create_session("later")
    report = await service.controls.set_bridge("later", True)
    assert report.restart_needed is True and report.active is False
    assert "sock=unset" in await run(
        service, "later", 'echo "sock=${SSH_AUTH_SOCK-unset}"', language="bash"
    )
    await service.restart_session("later")
    again = await service.controls.set_bridge("later", True)
    assert again.active is True and again.restart_needed is False
    listed = await run(service, "later", "ssh-add -l", language="bash")
    assert host_agent.fingerprint in listed
    off = await service.controls.set_bridge("later", False)
    assert off.active is True and off.restart_needed is True
    admin = wire(AuditPageModel, await service.audit.page(kind="admin", session="later"))["entries"]
    assert [e["action"] for e in admin] == ["set_bridge"] * 3


@pytest.mark.parametrize("agent", ["unset", "not a socket"])
async def test_the_bridge_without_a_host_agent_fails_the_start_clearly(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: str
) -> None:
    if agent == "unset":
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    else:
        (tmp_path / "plain-file").write_text("")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "plain-file"))
    async with Service(settings) as service:
        await service.sessions.create("noagent", start=False)
        await service.controls.set_bridge("noagent", True)
        with pytest.raises(InvalidInput, match="the server has no SSH agent: start corral serve"):
            await service.start_session("noagent")
        assert service.get_session("noagent").kernels == ()
        assert service.sessions.session("noagent").run is None
    assert [p.name for p in settings.run_root.glob("b-*")] == []
