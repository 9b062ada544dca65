"""The escape battery's shared parts: the host it attacks, counting attempts, and running
code inside a session.

See tests/escapes/__init__.py for what the battery is.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from corral.config import Settings
from corral.kernels.results import ExecutionResult
from corral.server.app import build_app
from corral.service import Service
from corral.tokens import load_tokens
from tests.snippets import git

MIB = 1024 * 1024
MEMORY = 256 * MIB
TASKS = 64
WORKSPACE = 64 * MIB
FILES = 3000  # files and directories in the workspace, package prefix and run directory
TMP = 32 * MIB
EXEC_S = 25.0
A = "esc-a"  # with the project mounted read-write at /workspace/proj
B = "esc-b"
P = "/workspace/proj"
WEB_HOST = "127.0.0.2"
TOKEN = secrets.token_hex(8)
SECRET = f"corral-escape-secret-{TOKEN}"
SSH_KEY = f"FAKE-PRIVATE-KEY-{TOKEN}"
HOST_VAR = "CORRAL_ESCAPE_HOST_VARIABLE"


# -- the host side ------------------------------------------------------------------------------


@dataclass
class Host:
    """What the tests plant and run on the host, and the service under attack."""

    service: Service
    settings: Settings
    secret: Path
    ssh_key: Path
    repo: Path
    server_port: int
    server_hits: list[str]
    web_port: int
    web_hits: list[int]


class _CountingWeb(http.server.ThreadingHTTPServer):
    """A host web server that counts every connection it accepts."""

    daemon_threads = True
    hits: list[int]

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.hits.append(1)
        return True


class _Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = SECRET.encode()  # a host service holding a secret
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Requests are counted, not logged."""


@contextlib.contextmanager
def counting_web() -> Iterator[tuple[int, list[int]]]:
    httpd = _CountingWeb((WEB_HOST, 0), _Quiet)
    httpd.hits = []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield int(httpd.server_address[1]), httpd.hits
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@contextlib.asynccontextmanager
async def corral_server(settings: Settings, service: Service) -> AsyncIterator[list[str]]:
    """The real corral app for `service` on 127.0.0.1:settings.port; yields its request log.

    It runs on the test's event loop, so the app and the tests share the one service, which
    the app's lifespan opens (with the MCP session manager) and closes, as `corral serve`.
    """
    app = build_app(settings, service, load_tokens(settings.config_dir, env={}))
    hits: list[str] = []

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            hits.append(scope["path"])
        await app(scope, receive, send)

    config = uvicorn.Config(
        counted,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        lifespan="on",
        interface="asgi3",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 30
    while not server.started:
        if task.done() or time.monotonic() > deadline:
            raise RuntimeError("the corral server did not start")
        await asyncio.sleep(0.02)
    try:
        yield hits
    finally:
        server.should_exit = True
        await task


def make_repo(base: Path) -> Path:
    """A project the host trusts: a git repository (with git's sample hooks) and settings."""
    repo = base / "proj"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "main.py").write_text("print('hi')\n")
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.json").write_text('{"hooks": {}}\n')
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "start")
    return repo


# -- counting attempts ----------------------------------------------------------------------


class BatterySummary:
    """A plugin (registered by tests/conftest.py, so xdist's controller has it too): the
    attempts tried and blocked, in the summary; each test's pass is its attempt blocked."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # the node ids of the battery's attempts start with it

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        outcomes: dict[str, bool] = {}
        for kind in ("passed", "failed", "error"):
            for report in terminalreporter.stats.get(kind, []):
                nodeid = getattr(report, "nodeid", "")
                if not nodeid.startswith(self.prefix):
                    continue
                name = nodeid.removeprefix(self.prefix)
                blocked = kind == "passed" and report.when == "call"
                outcomes[name] = outcomes.get(name, True) and blocked
        if not outcomes:
            return
        open_ = sorted(name for name, blocked in outcomes.items() if not blocked)
        line = (
            f"escape battery: {len(outcomes)} attempts tried, {len(outcomes) - len(open_)} blocked"
        )
        terminalreporter.write_sep("-", line, bold=True, red=bool(open_), green=not open_)
        for name in open_:
            terminalreporter.write_line(f"NOT BLOCKED: {name}")


# -- running code inside -------------------------------------------------------------------


def checked(host: Host, result: ExecutionResult) -> ExecutionResult:
    """`result`, once its output is known to hold neither planted secret."""
    text = result.text()
    assert SECRET not in text, text
    assert SSH_KEY not in text, text
    return result


async def execute(
    host: Host, code: str, sid: str = A, timeout_s: float = EXEC_S
) -> ExecutionResult:
    result = await host.service.executions.run(code, session_id=sid, timeout_s=timeout_s)
    return checked(host, result)


async def py(host: Host, code: str, sid: str = A) -> Any:
    """Run Python that prints one JSON value as its last line; that value."""
    result = await execute(host, code, sid)
    assert result.status == "ok", result.text()
    return json.loads(result.stdout.strip().splitlines()[-1])


PRELUDE = """
import ctypes, errno, json, os, socket, subprocess, time
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
def _p(data):
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0
def _sys(number, *args):
    r = _libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
def _c(name, *args):
    if getattr(_libc, name)(*args) == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
def _try(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
_buf = ctypes.create_string_buffer(256)
_bufp = ctypes.addressof(_buf)
"""


async def outcomes(
    host: Host, ops: dict[str, str], sid: str = A, setup: str = "", cleanup: str = ""
) -> dict[str, str]:
    """Each Python expression run inside: "ok", or the name of the errno it failed with."""
    calls = ", ".join(f"{label!r}: _try(lambda: {expr})" for label, expr in ops.items())
    code = f"{PRELUDE}\n{setup}\n_out = {{{calls}}}\n{cleanup}\nprint(json.dumps(_out))\n"
    got: dict[str, str] = await py(host, code, sid)
    return got


def run_inside(argv: list[str]) -> str:
    """Python that runs `argv` inside and prints {"rc": ..., "out": ...} as JSON."""
    return (
        "import json, subprocess\n"
        f"_d = subprocess.run({argv!r}, capture_output=True, text=True, timeout=20)\n"
        "print(json.dumps({'rc': _d.returncode, 'out': _d.stdout + _d.stderr}))\n"
    )


async def command(host: Host, argv: list[str], sid: str = A) -> tuple[int, str]:
    done = await py(host, run_inside(argv), sid)
    return int(done["rc"]), str(done["out"])


async def answers(host: Host, sid: str) -> None:
    result = await execute(host, "1 + 1", sid)
    assert result.status == "ok", result.text()
    assert result.results == [{"text/plain": "2"}]


def pending_connections(listener: socket.socket) -> int:
    """How many connections wait in `listener`'s backlog (accepted and closed here)."""
    listener.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


@contextlib.contextmanager
def unix_listener(path: Path) -> Iterator[socket.socket]:
    """A host service on a unix socket (like docker.sock or an ssh-agent)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(128)
    try:
        yield listener
    finally:
        listener.close()
        path.unlink(missing_ok=True)
