"""Secrets in HTTPS requests: the proxy reads tunnels to a secret's hosts with corral's CA,
which the sandbox trusts, and verifies the origin itself.

The origins are HTTPS servers on 127.0.0.2 with certificates from a throw-away CA
(trustme), which the server trusts through `egress_upstream_ca` as it would a company CA;
a second origin's certificate comes from a CA nobody trusts. Clients in a real sandbox:
curl, requests, httpx and urllib.
"""

from __future__ import annotations

import contextlib
import http.server
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trustme

from tests.loopback import HOST
from tests.server.conftest import RunningServer, variant_server

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

    httpd = http.server.ThreadingHTTPServer((HOST, 0), Origin)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(HOST).configure_cert(context)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield int(httpd.server_address[1]), seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


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
def value_in_the_servers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_HTTPS_VALUE", VALUE)


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
    sid, _, _ = session
    with https_site(trustme.CA()) as (port, seen):
        admin(
            reading,
            "PUT",
            "/v1/admin/secrets/API_TOKEN",
            {"from_env": "CORRAL_TEST_HTTPS_VALUE", "hosts": [f"{HOST}:{port}"]},
        )
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
