"""Secrets in HTTPS requests: the proxy reads tunnels to a secret's hosts with corral's CA,
which the sandbox trusts, and verifies the origin itself.

The origins are HTTPS servers on 127.0.0.2 with certificates from a throw-away CA
(trustme), which the server trusts through `egress_upstream_ca` as it would a company CA;
a second origin's certificate comes from a CA nobody trusts. Clients in a real sandbox:
curl, requests, httpx and urllib.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from tests.loopback import HOST, serve
from tests.server.conftest import RunningServer, variant_server
from tests.wheels import tiny_wheel

pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(240)]

VALUE = "sk-https-test-value-0123456789"
CLIENTS = {
    "curl": (
        "import os, subprocess\n"
        "out = subprocess.run(['curl', '-sS', '-H', 'Authorization: Bearer ' + "
        "os.environ['API_TOKEN'], '{url}'], capture_output=True, text=True)\n"
        "print(out.stdout or out.stderr)"
    ),
    "requests": (
        "import os, requests\n"
        "r = requests.get('{url}', headers={{'Authorization': 'Bearer ' + "
        "os.environ['API_TOKEN']}}, timeout=20)\n"
        "print(r.text)"
    ),
    "httpx": (
        "import os, httpx\n"
        "r = httpx.get('{url}', headers={{'Authorization': 'Bearer ' + "
        "os.environ['API_TOKEN']}}, timeout=20)\n"
        "print(r.text)"
    ),
    "urllib": (
        "import os, urllib.request\n"
        "q = urllib.request.Request('{url}', headers={{'Authorization': 'Bearer ' + "
        "os.environ['API_TOKEN']}})\n"
        "print(urllib.request.urlopen(q, timeout=20).read().decode())"
    ),
}


@contextlib.contextmanager
def https_site(ca: trustme.CA) -> Iterator[tuple[int, list[str]]]:
    """An HTTPS origin on 127.0.0.2 whose certificate `ca` signed; it records the
    Authorization headers it is sent and answers whether the value was right."""
    seen: list[str] = []

    class Origin(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = b"right value" if seen[-1] == f"Bearer {VALUE}" else b"wrong value"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    with _serving(ca, Origin) as port:
        yield port, seen


@pytest.fixture(scope="module")
def trusted() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def reading(
    server_settings: Any, trusted: trustme.CA, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """A server that trusts `trusted` for origins (as an operator's company CA)."""
    ca_file = tmp_path_factory.mktemp("upstream-ca") / "ca.pem"
    trusted.cert_pem.write_to_path(str(ca_file))
    with variant_server(server_settings, egress_upstream_ca=str(ca_file)) as running:
        yield running


def admin(server: RunningServer, method: str, path: str, body: Any = None) -> httpx.Response:
    with server.client("admin") as http:
        answer = http.request(method, path, json=body)
    assert answer.status_code < 300, answer.text
    return answer


def run(server: RunningServer, sid: str, code: str) -> str:
    with server.client() as http:
        answer = http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert answer.status_code == 200, answer.text
    result = answer.json()
    failure = (
        f"{result['error']['ename']}: {result['error']['evalue']}" if result.get("error") else ""
    )
    return str(result["stdout"]) + str(result["stderr"]) + failure


@pytest.fixture(scope="module")
def session(reading: RunningServer, trusted: trustme.CA) -> Iterator[tuple[str, int, list[str]]]:
    """A session holding API_TOKEN for the trusted origin, allowed to reach it."""
    with https_site(trusted) as (port, seen):
        with reading.client() as http:
            assert http.post("/v1/sessions", json={"id": "tls"}).status_code == 201
        admin(
            reading,
            "PUT",
            "/v1/admin/secrets/API_TOKEN",
            {"from_env": "CORRAL_TEST_HTTPS_VALUE", "hosts": [f"{HOST}:{port}"]},
        )
        admin(reading, "PUT", "/v1/admin/sessions/tls/secrets/API_TOKEN")
        admin(reading, "POST", "/v1/admin/sessions/tls/network/allow", {"hosts": [HOST]})
        with reading.client() as http:  # the variable comes with the next kernel start
            assert http.post("/v1/sessions/tls/restart").status_code == 200
        yield "tls", port, seen
        with reading.client() as http:
            http.delete("/v1/sessions/tls")


@pytest.fixture(autouse=True)
def value_in_the_servers_environment(
    monkeypatch: pytest.MonkeyPatch, reading: RunningServer, session: tuple[str, int, list[str]]
) -> Iterator[None]:
    """The value the server reads, and the secret pointed at the session's origin again
    after each test (a test may point it at another origin too)."""
    monkeypatch.setenv("CORRAL_TEST_HTTPS_VALUE", VALUE)
    yield
    point_secret(reading, session[1])


def point_secret(server: RunningServer, *ports: int) -> None:
    """API_TOKEN may go to these origins on 127.0.0.2."""
    admin(
        server,
        "PUT",
        "/v1/admin/secrets/API_TOKEN",
        {"from_env": "CORRAL_TEST_HTTPS_VALUE", "hosts": [f"{HOST}:{port}" for port in ports]},
    )


@pytest.mark.parametrize("client", list(CLIENTS))
def test_each_client_gets_the_value_put_into_its_https_request(
    reading: RunningServer, session: tuple[str, int, list[str]], client: str
) -> None:
    sid, port, seen = session
    before = len(seen)
    printed = run(reading, sid, CLIENTS[client].format(url=f"https://{HOST}:{port}/v1/models"))
    assert printed.strip() == "right value", printed
    assert seen[before:] == [f"Bearer {VALUE}"]
    assert VALUE not in printed


def test_the_sandbox_trusts_corrals_ca_only_through_its_files(
    reading: RunningServer, session: tuple[str, int, list[str]]
) -> None:
    sid, _, _ = session
    printed = run(
        reading,
        sid,
        "import os\n"
        "print(os.environ['SSL_CERT_FILE'], os.environ['NODE_EXTRA_CA_CERTS'])\n"
        "print('BEGIN CERTIFICATE' in open(os.environ['NODE_EXTRA_CA_CERTS']).read())\n"
        "print(any('PRIVATE KEY' in open(p).read() for p in "
        "(os.environ['SSL_CERT_FILE'], os.environ['NODE_EXTRA_CA_CERTS'])))",
    )
    assert printed.split("\n")[:3] == [
        "/opt/corral/tls/ca-bundle.pem /opt/corral/tls/corral-ca.pem",
        "True",
        "False",
    ], printed
    key = reading.settings.config_dir / "ca" / "corral-ca.key"
    assert key.stat().st_mode & 0o777 == 0o600


def test_an_origin_with_a_bad_certificate_is_refused(
    reading: RunningServer, session: tuple[str, int, list[str]]
) -> None:
    sid, own_port, _ = session
    with https_site(trustme.CA()) as (port, seen):
        point_secret(reading, own_port, port)
        code = CLIENTS["requests"].replace("print(r.text)", "print(r.status_code, r.text)")
        printed = run(reading, sid, code.format(url=f"https://{HOST}:{port}/"))
        assert printed.startswith("502 ") and "failed verification" in printed, printed
        assert seen == []  # the value never went to an origin that was not verified


def test_a_tunnel_to_another_host_is_not_read(
    reading: RunningServer, session: tuple[str, int, list[str]], trusted: trustme.CA
) -> None:
    """A host no secret goes to keeps its plain tunnel: the sandbox sees the origin's own
    certificate (which it does not trust), not one of corral's."""
    sid, _, _ = session
    with https_site(trusted) as (port, seen):
        code = (
            "import ssl, socket, os\n"
            "proxy = socket.create_connection(('127.0.0.1', 3128))\n"
            f"target = b'{HOST}:{port}'\n"
            "head = b'CONNECT ' + target + b' HTTP/1.1\\r\\nHost: ' + target\n"
            "proxy.sendall(head + b'\\r\\n\\r\\n')\n"
            "print(proxy.recv(100).split(b'\\r\\n')[0].decode())\n"
            "ctx = ssl.create_default_context(cafile=os.environ['NODE_EXTRA_CA_CERTS'])\n"
            "try:\n"
            f"    ctx.wrap_socket(proxy, server_hostname='{HOST}').close()\n"
            "    print('corral CA')\n"
            "except ssl.SSLCertVerificationError:\n"
            "    print('not corral CA')\n"
        )
        printed = run(reading, sid, code)
        assert printed.split("\n")[:2] == ["HTTP/1.1 200 Connection established", "not corral CA"]
        assert seen == []


@contextlib.contextmanager
def https_files(ca: trustme.CA, root: Path) -> Iterator[tuple[int, list[str]]]:
    """An HTTPS origin serving `root`'s files to requests that carry the value (as a bearer
    token, or as basic auth's password), 401 to any other."""
    seen: list[str] = []

    class Files(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            given = self.headers.get("Authorization", "")
            seen.append(given)
            if not _carries_value(given):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.path = self.path.split("?")[0]
            super().do_GET()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    with _serving(ca, Files) as port:
        yield port, seen


def _carries_value(header: str) -> bool:
    scheme, _, rest = header.partition(" ")
    if scheme == "Bearer":
        return rest == VALUE
    if scheme == "Basic":
        return base64.b64decode(rest).decode().partition(":")[2] == VALUE
    return False


@contextlib.contextmanager
def _serving(ca: trustme.CA, handler: Any) -> Iterator[int]:
    """`handler` over HTTPS on 127.0.0.2, with a certificate `ca` signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(HOST).configure_cert(context)
    with serve(handler, context) as port:
        yield port


@pytest.fixture(scope="module")
def tools_site(
    trusted: trustme.CA, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[int, list[str]]]:
    """A package index (one wheel) and a git repository (dumb HTTP), behind the secret."""
    root = tmp_path_factory.mktemp("site")
    wheel = "corraltiny-1.0-py3-none-any.whl"
    (root / "files").mkdir()
    (root / "files" / wheel).write_bytes(tiny_wheel("from the index"))
    index = root / "simple" / "corraltiny"
    index.mkdir(parents=True)
    (index / "index.html").write_text(f'<a href="../../files/{wheel}">{wheel}</a>')
    work = root / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "README").write_text("from the repository\n")
    subprocess.run([*git, "-C", str(work), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(root / "repo.git")], check=True)
    subprocess.run(["git", "--git-dir", str(root / "repo.git"), "update-server-info"], check=True)
    with https_files(trusted, root) as served:
        yield served


def test_pip_and_git_get_the_value_put_into_their_https_requests(
    reading: RunningServer, session: tuple[str, int, list[str]], tools_site: tuple[int, list[str]]
) -> None:
    sid, own_port, _ = session
    port, seen = tools_site
    point_secret(reading, own_port, port)
    pip = run(
        reading,
        sid,
        "import os, subprocess, sys\n"
        f"url = 'https://me:' + os.environ['API_TOKEN'] + '@{HOST}:{port}/simple/'\n"
        "done = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-cache-dir',"
        " '--index-url', url, 'corraltiny'], capture_output=True, text=True)\n"
        "print(done.returncode, done.stderr[-300:])\n"
        "import corraltiny; print(corraltiny.VALUE)",
    )
    assert pip.strip().endswith("from the index"), pip
    git = run(
        reading,
        sid,
        "import os, subprocess\n"
        "header = 'http.extraHeader=Authorization: Bearer ' + os.environ['API_TOKEN']\n"
        f"done = subprocess.run(['git', '-c', header, 'clone', '-q', 'https://{HOST}:{port}/repo.git',"
        " '/tmp/cloned'], capture_output=True, text=True)\n"
        "print(done.returncode, done.stderr[-300:])\n"
        "print(open('/tmp/cloned/README').read())",
    )
    assert git.strip().endswith("from the repository"), git
    assert seen and all(_carries_value(given) for given in seen)
    assert VALUE not in pip + git


def test_the_value_is_not_in_the_sandboxs_memory_or_files(
    reading: RunningServer, session: tuple[str, int, list[str]]
) -> None:
    """After requests that carried the secret, no process of the sandbox holds the value
    anywhere in its memory, and no file it can write holds it (read from the host, which
    knows what to look for)."""
    sid, port, _ = session
    printed = run(reading, sid, CLIENTS["requests"].format(url=f"https://{HOST}:{port}/"))
    assert printed.strip() == "right value", printed
    box = reading.service.sessions.session(sid).box
    assert box is not None
    scanned = 0
    for pid in box.processes():
        found, size = memory_holds(pid, VALUE.encode())
        assert not found, f"process {pid} of the sandbox holds the value"
        scanned += size
    assert scanned > 10 * 1024 * 1024  # the kernel's memory was read, not skipped
    root = Path(f"/proc/{box.processes()[-1]}/root")  # the sandbox's own view of its files
    found, read = files_holding(root, VALUE.encode())
    assert found == [] and read > 0


def files_holding(root: Path, needle: bytes) -> tuple[list[str], int]:
    """The files under the sandbox's writable places that hold `needle`, and how many files
    were read (from the host, through the sandbox's root)."""
    found, read = [], 0
    for place in ("tmp", "workspace", "home", "opt/corral/env", "dev/shm"):
        for path in (root / place).rglob("*"):
            with contextlib.suppress(OSError):
                if path.is_file() and not path.is_symlink():
                    read += 1
                    if needle in path.read_bytes():
                        found.append(str(path))
    return found, read


def memory_holds(pid: int, needle: bytes) -> tuple[bool, int]:
    """Whether `needle` is in the readable memory of `pid`, and how many bytes were read."""
    read = 0
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if "r" not in perms or end - start > 1 << 30:
                continue
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            read += len(chunk)
            if needle in chunk:
                return True, read
    return False, read


def test_https_requests_are_judged_by_method_and_path(
    reading: RunningServer, session: tuple[str, int, list[str]]
) -> None:
    """A policy that names methods and a path for the origin: the proxy reads the tunnel
    and lets only those requests through (the secret still put into them)."""
    sid, port, seen = session
    before = len(seen)
    rules = {"mode": "allowlist", "allow": [f"GET,HEAD {HOST}:{port}/v1/"]}
    admin(reading, "PUT", f"/v1/admin/sessions/{sid}/network", rules)
    try:
        code = CLIENTS["requests"].replace("requests.get(", "requests.request(METHOD, ")
        code = code.replace("print(r.text)", "print(r.status_code, r.text)")

        def call(method: str, path: str) -> str:
            url = f"https://{HOST}:{port}{path}"
            return run(reading, sid, f"METHOD = {method!r}\n" + code.format(url=url)).strip()

        assert call("GET", "/v1/models") == "200 right value"
        refused = call("POST", "/v1/models")
        assert refused.startswith("403 ") and f"GET,HEAD {HOST}:{port}/v1/" in refused
        assert call("GET", "/admin").startswith("403 ")
        assert call("GET", "/v1/../admin").startswith("403 ")
        assert seen[before:] == [f"Bearer {VALUE}"]  # only the allowed request got there
    finally:
        admin(
            reading,
            "PUT",
            f"/v1/admin/sessions/{sid}/network",
            {"mode": "allowlist", "allow": [HOST]},
        )


def test_rules_alone_make_a_session_read_https(
    reading: RunningServer, session: tuple[str, int, list[str]]
) -> None:
    """A session with method and path rules and no secret trusts corral's CA from its next
    start, and its HTTPS requests are judged."""
    _, port, _ = session
    rules = {"mode": "allowlist", "allow": [f"GET {HOST}:{port}/v1/"]}
    with reading.client() as http:
        assert http.post("/v1/sessions", json={"id": "rules-only"}).status_code == 201
    try:
        admin(reading, "PUT", "/v1/admin/sessions/rules-only/network", rules)
        with reading.client() as http:
            assert http.post("/v1/sessions/rules-only/restart").status_code == 200
        code = (
            "import requests\n"
            f"for method, path in (('GET', '/v1/x'), ('POST', '/v1/x')):\n"
            f"    r = requests.request(method, 'https://{HOST}:{port}' + path, timeout=20)\n"
            "    print(method, r.status_code)"
        )
        assert run(reading, "rules-only", code).split("\n")[:2] == ["GET 200", "POST 403"]
    finally:
        with reading.client() as http:
            http.delete("/v1/sessions/rules-only")


def test_the_ca_key_stays_out_of_the_sandbox(
    reading: RunningServer, session: tuple[str, int, list[str]]
) -> None:
    sid, _, _ = session
    key = (reading.settings.config_dir / "ca" / "corral-ca.key").read_text()
    body = key.split("-----")[2].strip().splitlines()[0]
    printed = run(
        reading,
        sid,
        "import subprocess\n"
        f"out = subprocess.run(['grep', '-rlF', {body!r}, '/opt', '/etc', '/tmp', '/workspace'],"
        " capture_output=True, text=True)\n"
        "print(repr(out.stdout))",
    )
    assert printed.strip() == "''", printed
