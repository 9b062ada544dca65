"""The network policy as a sandboxed program meets it: real sessions, real tools, host servers.

Host-side servers bind 127.0.0.2: inside a sandbox 127.0.0.1 is the sandbox's own loopback
(and in NO_PROXY), so the only way to a host service is an address the policy lists exactly.
One service and one session ("net") serve the whole module; every test sets the policy it
needs first, so the order of the tests does not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import socketserver
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from corral.kernels.results import ExecutionResult
from corral.server.operation import wire
from corral.server.schemas import AuditPageModel, NetworkPolicyModel
from corral.service import Service
from tests.conftest import make_settings
from tests.loopback import HOST, serve_directory
from tests.wheels import tiny_wheel

SID = "net"
HELLO = "hello from the host\n"
BIG_BYTES = 200_000
MANY_FILES = 120  # a repository of that many blobs: one dumb-HTTP request per loose object


# -- host-side servers ---------------------------------------------------------------------


@dataclass
class EchoServer:
    """Echoes what it reads, upper-cased; counts connections that have ended."""

    port: int = 0
    ended: list[int] = field(default_factory=list)


@contextlib.contextmanager
def serve_echo() -> Iterator[EchoServer]:
    echo = EchoServer()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.settimeout(60)
            with contextlib.suppress(OSError):
                while data := self.request.recv(4096):
                    self.request.sendall(data.upper())
            echo.ended.append(1)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    tcp = Server((HOST, 0), Handler)
    echo.port = int(tcp.server_address[1])
    thread = threading.Thread(target=tcp.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield echo
    finally:
        tcp.shutdown()
        tcp.server_close()
        thread.join(10)


def write_index(root: Path) -> None:
    """A PEP 503 simple index at root/simple with one project, corraltiny."""
    wheel = tiny_wheel("from the index")
    name = "corraltiny-1.0-py3-none-any.whl"
    (root / "files").mkdir()
    (root / "files" / name).write_bytes(wheel)
    project = root / "simple" / "corraltiny"
    project.mkdir(parents=True)
    (root / "simple" / "index.html").write_text(
        '<!DOCTYPE html><html><body><a href="corraltiny/">corraltiny</a></body></html>\n'
    )
    digest = hashlib.sha256(wheel).hexdigest()
    (project / "index.html").write_text(
        "<!DOCTYPE html><html><body>"
        f'<a href="../../files/{name}#sha256={digest}">{name}</a>'
        "</body></html>\n"
    )


def write_bare_repo(parent: Path, scratch: Path, name: str = "repo.git", files: int = 1) -> None:
    """parent/NAME: a bare repository with one commit, its objects loose, ready for dumb HTTP."""
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    git = [
        "git",
        "-c",
        "user.name=corral tests",
        "-c",
        "user.email=tests@corral.invalid",
        "-c",
        "init.defaultBranch=main",
    ]
    work = scratch / name.removesuffix(".git")

    def run(*args: str) -> None:
        subprocess.run([*git, *args], env=env, check=True, capture_output=True, timeout=60)

    run("init", "-q", str(work))
    (work / "README").write_text("cloned through corral\n")
    for index in range(1, files):
        (work / f"file{index}.txt").write_text(f"file {index}\n")
    run("-C", str(work), "add", ".")
    run("-C", str(work), "commit", "-q", "-m", "first")
    run("clone", "-q", "--bare", str(work), str(parent / name))  # a local clone: objects loose
    run("-C", str(parent / name), "update-server-info")


@dataclass(frozen=True)
class Site:
    port: int  # hello.txt, big.bin, the simple index and repo.git
    other: int  # a second server with the same files, never listed by the tests


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("site")
    (root / "hello.txt").write_text(HELLO)
    (root / "big.bin").write_bytes(os.urandom(BIG_BYTES))
    write_index(root)
    scratch = tmp_path_factory.mktemp("scratch")
    write_bare_repo(root, scratch)
    write_bare_repo(root, scratch, "many.git", files=MANY_FILES)
    with serve_directory(root) as port, serve_directory(root) as other:
        yield Site(port, other)


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    with serve_echo() as server:
        yield server


@pytest.fixture(scope="module")
async def net(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    """One service for the module with session SID running (its bash kernel starts on use)."""
    run = Path(tempfile.mkdtemp(prefix="crn", dir="/tmp"))
    settings = make_settings(tmp_path_factory.mktemp("egress") / "state", run)
    try:
        async with Service(settings) as service:
            await service.create_session(SID)
            yield service
    finally:
        shutil.rmtree(run, ignore_errors=True)


# -- helpers -------------------------------------------------------------------------------


async def sh(service: Service, script: str, session_id: str = SID) -> ExecutionResult:
    return await service.executions.run(
        script, session_id=session_id, language="bash", timeout_s=60
    )


async def py(service: Service, code: str) -> ExecutionResult:
    return await service.executions.run(code, session_id=SID, timeout_s=60)


def curl(url: str, *options: str) -> str:
    """A curl command whose output ends with 'HTTP <status>' and 'rc=<exit code>'."""
    extra = " ".join(options)
    return f"curl -sS --max-time 20 {extra} -w '\\nHTTP %{{http_code}}\\n' '{url}'; echo \"rc=$?\""


def fetched(result: ExecutionResult) -> tuple[int, int, str]:
    """(HTTP status, curl exit code, the whole text) of a `curl(...)` run."""
    text = result.text()
    status = re.search(r"^HTTP (\d+)$", text, re.M)
    code = re.search(r"^rc=(\d+)$", text, re.M)
    assert status is not None and code is not None, text
    return int(status.group(1)), int(code.group(1)), text


async def allow_only(service: Service, *ports: int) -> None:
    await service.network.set(SID, "allowlist", [f"{HOST}:{port}" for port in ports])


def stats(service: Service) -> dict[str, int]:
    return dict(wire(NetworkPolicyModel, service.network.policy(SID))["stats"])


# -- mode none -----------------------------------------------------------------------------


async def test_mode_none_refuses_curl_with_a_403_that_names_the_host_and_the_fix(
    net: Service, site: Site
) -> None:
    await net.network.set(SID, "none", [])
    status, code, text = fetched(await sh(net, curl(f"http://{HOST}:{site.port}/hello.txt")))
    assert (status, code) == (403, 0), text
    assert HELLO not in text
    assert f"corral refused {HOST}:{site.port}: mode none" in text
    assert f"corral net allow {SID} {HOST}" in text
    assert "request_network_access" in text


async def test_mode_none_refuses_a_tunnel_and_socks_too(net: Service, site: Site) -> None:
    await net.network.set(SID, "none", [])
    url = f"http://{HOST}:{site.port}/hello.txt"
    status, code, text = fetched(await sh(net, curl(url, "--proxytunnel")))
    assert code != 0 and HELLO not in text
    assert "403" in text, text
    status, code, text = fetched(await sh(net, curl(url, "--socks5-hostname", "127.0.0.1:1080")))
    assert code != 0 and status == 0 and HELLO not in text, text


# -- allowlist -----------------------------------------------------------------------------


async def test_allowlist_admits_its_host_and_port_for_curl(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    status, code, text = fetched(await sh(net, curl(f"http://{HOST}:{site.port}/hello.txt")))
    assert (status, code) == (200, 0), text
    assert HELLO in text
    status, code, text = fetched(
        await sh(net, curl(f"http://{HOST}:{site.port}/hello.txt", "--proxytunnel"))
    )
    assert (status, code) == (200, 0) and HELLO in text, text


async def test_allowlist_refuses_another_port_of_the_same_host(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    status, code, text = fetched(await sh(net, curl(f"http://{HOST}:{site.other}/hello.txt")))
    assert (status, code) == (403, 0), text
    assert HELLO not in text
    assert f"corral refused {HOST}:{site.other}" in text
    assert "not listed by address" in text


async def test_allowlist_admits_python_requests(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    code = (
        "import requests\n"
        f"ok = requests.get('http://{HOST}:{site.port}/hello.txt', timeout=20)\n"
        f"no = requests.get('http://{HOST}:{site.other}/hello.txt', timeout=20)\n"
        "(ok.status_code, ok.text, no.status_code, 'corral refused' in no.text)"
    )
    result = await py(net, code)
    assert result.status == "ok", result.text()
    assert result.results == [{"text/plain": f"(200, {HELLO!r}, 403, True)"}]


async def test_pip_installs_from_an_allowed_index_and_not_from_a_refused_one(
    net: Service, site: Site
) -> None:
    index = f"http://{HOST}:{site.port}/simple/"
    await net.network.set(SID, "none", [])
    before = stats(net)
    refused = await sh(
        net,
        f'pip install --retries 0 --timeout 15 --index-url {index} corraltiny 2>&1; echo "rc=$?"',
    )
    assert "rc=0" not in refused.text(), refused.text()
    assert "No matching distribution found for corraltiny" in refused.text(), refused.text()
    assert stats(net)["refused"] > before["refused"]  # the proxy said no, nothing else did

    await allow_only(net, site.port)
    installed = await sh(
        net,
        f"pip install --quiet --retries 0 --timeout 15 --index-url {index} corraltiny 2>&1; "
        'echo "rc=$?"\n'
        "python -c 'import corraltiny; print(corraltiny.VALUE)'",
    )
    text = installed.text()
    assert "rc=0" in text and "from the index" in text, text


async def test_git_clones_over_dumb_http_from_an_allowed_host(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    result = await sh(
        net,
        "rm -rf /workspace/clone\n"
        f"git clone -q http://{HOST}:{site.port}/repo.git /workspace/clone 2>&1; "
        'echo "rc=$?"\n'
        "cat /workspace/clone/README; git -C /workspace/clone log --format=%s",
    )
    text = result.text()
    assert "rc=0" in text and "cloned through corral" in text and "first" in text, text


async def test_a_name_that_resolves_to_loopback_is_refused_even_when_listed(net: Service) -> None:
    # The host proxy resolves "localhost" itself (to the host's loopback): a name rule never
    # admits a non-public address; only listing the exact address does.
    await net.network.set(SID, "allowlist", ["localhost"])
    status, _, text = fetched(await sh(net, curl("http://localhost:9/", "--noproxy ''")))
    assert status == 403, text
    assert "not a public address" in text


async def test_git_clones_a_repository_of_many_loose_objects(net: Service, site: Site) -> None:
    # One request, and with http.server's HTTP/1.0 one connection, per object: more than the
    # session's 64 connections in a second or two, so each must free its slot when it ends.
    name = "net-git"  # its own session: its connection count must not spill into SID's
    await net.sessions.create(name, start=False)
    try:
        await net.network.set(name, "allowlist", [f"{HOST}:{site.port}"])
        result = await sh(
            net,
            f"git clone -q http://{HOST}:{site.port}/many.git /workspace/many 2>&1; "
            'echo "rc=$?"; ls /workspace/many | wc -l',
            session_id=name,
        )
    finally:
        await net.delete_session(name)
    text = result.text()
    assert "429" not in text and "rc=0" in text, text
    assert text.rstrip().endswith(str(MANY_FILES)), text


# -- live changes --------------------------------------------------------------------------


async def test_switching_none_allowlist_none_applies_to_the_next_connection(
    net: Service, site: Site
) -> None:
    url = f"http://{HOST}:{site.port}/hello.txt"
    await net.network.set(SID, "none", [])
    assert fetched(await sh(net, curl(url)))[0] == 403
    changed = wire(
        NetworkPolicyModel, await net.network.set(SID, "allowlist", [f"{HOST}:{site.port}"])
    )
    assert changed["mode"] == "allowlist" and changed["allow"] == [f"{HOST}:{site.port}"]
    status, _, text = fetched(await sh(net, curl(url)))
    assert status == 200 and HELLO in text, text
    await net.network.set(SID, "none", [])
    status, _, text = fetched(await sh(net, curl(url)))
    assert status == 403 and HELLO not in text, text


TUNNEL_HELPERS = """
import socket

def open_tunnel(port):
    sock = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    target = f"127.0.0.2:{port}"
    sock.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head and len(head) < 8192:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head.split(b"\\r\\n")[0].decode()

def exchange(sock, data):
    try:
        sock.sendall(data)
        got = b""
        while len(got) < len(data):
            chunk = sock.recv(4096)
            if not chunk:
                return "closed"
            got += chunk
        return got.decode()
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        return "error " + type(exc).__name__
"""
CUT = {"closed", "error ConnectionResetError", "error BrokenPipeError"}


async def wait_for_ends(echo: EchoServer, count: int) -> None:
    for _ in range(100):
        if len(echo.ended) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the host side still has a connection open ({echo.ended})")


async def test_an_open_tunnel_is_cut_when_the_policy_no_longer_allows_it(
    net: Service, echo: EchoServer
) -> None:
    assert (await py(net, TUNNEL_HELPERS)).status == "ok"
    await allow_only(net, echo.port)
    opened = await py(
        net,
        f"tunnel, line = open_tunnel({echo.port})\n(line, exchange(tunnel, b'ping'))",
    )
    assert opened.results == [{"text/plain": "('HTTP/1.1 200 Connection established', 'PING')"}]

    # An unrelated change keeps it: the tunnel is still allowed.
    kept = wire(NetworkPolicyModel, await net.network.allow(SID, ["example.org"]))
    assert kept["tunnels_closed"] == 0
    again = await py(net, "exchange(tunnel, b'still')")
    assert again.results == [{"text/plain": "'STILL'"}], again.text()

    ended = len(echo.ended)
    cut = wire(NetworkPolicyModel, await net.network.set(SID, "none", []))
    assert cut["tunnels_closed"] == 1
    after = await py(net, "exchange(tunnel, b'after'), tunnel.close()")
    assert after.status == "ok", after.text()
    outcome = after.results[0]["text/plain"]
    assert any(f"('{word}', None)" == outcome for word in CUT), outcome
    await wait_for_ends(echo, ended + 1)
    refused = await py(net, f"open_tunnel({echo.port})[1]")
    assert refused.results == [{"text/plain": "'HTTP/1.1 403 Forbidden'"}]


async def test_denying_the_entry_cuts_an_open_tunnel_too(net: Service, echo: EchoServer) -> None:
    assert (await py(net, TUNNEL_HELPERS)).status == "ok"
    await allow_only(net, echo.port)
    opened = await py(net, f"tunnel, _ = open_tunnel({echo.port})\nexchange(tunnel, b'x')")
    assert opened.results == [{"text/plain": "'X'"}], opened.text()
    ended = len(echo.ended)
    denied = wire(NetworkPolicyModel, await net.network.deny(SID, [f"{HOST}:{echo.port}"]))
    assert (denied["mode"], denied["allow"], denied["tunnels_closed"]) == ("allowlist", [], 1)
    after = await py(net, "exchange(tunnel, b'y'), tunnel.close()")
    outcome = after.results[0]["text/plain"]
    assert any(f"('{word}', None)" == outcome for word in CUT), outcome
    await wait_for_ends(echo, ended + 1)


# -- no way around the proxy ---------------------------------------------------------------


async def test_a_program_that_ignores_the_proxy_gets_no_network(net: Service, site: Site) -> None:
    await allow_only(net, site.port)  # even an allowed host is reachable only through the proxy
    direct = await py(
        net,
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('{HOST}', {site.port}), timeout=5).close()\n"
        "    outcome = 'connected'\n"
        "except OSError as exc:\n"
        "    outcome = type(exc).__name__\n"
        "(outcome, [name for _, name in socket.if_nameindex()])",
    )
    assert direct.status == "ok", direct.text()
    outcome = direct.results[0]["text/plain"]
    assert "connected" not in outcome and "['lo']" in outcome, outcome
    status, code, text = fetched(
        await sh(net, curl(f"http://{HOST}:{site.port}/hello.txt", "--noproxy '*'"))
    )
    assert code != 0 and status == 0 and HELLO not in text, text


# -- SOCKS5 --------------------------------------------------------------------------------


async def test_a_socks5h_client_works_when_allowed(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    socks = ("--socks5-hostname", "127.0.0.1:1080")
    status, code, text = fetched(
        await sh(net, curl(f"http://{HOST}:{site.port}/hello.txt", *socks))
    )
    assert (status, code) == (200, 0) and HELLO in text, text
    status, code, text = fetched(
        await sh(net, curl(f"http://{HOST}:{site.other}/hello.txt", *socks))
    )
    assert code != 0 and status == 0 and HELLO not in text, text


# -- audit and counters --------------------------------------------------------------------


async def test_the_audit_log_records_each_decision_with_its_rule(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    await sh(net, curl(f"http://{HOST}:{site.port}/hello.txt"))
    await sh(net, curl(f"http://{HOST}:{site.other}/hello.txt"))
    entries = wire(AuditPageModel, await net.audit.page(kind="network", session=SID, limit=2))[
        "entries"
    ]
    refused, allowed = entries  # newest first
    assert allowed["action"] == "allow" and allowed["target"] == f"{HOST}:{site.port}"
    assert allowed["detail"]["rule"] == f"address listed: {HOST}:{site.port}"
    assert allowed["detail"]["address"] == HOST and allowed["detail"]["allowed"] is True
    assert refused["action"] == "deny" and refused["target"] == f"{HOST}:{site.other}"
    assert "not listed by address" in refused["detail"]["rule"]
    assert refused["detail"]["allowed"] is False
    changes = wire(AuditPageModel, await net.audit.page(kind="admin", session=SID, limit=1))[
        "entries"
    ]
    assert changes[0]["action"] == "set_network"


async def test_the_proxy_counts_connections_refusals_and_bytes(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    before = stats(net)
    url = f"http://{HOST}:{site.port}/big.bin"
    result = await sh(net, curl(url, "--proxytunnel", "-o /dev/null"))
    assert fetched(result)[:2] == (200, 0), result.text()
    await sh(net, curl(f"http://{HOST}:{site.other}/hello.txt"))
    after = stats(net)
    assert after["connections"] - before["connections"] == 2
    assert after["refused"] - before["refused"] == 1
    assert after["bytes_in"] - before["bytes_in"] >= BIG_BYTES
    assert after["bytes_out"] - before["bytes_out"] >= len("GET /big.bin HTTP/1.1\r\n\r\n")


async def test_bytes_out_counts_the_head_of_a_plain_http_request(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    query = "q=" + "x" * 4000  # data can leave in the URL; it should be counted
    before = stats(net)
    result = await sh(net, curl(f"http://{HOST}:{site.port}/hello.txt?{query}"))
    assert fetched(result)[:2] == (200, 0), result.text()
    assert stats(net)["bytes_out"] - before["bytes_out"] >= len(query)
