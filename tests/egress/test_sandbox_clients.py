"""Every common client through the proxy, as a sandboxed program uses it, and each request on
a kept-alive connection judged for its own host.

Host-side servers bind 127.0.0.2 (see tests/loopback.py). The module has a service and a
session of its own (test_sandbox_network's `net` fixture); each test sets its policy first.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from corral.kernels.results import ExecutionResult
from corral.service import Service
from tests.egress.test_sandbox_network import allow_only, net, py, sh
from tests.loopback import HOST, serve, serve_directory

__all__ = ["net"]  # the fixture this module borrows

HELLO = "hello from the host\n"
REFUSED = "corral refused"


@dataclass
class Origin:
    """An HTTP/1.1 origin that keeps every connection open whatever the client asks, and
    records each request's path and Authorization header."""

    name: str
    port: int = 0
    seen: list[tuple[str, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextlib.contextmanager
def keep_alive_origin(name: str, redirect_to: str = "") -> Iterator[Origin]:
    origin = Origin(name)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30

        def handle(self) -> None:  # ignores Connection: close, as some origins do
            while True:
                self.handle_one_request()
                if not self.raw_requestline:
                    return

        def do_GET(self) -> None:
            with origin.lock:
                origin.seen.append((self.path, self.headers.get("Authorization")))
            if self.path == "/redirect" and redirect_to:
                self.send_response(302)
                self.send_header("Location", redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = f"{origin.name} {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "keep-alive")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the tests read `seen`."""

    with serve(Handler) as port:
        origin.port = port
        yield origin


@dataclass(frozen=True)
class Site:
    port: int  # hello.txt and an npm packument for corraltiny
    other: int  # the same files, never listed


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("clients-site")
    (root / "hello.txt").write_text(HELLO)
    packument = {
        "name": "corraltiny",
        "dist-tags": {"latest": "1.2.3"},
        "versions": {"1.2.3": {"name": "corraltiny", "version": "1.2.3"}},
    }
    (root / "corraltiny").write_text(json.dumps(packument))
    with serve_directory(root) as port, serve_directory(root) as other:
        yield Site(port, other)


def value(result: ExecutionResult) -> str:
    assert result.status == "ok", result.text()
    return str(result.results[-1]["text/plain"])


# -- each request on a kept-alive connection is judged for its own host ----------------------


async def test_a_requests_session_cannot_carry_a_request_to_a_forbidden_host(
    net: Service,
) -> None:
    with keep_alive_origin("allowed") as allowed, keep_alive_origin("forbidden") as forbidden:
        await allow_only(net, allowed.port)
        code = (
            "import requests\n"
            "s = requests.Session()\n"
            f"a = s.get('http://{HOST}:{allowed.port}/one', timeout=20)\n"
            f"b = s.get('http://{HOST}:{forbidden.port}/two', timeout=20,\n"
            "           headers={'Authorization': 'Bearer meant-for-the-other'})\n"
            f"c = s.get('http://{HOST}:{allowed.port}/three', timeout=20)\n"
            f"(a.status_code, a.text, b.status_code, {REFUSED!r} in b.text, c.text)"
        )
        assert value(await py(net, code)) == str((200, "allowed /one", 403, True, "allowed /three"))
        assert allowed.seen == [("/one", None), ("/three", None)]
        assert forbidden.seen == []


async def test_http_client_on_one_connection_gets_the_refusal_for_its_second_host(
    net: Service,
) -> None:
    with keep_alive_origin("allowed") as allowed, keep_alive_origin("forbidden") as forbidden:
        await allow_only(net, allowed.port)
        code = (
            "import http.client\n"
            "c = http.client.HTTPConnection('127.0.0.1', 3128, timeout=20)\n"
            f"c.request('GET', 'http://{HOST}:{allowed.port}/one')\n"
            "r = c.getresponse(); first = (r.status, r.read().decode())\n"
            f"c.request('GET', 'http://{HOST}:{forbidden.port}/two',\n"
            "          headers={'Authorization': 'Bearer x'})\n"
            f"r = c.getresponse(); second = (r.status, {REFUSED!r} in r.read().decode())\n"
            "(first, second)"
        )
        assert value(await py(net, code)) == str(((200, "allowed /one"), (403, True)))
        assert allowed.seen == [("/one", None)] and forbidden.seen == []


async def test_a_redirect_to_a_forbidden_host_is_refused_not_served_by_the_first(
    net: Service,
) -> None:
    with keep_alive_origin("forbidden") as forbidden:
        target = f"http://{HOST}:{forbidden.port}/secret"
        with keep_alive_origin("allowed", redirect_to=target) as allowed:
            await allow_only(net, allowed.port)
            code = (
                "import requests\n"
                f"r = requests.Session().get('http://{HOST}:{allowed.port}/redirect', timeout=20)\n"
                f"(r.status_code, r.url, {REFUSED!r} in r.text)"
            )
            assert value(await py(net, code)) == str((403, target, True))
            assert allowed.seen == [("/redirect", None)] and forbidden.seen == []


# -- every common client: allowed where the policy allows, the refusal where it does not -----

PYTHON_CLIENTS = {
    "urllib": (
        "import urllib.request, urllib.error\n"
        "def get(url):\n"
        "    try:\n"
        "        with urllib.request.urlopen(url, timeout=20) as r:\n"
        "            return r.status, r.read().decode()\n"
        "    except urllib.error.HTTPError as e:\n"
        "        return e.code, e.read().decode()\n"
    ),
    "requests": (
        "import requests\n"
        "def get(url):\n"
        "    r = requests.get(url, timeout=20)\n"
        "    return r.status_code, r.text\n"
    ),
    "httpx": (
        "import httpx\n"
        "def get(url):\n"
        "    r = httpx.get(url, timeout=20)\n"
        "    return r.status_code, r.text\n"
    ),
    "httpx-async": (
        "import httpx\n"
        "async def get(url):\n"
        "    async with httpx.AsyncClient(timeout=20) as client:\n"
        "        r = await client.get(url)\n"
        "        return r.status_code, r.text\n"
    ),
    "aiohttp": (
        "import aiohttp\n"
        "async def get(url):\n"
        "    async with aiohttp.ClientSession(trust_env=True) as session:\n"
        "        async with session.get(url) as r:\n"
        "            return r.status, await r.text()\n"
    ),
}


@pytest.mark.parametrize("client", sorted(PYTHON_CLIENTS))
async def test_a_python_client_is_let_through_or_refused_by_the_policy(
    net: Service, site: Site, client: str
) -> None:
    await allow_only(net, site.port)
    wait = "await " if "async def get" in PYTHON_CLIENTS[client] else ""  # IPython's own loop
    code = PYTHON_CLIENTS[client] + (
        f"ok = {wait}get('http://{HOST}:{site.port}/hello.txt')\n"
        f"no = {wait}get('http://{HOST}:{site.other}/hello.txt')\n"
        f"(ok, no[0], {REFUSED!r} in no[1])"
    )
    result = await py(net, code)
    assert value(result) == str(((200, HELLO), 403, True)), result.text()


async def test_wget_is_let_through_or_refused_by_the_policy(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    wget = "wget -q --tries=1 --timeout=20 --content-on-error -O -"
    result = await sh(
        net,
        f'{wget} http://{HOST}:{site.port}/hello.txt; echo "rc=$?"\n'
        f'{wget} http://{HOST}:{site.other}/hello.txt; echo "rc=$?"',
    )
    text = result.text()
    assert f"{HELLO}rc=0" in text, text
    assert f"{REFUSED} {HOST}:{site.other}" in text and "rc=8" in text, text


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed on this host")
async def test_npm_is_let_through_or_refused_by_the_policy(net: Service, site: Site) -> None:
    await allow_only(net, site.port)
    npm = "npm view corraltiny version --fetch-retries=0 --cache /tmp/npm-cache --registry"
    result = await sh(
        net,
        f'{npm} http://{HOST}:{site.port}/ 2>&1; echo "rc=$?"\n'
        f'{npm} http://{HOST}:{site.other}/ 2>&1; echo "rc=$?"',
    )
    text = result.text()
    allowed, _, refused = text.partition("rc=0")
    assert allowed.strip().endswith("1.2.3"), text
    assert "403" in refused and "rc=0" not in refused, text
