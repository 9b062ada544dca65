"""Escape attempts against the server around the sandboxes: its guard, the SSH agent bridge
and the warm pool's hand-over.

The guard's attempts go over real HTTP to the battery's corral server, on every route the
app has (read from the app itself, so a new route is attacked too), and check that the
service's state did not move. The bridge and pool attempts run code in sessions of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from starlette.routing import Mount, Route

from corral.config import Settings
from corral.errors import SessionNotFound
from corral.server import compat
from corral.server.app import build_app
from corral.server.operation import wire
from corral.server.schemas import AuditPageModel, NetworkPolicyModel
from corral.service import Service
from corral.tokens import Tokens, load_tokens
from tests.escapes.battery import TOKEN, Host, py
from tests.waiting import until

IO_S = 15.0

# -- talking HTTP as an attacker does ------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def code(self) -> str | None:
        """The guard's error code (coderunner's error text on its paths), or None for a
        reply that is not one of the guard's JSON errors."""
        try:
            error = json.loads(self.body)["error"]
            return error if isinstance(error, str) else str(error["code"])
        except (ValueError, KeyError, TypeError):
            return None


async def send_http(
    port: int, method: str, target: str, headers: Mapping[str, str], body: bytes = b""
) -> Reply:
    """One request written byte for byte (an attacker picks every header, an empty Host
    included), read to the server's close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    try:
        writer.write("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
        raw = await asyncio.wait_for(reader.read(), IO_S)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return parse_reply(raw)


def parse_reply(raw: bytes) -> Reply:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    headers = {}
    for field in fields:
        name, _, value = field.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(int(status_line.split()[1]), headers, body)


# -- every route of the app ----------------------------------------------------------------------

TARGET = "esc-srv-target"  # the session every {id} names: the one a broken guard would hit
INTRUDER = "esc-srv-intruder"  # the session a broken guard would let an attacker create
KEPT = "kept.txt"  # a file of TARGET that a broken guard would let an attacker overwrite
PLANT = f"open('/workspace/pwned-{TOKEN}', 'w').write('pwned')"
MCP_METHODS = ("GET", "POST", "DELETE")  # what streamable HTTP answers (the route lists none)
OPEN = frozenset({("GET", "/health"), ("HEAD", "/health")})  # DESIGN 6: the only open route
ADMIN_PREFIX = "/v1/admin/"
DASHBOARD = "/ui/"  # its own login (a cookie) guards it, after the same Host and Origin checks
DASHBOARD_OPEN = frozenset(
    (method, path)
    for path, methods in (
        ("/ui/login", ("GET", "HEAD", "POST")),
        ("/ui/static/code.css", ("GET", "HEAD")),
    )
    for method in methods
)
# What a change of the dashboard's would do harm with, sent as its form.
DASHBOARD_FORM = b"hosts=evil.example&mode=public&csrf=forged&next=/ui/"
UNROUTED = ("GET", "/v1/no-such-route")  # the guard stands before routing, too
PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # with its parameters filled in

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def app_routes(settings: Settings, service: Service) -> list[tuple[str, str]]:
    """(method, path template) for every route of the app `corral serve` builds."""
    app: Any = build_app(settings, service, load_tokens(settings.config_dir, env={}))
    while not hasattr(app, "routes"):  # the guard and the body limit wrap the router
        app = app.app
    # The calls that end TARGET go last, so that a guard letting them through still lets
    # every other call show what it would have done.
    return sorted(_walk(app.routes, ""), key=lambda c: (c[0] == "DELETE", c[1].endswith("stop"), c))


def _walk(routes: list[Any], prefix: str) -> Iterator[tuple[str, str]]:
    for route in routes:
        if isinstance(route, Mount):
            yield from _walk(route.routes, prefix + route.path)
        elif isinstance(route, Route):
            for method in route.methods or MCP_METHODS:
                yield method, prefix + route.path


def harmful_body(method: str, template: str) -> bytes:
    """What each route would do harm with if the guard let it through; `{}` for any other."""
    bodies: dict[tuple[str, str], object] = {
        ("POST", "/v1/sessions"): {"id": INTRUDER},
        ("POST", "/v1/sessions/session"): {"session_id": INTRUDER},
        ("POST", "/v1/sessions/{id}/execute"): {"code": PLANT},
        ("POST", "/v1/execute"): {"code": PLANT, "session_id": TARGET},
        ("POST", "/execute"): {"code": PLANT, "session_id": TARGET},
        ("PATCH", "/v1/admin/sessions/{id}/limits"): {"memory_bytes": 512 * 1024 * 1024},
        ("PUT", "/v1/admin/sessions/{id}/bridge"): {"ssh_agent": True},
        ("PUT", "/v1/admin/sessions/{id}/network"): {"mode": "public", "allow": []},
        ("POST", "/v1/admin/sessions/{id}/network/allow"): {"hosts": ["evil.example"]},
        ("POST", "/v1/sessions/{id}/network/requests"): {"hosts": ["evil.example"], "reason": "x"},
        ("POST", "/mcp"): {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    }
    if (method, template) == ("POST", "/v1/admin/skills"):
        return skill_archive()
    if (method, template) == ("PUT", "/v1/sessions/{id}/files/content"):
        return b"overwritten by an intruder"
    return json.dumps(bodies.get((method, template), {})).encode()


def skill_archive() -> bytes:
    """A valid skill .zip, which a broken guard would let an attacker install."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive:
        archive.writestr("SKILL.md", "---\nname: intruder\ndescription: x\n---\n")
    return data.getvalue()


@dataclass(frozen=True)
class Target:
    """Every call of the app with its parameters naming TARGET, and the query sent along."""

    calls: list[tuple[Call, bytes]]
    query: str

    def admin_calls(self) -> list[tuple[Call, bytes]]:
        return [(c, b) for c, b in self.calls if c.path.startswith(ADMIN_PREFIX)]

    def guarded_calls(self) -> list[tuple[Call, bytes]]:
        """The calls a bearer token opens: every one but /health and the dashboard's."""
        return [
            (c, b)
            for c, b in self.calls
            if (c.method, c.path) not in OPEN and not c.path.startswith(DASHBOARD)
        ]

    def dashboard_calls(self) -> list[Call]:
        """The dashboard's calls that need its login (all but the form and static files)."""
        return [
            c
            for c, _ in self.calls
            if c.path.startswith(DASHBOARD) and (c.method, c.path) not in DASHBOARD_OPEN
        ]


@pytest.fixture(scope="module")
async def target(host: Host) -> AsyncIterator[Target]:
    """A running session of this module's own, with a file and a pending network request
    that the routes' parameters name."""
    before = {info.id for info in host.service.list_sessions()}
    await host.service.create_session(TARGET)
    host.service.files.write(TARGET, KEPT, b"kept")
    asked = await host.service.network.request_access(TARGET, ["evil.example"], "the battery's own")
    skill = (await host.service.skills.list()).skills[0].name
    values = {"id": TARGET, "rid": str(asked.id), "name": skill, "filename": "SKILL.md"}
    calls = [
        (Call(method, PARAM.sub(lambda m: values.get(m[1], "x"), template)), body)
        for method, template in [*app_routes(host.settings, host.service), UNROUTED]
        for body in [harmful_body(method, template)]
    ]
    query = f"path={KEPT}&session_id={TARGET}&name=intruder.zip&recursive=true"
    try:
        yield Target(calls, query)
    finally:
        if asked.id in {r.id for r in await host.service.network.requests("pending")}:
            await host.service.network.decide(asked.id, approve=False)
        for info in host.service.list_sessions():
            if info.id not in before:  # TARGET, and whatever a broken guard let in
                await host.service.delete_session(info.id)


async def service_state(host: Host) -> dict[str, Any]:
    """What a call let through by mistake would change: the sessions, TARGET, the network
    requests, the skills and the audit log's newest entry."""
    service = host.service
    newest = wire(AuditPageModel, await service.audit.page(limit=1))["entries"]
    return {
        "sessions": sorted((info.id, info.state) for info in service.list_sessions()),
        "target": target_state(service),
        "requests": [asdict(r) for r in await service.network.requests()],
        "skills": sorted(s.name for s in (await service.skills.list()).skills),
        "audit": newest[0]["id"] if newest else None,
    }


def target_state(service: Service) -> dict[str, Any] | None:
    """TARGET's files, options, limits and network; None once it is gone."""
    try:
        return {
            "files": asdict(service.files.list(TARGET, ".", recursive=True)),
            "kept": service.files.read(TARGET, KEPT),
            "options": service.sessions.session(TARGET).options,
            "limits": service.controls.limits(TARGET).limits,
            "network": wire(NetworkPolicyModel, service.network.policy(TARGET)),
        }
    except SessionNotFound:
        return None


async def refused_everywhere(
    host: Host,
    calls: list[tuple[Call, bytes]],
    headers: Mapping[str, str],
    refusal: tuple[int, str],
    query: str,
) -> None:
    """Make every call with `headers`; each must get exactly `refusal` (status, code), reach
    the server, and leave the service as it was."""
    before = await service_state(host)
    hits = len(host.server_hits)
    wrong = []
    for call, body in calls:
        sent = body if call.method in ("POST", "PUT", "PATCH") else b""
        reply = await send_http(
            host.server_port, call.method, f"{call.path}?{query}", headers, sent
        )
        answer = CODERUNNER_REFUSAL if _as_coderunner(call.path, refusal) else refusal
        expected = (answer[0], None if call.method == "HEAD" else answer[1])
        if (reply.status, reply.code) != expected:
            wrong.append(f"{call}: {reply.status} {reply.body[:200]!r}")
    assert wrong == [], "\n".join(wrong)
    assert len(host.server_hits) - hits == len(calls)  # each attempt did reach the server
    assert await service_state(host) == before


# On the paths coderunner serves too, a foreign Host or Origin gets coderunner's answer.
CODERUNNER_REFUSAL = (403, "Invalid Host or Origin header")
HEADER_REFUSALS = {"host_not_allowed", "origin_not_allowed"}


def _as_coderunner(path: str, refusal: tuple[int, str]) -> bool:
    return path in compat.PATHS and refusal[1] in HEADER_REFUSALS


def server_tokens(host: Host) -> Tokens:
    return load_tokens(host.settings.config_dir, env={})


def own_host(host: Host) -> str:
    return f"127.0.0.1:{host.server_port}"


# -- the guard: tokens ---------------------------------------------------------------------------


def _near_miss(token: str) -> str:
    """The token with its last character changed: the right length, one character off."""
    return token[:-1] + ("A" if token[-1] != "A" else "B")


BAD_CREDENTIALS: dict[str, Callable[[Tokens], tuple[dict[str, str], str]]] = {
    "no token": lambda t: ({}, ""),
    "a wrong token": lambda t: ({"Authorization": "Bearer not-the-token"}, ""),
    "a token of the right length": lambda t: (
        {"Authorization": f"Bearer {_near_miss(t.admin)}"},
        "",
    ),
    "the basic scheme": lambda t: ({"Authorization": f"Basic {t.admin}"}, ""),
    "the token in the query string": lambda t: (
        {},
        f"token={t.admin}&access_token={t.admin}&api_key={t.admin}&key={t.admin}",
    ),
}


@pytest.mark.parametrize("credential", list(BAD_CREDENTIALS))
async def test_call_every_route_with_a_bad_credential(
    host: Host, target: Target, credential: str
) -> None:
    """Every route but GET /health answers 401 with the Bearer challenge, and runs nothing."""
    headers, query = BAD_CREDENTIALS[credential](server_tokens(host))
    headers = {"Host": own_host(host), "Content-Type": "application/json", **headers}
    await refused_everywhere(
        host, target.guarded_calls(), headers, (401, "unauthorized"), f"{target.query}&{query}"
    )
    reply = await send_http(host.server_port, "GET", "/v1/sessions", headers)
    assert reply.headers["www-authenticate"] == 'Bearer realm="corral"'


DASHBOARD_CREDENTIALS: dict[str, Callable[[Tokens], dict[str, str]]] = {
    "no token": lambda t: {},
    "the admin token as a bearer": lambda t: {"Authorization": f"Bearer {t.admin}"},
    "the agent token as a bearer": lambda t: {"Authorization": f"Bearer {t.agent}"},
    "the admin token as an API key": lambda t: {"X-API-Key": t.admin},
    "the admin token as the cookie": lambda t: {"Cookie": f"corral_ui={t.admin}"},
    "a forged cookie": lambda t: {"Cookie": "corral_ui=" + "A" * 43},
}


@pytest.mark.parametrize("credential", list(DASHBOARD_CREDENTIALS))
async def test_call_every_dashboard_route_without_a_login(
    host: Host, target: Target, credential: str
) -> None:
    """No token opens the dashboard, only its login's cookie: without one every page sends
    the browser to the login form, every live stream and change answers 401, and nothing
    changes (the change's Origin is this server's, so only the login is missing)."""
    calls = target.dashboard_calls()
    assert len(calls) >= 10  # the dashboard's routes were found in the app
    headers = {
        "Host": own_host(host),
        "Origin": f"http://{own_host(host)}",
        "Content-Type": "application/x-www-form-urlencoded",
        **DASHBOARD_CREDENTIALS[credential](server_tokens(host)),
    }
    before = await service_state(host)
    wrong = []
    for call in calls:
        sent = DASHBOARD_FORM if call.method == "POST" else b""
        reply = await send_http(host.server_port, call.method, call.path, headers, sent)
        to_login = reply.status == 303 and reply.headers["location"].startswith("/ui/login?")
        if not (to_login or reply.status == 401):
            wrong.append(f"{call}: {reply.status} {reply.body[:200]!r}")
    assert wrong == [], "\n".join(wrong)
    assert await service_state(host) == before


async def test_use_the_agent_token_on_every_admin_route(host: Host, target: Target) -> None:
    assert len(target.admin_calls()) >= 10  # the admin routes were found in the app
    headers = {
        "Host": own_host(host),
        "Content-Type": "application/json",
        "Authorization": f"Bearer {server_tokens(host).agent}",
    }
    await refused_everywhere(host, target.admin_calls(), headers, (403, "admin_only"), target.query)


# -- the guard: Host and Origin (DNS rebinding, cross-site requests) ------------------------------

FOREIGN_HOSTS = [
    "evil.example:{port}",
    "127.0.0.1.evil.example:{port}",
    "localhost.evil.example:{port}",
    "10.1.2.3:{port}",  # an address other than loopback, as a rebinding to the LAN gives
    "",
]


@pytest.mark.parametrize("foreign", FOREIGN_HOSTS, ids=lambda h: h or "empty")
async def test_call_every_route_under_a_foreign_host_name(
    host: Host, target: Target, foreign: str
) -> None:
    """A page whose name was rebound to 127.0.0.1 is refused on every route, /health and
    /mcp included, even holding the admin token: 421, or coderunner's 403 on its paths."""
    headers = {
        "Host": foreign.format(port=host.server_port),
        "Content-Type": "application/json",
        "Authorization": f"Bearer {server_tokens(host).admin}",
    }
    await refused_everywhere(host, target.calls, headers, (421, "host_not_allowed"), target.query)


FOREIGN_ORIGINS = [
    "http://evil.example",
    "null",  # a sandboxed iframe or a file:// page
    "http://127.0.0.1.evil.example:{port}",
    "http://127.0.0.1:{other}",  # another local web app, one port over
]


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
async def test_call_every_route_from_a_foreign_origin(
    host: Host, target: Target, origin: str
) -> None:
    headers = {
        "Host": own_host(host),
        "Origin": origin.format(port=host.server_port, other=host.server_port + 1),
        "Content-Type": "application/json",
        "Authorization": f"Bearer {server_tokens(host).admin}",
    }
    await refused_everywhere(host, target.calls, headers, (403, "origin_not_allowed"), target.query)


MCP_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "battery", "version": "0"},
    },
}


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost"])
async def test_own_host_names_and_origins_are_still_answered(host: Host, name: str) -> None:
    """The refusals above are the guard's: the same server answers its own names and
    origins, MCP's own Host and Origin check included."""
    address = f"{name}:{host.server_port}"
    assert (await send_http(host.server_port, "GET", "/health", {"Host": address})).status == 200
    for origin in ({}, {"Origin": f"http://{address}"}):
        headers = {
            "Host": address,
            "Authorization": f"Bearer {server_tokens(host).agent}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **origin,
        }
        for method, path, body in (
            ("GET", "/v1/sessions", b""),
            ("GET", "/openapi.json", b""),
            ("POST", "/mcp", json.dumps(MCP_INIT).encode()),
        ):
            reply = await send_http(host.server_port, method, path, headers, body)
            assert reply.status == 200, (path, origin, reply.body[:200])


# -- the SSH agent bridge from inside -------------------------------------------------------------

BRIDGED = "esc-srv-bridge"
NO_KEYS = bytes([0, 0, 0, 5, 12, 0, 0, 0, 0])  # IDENTITIES_ANSWER with none


class CountingAgent:
    """A fake host SSH agent on a unix socket: counts connections, holds no keys."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.accepted = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                length = int.from_bytes(await reader.readexactly(4), "big")
                await reader.readexactly(length)
                writer.write(NO_KEYS)
                await writer.drain()
        writer.close()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[CountingAgent]:
        self.server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        try:
            yield self
        finally:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def host_agent(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CountingAgent]:
    """The fake agent, named by the server's SSH_AUTH_SOCK as `corral serve` would find it."""
    folder = Path(tempfile.mkdtemp(prefix="cesa", dir="/tmp"))  # short: a unix socket path
    try:
        async with CountingAgent(folder / "agent.sock").serving() as agent:
            monkeypatch.setenv("SSH_AUTH_SOCK", str(agent.path))
            yield agent
    finally:
        shutil.rmtree(folder, ignore_errors=True)


BRIDGE_PROBES = """
import json, socket
def attempt(first, close_write=False):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect('/run/corral-bridge/agent.sock')
    got = b''
    try:
        s.sendall(first)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        while chunk := s.recv(4096):
            got += chunk
    except ConnectionError:
        pass  # the bridge hung up mid-send: still not one byte back
    s.close()
    return got.hex()
token = open('/run/corral-bridge/token').read().strip()
near = token[:-1] + ('0' if token[-1] != '0' else '1')
ask = bytes([0, 0, 0, 1, 11])  # SSH_AGENTC_REQUEST_IDENTITIES
def line(word):
    return b'corral-bridge 1 ' + word + b' ssh-agent\\n'
print(json.dumps({
    'wrong token': attempt(line(near.encode()) + ask),
    'empty token': attempt(line(b'') + ask),
    'no token': attempt(b'corral-bridge 1 ssh-agent\\n' + ask),
    'agent bytes alone': attempt(ask, close_write=True),
    'garbage': attempt(bytes(range(1, 10)) + b'\\xff\\xfe garbage \\x1b[31m\\n' + ask),
    'oversized': attempt(b'corral-bridge 1 ' + b'f' * 4096 + b' ssh-agent\\n' + ask),
}))
"""

THROUGH_THE_SHIM = """
import json, os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
s.connect(os.environ['SSH_AUTH_SOCK'])
s.sendall(bytes([0, 0, 0, 1, 11]))
got = b''
while len(got) < 9 and (chunk := s.recv(9 - len(got))):
    got += chunk
s.close()
print(json.dumps(got.hex()))
"""


async def at_least(entries: Awaitable[list[str]], count: int) -> bool:
    return len(await entries) >= count


async def bridge_actions(host: Host) -> list[str]:
    entries = wire(AuditPageModel, await host.service.audit.page(kind="bridge", session=BRIDGED))[
        "entries"
    ]
    return [entry["action"] for entry in reversed(entries)]


@contextlib.asynccontextmanager
async def bridged_session(host: Host) -> AsyncIterator[str]:
    """BRIDGED with its bridge enabled by the operator, started, and deleted at the end."""
    await host.service.sessions.create(BRIDGED, start=False)
    try:
        await host.service.controls.set_bridge(BRIDGED, True)
        await host.service.start_session(BRIDGED)
        yield BRIDGED
    finally:
        await host.service.delete_session(BRIDGED)


async def test_reach_the_host_agent_through_the_bridge_without_the_token(
    host: Host, host_agent: CountingAgent
) -> None:
    async with bridged_session(host) as sid:
        answers = await py(host, BRIDGE_PROBES, sid)
        assert answers == dict.fromkeys(answers, "") and len(answers) == 6, answers
        await until(lambda: at_least(bridge_actions(host), 6), "the six refusals audited")
        assert await bridge_actions(host) == [
            "refused: wrong token",
            "refused: wrong token",
            "refused: malformed handshake",
            "refused: closed before the handshake",
            "refused: malformed handshake",
            "refused: handshake too long",
        ]
        assert host_agent.accepted == 0
        # The bridge is live: the shim, with the session's token, reaches the host agent.
        assert await py(host, THROUGH_THE_SHIM, sid) == NO_KEYS.hex()
        assert host_agent.accepted == 1
        await until(lambda: at_least(bridge_actions(host), 7), "the relay audited")
        assert (await bridge_actions(host))[-1] == "relayed"


# -- the warm pool's hand-over --------------------------------------------------------------------

TRACE = f"corral-pool-trace-{TOKEN}"  # the name of every file and the abstract socket
MODULE = f"corral_pool_trace_{TOKEN}"  # a module and a .pth file in the package prefix
LOADED = f"{MODULE}_loaded"  # a module put in sys.modules only
ENV_VAR = "CORRAL_POOL_TRACE"
PTH_VAR = "CORRAL_POOL_TRACE_PTH"  # set by the .pth at the start of any later interpreter
SLEEP_S = f"86400.{int(TOKEN, 16) % 10**6:06d}"  # sleep's argument marks it on the host
FOLDERS = {"tmp": "/tmp", "shm": "/dev/shm", "workspace": "/workspace", "prefix": "/opt/corral/env"}

LEAVE_TRACES = f"""
import os, site, socket, subprocess, sys, types
for folder in {[*FOLDERS.values(), "~"]!r}:
    open(os.path.join(os.path.expanduser(folder), {TRACE!r}), 'w').write('left by X')
packages = site.getsitepackages()[0]
open(os.path.join(packages, {MODULE!r} + '.py'), 'w').write('LEFT = True\\n')
open(os.path.join(packages, {MODULE!r} + '.pth'), 'w').write(
    "import os; os.environ[{PTH_VAR!r}] = 'ran'\\n")
os.environ[{ENV_VAR!r}] = 'left by X'
sys.modules[{LOADED!r}] = types.ModuleType({LOADED!r})
_trace_sleep = subprocess.Popen(['sleep', {SLEEP_S!r}], start_new_session=True)
_trace_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
_trace_socket.bind('\\0' + {TRACE!r})
_trace_socket.listen(1)
print('null')
"""

LOOK_FOR_TRACES = f"""
import errno, importlib, importlib.util, json, os, socket, sys
def _connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect('\\0' + {TRACE!r})
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
    finally:
        s.close()
def _sleeping():
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            argv = open(f'/proc/{{pid}}/cmdline', 'rb').read().split(b'\\0')
        except OSError:
            continue
        if {SLEEP_S!r}.encode() in argv:
            return True
    return False
importlib.invalidate_caches()
seen = {{name: os.path.exists(os.path.join(folder, {TRACE!r}))
        for name, folder in {FOLDERS!r}.items()}}
seen['home'] = os.path.exists(os.path.join(os.path.expanduser('~'), {TRACE!r}))
seen['prefix module'] = importlib.util.find_spec({MODULE!r}) is not None
seen['pth ran'] = {PTH_VAR!r} in os.environ
seen['environment'] = {ENV_VAR!r} in os.environ
seen['sys.modules'] = {LOADED!r} in sys.modules
seen['sleep'] = _sleeping()
seen['abstract socket'] = _connect()
print(json.dumps(seen))
"""

ALL_LEFT = {
    **dict.fromkeys([*FOLDERS, "home", "prefix module", "environment", "sys.modules"], True),
    "pth ran": False,  # X's own interpreter started before the .pth was written
    "sleep": True,
    "abstract socket": "ok",
}
NONE_LEFT = {**dict.fromkeys(ALL_LEFT, False), "abstract socket": "ECONNREFUSED"}
FILL_S = 90.0


def sandbox_tree(service: Service, sid: str) -> list[psutil.Process]:
    """The host processes of `sid`'s python sandbox: its bwrap and everything under it."""
    root = psutil.Process(service.sessions.session(sid).kernels["python"].pid)
    return [root, *root.children(recursive=True)]


def marked_sleeps() -> list[psutil.Process]:
    """Host processes running X's marked sleep, wherever they were reparented."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if process.info["cmdline"] == ["sleep", SLEEP_S]:
            found.append(process)
    return found


def alive(process: psutil.Process) -> bool:
    """True while `process` (the same one: pid and start time) runs and is no zombie."""
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def traces_on_host(settings: Settings) -> list[Path]:
    found: list[Path] = []
    for root in (settings.state_dir, settings.run_root):
        found += [*root.rglob(f"*{TRACE}*"), *root.rglob(f"*{MODULE}*")]
    return found


async def py_in(service: Service, code: str, sid: str) -> Any:
    """`py` for a service that is not the battery's host."""
    result = await service.executions.run(code, session_id=sid, timeout_s=30.0)
    assert result.status == "ok", result.text()
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
async def pooled(settings: Settings) -> AsyncIterator[Service]:
    """A service of this test's own keeping two default-profile kernels ready."""
    async with Service(replace(settings, pool_size=2)) as service:
        await service.sessions.pool.wait_full(FILL_S)
        yield service


async def test_leave_traces_for_the_next_sessions_from_the_warm_pool(pooled: Service) -> None:
    x = await pooled.create_session("pool-x")
    assert x.from_pool
    await py_in(pooled, LEAVE_TRACES, "pool-x")
    assert await py_in(pooled, LOOK_FOR_TRACES, "pool-x") == ALL_LEFT
    tree = sandbox_tree(pooled, "pool-x")
    sleeps = marked_sleeps()
    assert len(sleeps) == 1 and sleeps[0].pid in {p.pid for p in tree}, (sleeps, tree)

    await pooled.delete_session("pool-x")
    await until(lambda: not any(alive(p) for p in tree), "X's processes gone from the host")
    assert [p for p in marked_sleeps() if alive(p)] == []
    assert traces_on_host(pooled.settings) == []

    # The pool hands kernels over oldest first: one started before X was taken, one while
    # it ran, one after it was gone.
    for sid in ("pool-y", "pool-z", "pool-w"):
        await pooled.sessions.pool.wait_full(FILL_S)
        info = await pooled.create_session(sid)
        assert info.from_pool, sid
        assert await py_in(pooled, LOOK_FOR_TRACES, sid) == NONE_LEFT, sid
