"""Browser fetches against real pages: the system Chromium in a sandbox, the browsing policy.

Pages are served on 127.0.0.2 (listed in `browser_allow`); the "private" targets a page must
not reach are servers on 127.0.0.1, which the policy refuses, and each counts every connection
it accepts, so a test can tell that nothing got through rather than only that the page said so.
Each fetch starts a sandbox and a Chromium (2-3 s here): one service and one site serve the
module, and the tests fetch as few pages as they can.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import socketserver
import tempfile
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral.browser.fetch import BROWSER_PREFIX, START_MARGIN_S, find_chromium
from corral.errors import FetchFailed, FetchTimedOut, InvalidInput
from corral.server.operation import wire
from corral.server.schemas import AuditPageModel, PageModel
from corral.service import Service
from tests.conftest import make_settings
from tests.loopback import HOST

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.timeout(60),
    pytest.mark.skipif(find_chromium(None) is None, reason="no Chromium installed on this host"),
]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_CHARS = 5_000
BIG_BYTES = 50 * 1024 * 1024
STALL_TIMEOUT_S = 3.0
SERIAL_HOLD_S = 3.0  # long enough for a second fetch to arrive if the cap let it
BUSY_PAGE = "<title>Busy</title><p>before the loop</p><script>for (;;) {}</script>"
PRIVATE_KINDS = ("script", "img", "iframe", "fetch", "websocket")
PAGE = """<!DOCTYPE html>
<html><head><title>Corral test page</title></head>
<body>
<h1>Visible heading</h1>
<p>The visible paragraph.</p>
<div style="display:none">hidden-by-display-none</div>
<p hidden>hidden-by-attribute</p>
<script>var scriptText = "text-inside-a-script";</script>
<a href="/second">Second page</a>
<a href="https://example.org/elsewhere">Elsewhere</a>
</body></html>
"""


# -- host-side servers ---------------------------------------------------------------------


@dataclass
class Private:
    """Servers on 127.0.0.1 (one port per kind of subresource) that count what reaches them."""

    ports: dict[str, int] = field(default_factory=dict)
    hits: dict[int, int] = field(default_factory=dict)

    def hits_on(self, kind: str) -> int:
        return self.hits.get(self.ports[kind], 0)


@contextlib.contextmanager
def serve_private(kinds: tuple[str, ...]) -> Iterator[Private]:
    private = Private()

    class Counted(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

        def verify_request(self, request: Any, client_address: Any) -> bool:
            port = self.server_address[1]
            private.hits[port] = private.hits.get(port, 0) + 1
            return True

    class Answer(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            with contextlib.suppress(OSError):
                self.rfile.readline()
                self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nprivate")

    servers = [Counted(("127.0.0.1", 0), Answer) for _ in kinds]
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in servers]
    for kind, server, thread in zip(kinds, servers, threads, strict=True):
        private.ports[kind] = int(server.server_address[1])
        thread.start()
    try:
        yield private
    finally:
        for server, thread in zip(servers, threads, strict=True):
            server.shutdown()
            server.server_close()
            thread.join(10)


@dataclass
class Slow:
    """One slow page: how many of its requests were in flight at once, at most.

    Each request is held until a second one is in flight too, or for `hold` seconds.
    """

    hits: int = 0
    in_flight: int = 0
    most: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)


@dataclass
class Site:
    port: int
    private: Private
    slow: dict[str, Slow]
    release: threading.Event  # set at teardown: lets the stalling handlers end

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.port}{path}"


def subresource_page(private: Private) -> str:
    """A page on the allowed host that asks for one private target per kind of subresource."""
    base = {kind: f"127.0.0.1:{port}" for kind, port in private.ports.items()}
    return f"""<!DOCTYPE html>
<html><head><title>Subresources</title>
<script src="http://{base["script"]}/s.js"></script>
<script>
fetch("http://{base["fetch"]}/data").catch(() => {{}});
try {{ new WebSocket("ws://{base["websocket"]}/ws"); }} catch (e) {{}}
</script>
</head><body>
<p>The page itself loaded.</p>
<img src="http://{base["img"]}/i.png">
<iframe src="http://{base["iframe"]}/frame"></iframe>
<img src="/delay">
</body></html>
"""


def big_body() -> Iterator[bytes]:
    """BIG_BYTES of HTML: many paragraphs of words, in 1 MiB chunks."""
    line = b"<p>" + b"lorem ipsum dolor sit amet " * 36 + b"</p>\n"
    chunk = line * (1024 * 1024 // len(line))
    head = b"<!DOCTYPE html><html><head><title>Big page</title></head><body>\n"
    yield head
    sent = len(head)
    while sent + len(chunk) <= BIG_BYTES:
        yield chunk
        sent += len(chunk)
    yield (chunk + line)[: BIG_BYTES - sent]


def make_handler(site: Site, private_page: str) -> type[BaseHTTPRequestHandler]:
    class Pages(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the tests check what happened, not the log."""

        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            routes: dict[str, Callable[[], None]] = {
                "/page": lambda: self.html(PAGE),
                "/second": lambda: self.html("<title>Second</title><p>second page</p>"),
                "/r1": lambda: self.redirect("/r2"),
                "/r2": lambda: self.redirect("/page"),
                "/to-private": lambda: self.redirect(
                    f"http://127.0.0.1:{site.private.ports['redirect']}/"
                ),
                "/subresources": lambda: self.html(private_page),
                "/delay": self.delay,
                "/stall": self.stall,
                "/busy": lambda: self.html(BUSY_PAGE),
                "/big": self.big,
            }
            if parts.path in routes:
                routes[parts.path]()
            elif parts.path.startswith("/slow/"):
                hold_s = float(urllib.parse.parse_qs(parts.query)["hold"][0])
                self.slow(site.slow.setdefault(parts.path, Slow()), hold_s)
            else:
                self.send_error(404)

        def html(self, text: str) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def redirect(self, location: str) -> None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def delay(self) -> None:
            time.sleep(1)  # holds the load event until the script's requests were decided
            self.send_error(404)

        def stall(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"<!DOCTYPE html><html><head><title>Stalling</title></head>")
            self.wfile.write(b"<body><p>the first part arrived</p>\n")
            self.wfile.flush()
            site.release.wait(60)

        def big(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(BIG_BYTES))
            self.end_headers()
            with contextlib.suppress(OSError):
                for chunk in big_body():
                    self.wfile.write(chunk)

        def slow(self, slow: Slow, hold_s: float) -> None:
            with slow.changed:
                slow.hits += 1
                slow.in_flight += 1
                slow.most = max(slow.most, slow.in_flight)
                slow.changed.notify_all()
                slow.changed.wait_for(lambda: slow.in_flight >= 2, timeout=hold_s)
            try:
                self.html("<title>Slow</title><p>slow page</p>")
            finally:
                with slow.changed:
                    slow.in_flight -= 1

    return Pages


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with serve_private(("redirect", *PRIVATE_KINDS)) as private:
        state = Site(0, private, {}, threading.Event())
        httpd = ThreadingHTTPServer((HOST, 0), make_handler(state, subresource_page(private)))
        state.port = int(httpd.server_address[1])
        thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        try:
            yield state
        finally:
            state.release.set()
            httpd.shutdown()
            httpd.server_close()
            thread.join(10)


@contextlib.asynccontextmanager
async def open_service(tmp: Path, **overrides: object) -> AsyncIterator[Service]:
    """A service browsing public addresses plus 127.0.0.2, with `overrides` to its settings."""
    run = Path(tempfile.mkdtemp(prefix="crb", dir="/tmp"))  # short: socket paths
    try:
        settings = make_settings(tmp / "state", run, browser_allow=HOST, **overrides)
        async with Service(settings) as service:
            yield service
    finally:
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="module")
async def browsing(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    """The module's service: public browsing plus 127.0.0.2, text cut at MAX_CHARS."""
    async with open_service(tmp_path_factory.mktemp("browse"), browser_max_chars=MAX_CHARS) as svc:
        yield svc


# -- helpers -------------------------------------------------------------------------------


def _browser_process(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        text = proc.name() + " " + " ".join(proc.cmdline())
        return any(word in text for word in ("chromium", "playwright", "browser_runner"))
    return False


def browser_processes() -> set[int]:
    """Chromium, Playwright and runner processes: ours (descendants) or orphans of anyone's.

    Other test runs may share this machine; their browsers hang under their own processes.
    """
    ours = {p.pid for p in psutil.Process().children(recursive=True) if _browser_process(p)}
    orphans = set()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.ppid() == 1 and _browser_process(proc):
                orphans.add(proc.pid)
    return ours | orphans


def assert_browser_gone(service: Service, before: set[int]) -> None:
    """No browser process, proxy socket, refusal record or work folder outlives a fetch."""
    left = browser_processes() - before
    assert not left, [psutil.Process(pid).cmdline() for pid in left if psutil.pid_exists(pid)]
    proxy = service.egress.proxy.sessions
    assert not [name for name in proxy if name.startswith(BROWSER_PREFIX)], list(proxy)
    assert service.browser.refusals == {}
    egress = service.settings.run_root / "egress"
    assert not egress.exists() or not list(egress.iterdir()), list(egress.iterdir())
    root = service.browser.root
    assert not root.exists() or {p.name for p in root.iterdir()} <= {"env"}, list(root.iterdir())


# -- a page --------------------------------------------------------------------------------


async def test_a_page_gives_title_final_url_visible_text_links_and_a_png(
    browsing: Service, site: Site
) -> None:
    before = browser_processes()
    page = await browsing.browser.fetch(site.url("/page"), screenshot=True)
    assert page.title == "Corral test page"
    assert page.url == site.url("/page")
    assert page.status == 200
    assert page.loaded and not page.truncated
    assert "Visible heading" in page.text and "The visible paragraph." in page.text
    links = {link["href"]: link["text"] for link in page.links}
    assert links == {
        site.url("/second"): "Second page",
        "https://example.org/elsewhere": "Elsewhere",
    }
    assert page.screenshot_png is not None and page.screenshot_png.startswith(PNG_MAGIC)
    assert page.refused == [], page.refused  # Chromium's own services are not the page's
    assert page.notes() == []
    assert_browser_gone(browsing, before)


async def test_only_visible_text_is_returned(browsing: Service, site: Site) -> None:
    page = await browsing.browser.fetch(site.url("/page"))
    for hidden in ("hidden-by-display-none", "hidden-by-attribute", "text-inside-a-script"):
        assert hidden not in page.text
    assert page.screenshot_png is None
    assert wire(PageModel, page)["screenshot_png_base64"] is None


async def test_a_redirect_chain_ends_at_the_final_url(browsing: Service, site: Site) -> None:
    page = await browsing.browser.fetch(site.url("/r1"))
    assert page.requested_url == site.url("/r1")
    assert page.url == site.url("/page")
    assert (page.status, page.title) == (200, "Corral test page")


# -- bad input: refused before anything starts -----------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        pytest.param("file:///etc/passwd", "only http and https URLs .* not file:", id="file"),
        pytest.param("data:text/html,<h1>hi</h1>", "not data:", id="data"),
        pytest.param("chrome://settings", "not chrome:", id="chrome"),
        pytest.param("javascript:alert(1)", "not javascript:", id="javascript"),
        pytest.param("about:blank", "not about:", id="about"),
        pytest.param("ftp://127.0.0.2/file", "not ftp:", id="ftp"),
        pytest.param("view-source:http://127.0.0.2/", "not view-source:", id="view-source"),
        pytest.param("example.org/page", "not a URL without a scheme", id="no-scheme"),
        pytest.param("http:///etc/passwd", "has no host", id="no-host"),
        pytest.param("https://user@/", "has no host", id="only-userinfo"),
        pytest.param("http://exa mple.org/", "spaces or control characters", id="space"),
        pytest.param("http://example.org/\x00", "spaces or control characters", id="nul"),
        pytest.param("http://example.org/a\nb", "spaces or control characters", id="newline"),
        pytest.param("http://example.org/" + "a" * 9000, "too long", id="too-long"),
        pytest.param("", "give a URL", id="empty"),
    ],
)
async def test_a_url_that_is_not_http_is_refused_before_anything_starts(
    browsing: Service, url: str, message: str
) -> None:
    before = browser_processes()
    with pytest.raises(InvalidInput, match=message):
        await browsing.browser.fetch(url)
    assert browser_processes() - before == set()
    assert not browsing.egress.proxy.sessions


async def test_a_page_timeout_that_is_not_positive_is_refused(
    browsing: Service, site: Site
) -> None:
    for timeout_s in (0, -1, math.inf, math.nan):
        with pytest.raises(InvalidInput, match="page timeout must be a positive number"):
            await browsing.browser.fetch(site.url("/page"), timeout_s=timeout_s)


async def test_a_page_timeout_past_the_cap_is_cut_to_the_cap(browsing: Service, site: Site) -> None:
    page = await browsing.browser.fetch(site.url("/page"), timeout_s=1e9)
    assert page.loaded


# -- the browsing policy -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("http://127.0.0.1:8222/", "127.0.0.1:8222"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254:80"),
        ("https://10.0.0.1/", "10.0.0.1:443"),
        ("http://[::1]:8222/", "::1:8222"),
        ("http://2130706433:8222/", "127.0.0.1:8222"),  # Chromium reads it as 127.0.0.1
        ("http://0.0.0.0:8222/", "0.0.0.0:8222"),
    ],
    ids=["servers-own-port", "metadata", "private-https", "ipv6-loopback", "decimal", "zeros"],
)
async def test_a_private_address_is_refused_by_name(
    browsing: Service, url: str, named: str
) -> None:
    before = browser_processes()
    with pytest.raises(FetchFailed) as failure:
        await browsing.browser.fetch(url)
    message = str(failure.value)
    assert f"the browsing policy refused {named}" in message, message
    assert "CORRAL_BROWSER_NET" in message  # says how the operator can change it
    assert_browser_gone(browsing, before)


async def test_a_name_that_resolves_to_loopback_is_refused(browsing: Service, site: Site) -> None:
    port = site.private.ports["redirect"]
    with pytest.raises(FetchFailed, match=f"refused localhost:{port} .*not a public address"):
        await browsing.browser.fetch(f"http://localhost:{port}/")
    assert site.private.hits_on("redirect") == 0


async def test_a_redirect_to_a_private_address_is_refused_and_never_reached(
    browsing: Service, site: Site
) -> None:
    port = site.private.ports["redirect"]
    with pytest.raises(FetchFailed, match=f"refused 127.0.0.1:{port}"):
        await browsing.browser.fetch(site.url("/to-private"))
    assert site.private.hits_on("redirect") == 0


async def test_private_subresources_are_refused_and_the_page_still_loads(
    browsing: Service, site: Site
) -> None:
    page = await browsing.browser.fetch(site.url("/subresources"))
    assert (page.title, page.loaded) == ("Subresources", True)
    assert "The page itself loaded." in page.text
    refused_ports = {entry.split(" ")[0] for entry in page.refused}
    for kind in PRIVATE_KINDS:
        assert f"127.0.0.1:{site.private.ports[kind]}" in refused_ports, (kind, page.refused)
        assert site.private.hits_on(kind) == 0, kind
    assert any(note.startswith("the browsing policy refused: 127.0.0.1:") for note in page.notes())
    denied = {
        entry["target"]
        for entry in wire(AuditPageModel, await browsing.audit.page(kind="network", limit=500))[
            "entries"
        ]
        if entry["action"] == "deny" and entry["session"].startswith(BROWSER_PREFIX)
    }
    assert {f"127.0.0.1:{site.private.ports[kind]}" for kind in PRIVATE_KINDS} <= denied


async def test_browsing_none_refuses_even_an_allowed_host(tmp_path: Path, site: Site) -> None:
    async with open_service(tmp_path, browser_net="none") as closed:
        with pytest.raises(FetchFailed) as failure:
            await closed.browser.fetch(site.url("/page"))
    message = str(failure.value)
    assert f"the browsing policy refused {HOST}:{site.port} (mode none" in message, message


# -- bounds --------------------------------------------------------------------------------


async def test_a_page_that_never_finishes_returns_what_it_showed_in_bounded_time(
    browsing: Service, site: Site
) -> None:
    before = browser_processes()
    started = time.monotonic()
    page = await browsing.browser.fetch(site.url("/stall"), timeout_s=STALL_TIMEOUT_S)
    assert time.monotonic() - started < STALL_TIMEOUT_S + 40
    assert not page.loaded
    assert page.title == "Stalling"
    assert "the first part arrived" in page.text
    assert "the page did not finish loading in time; this is what it showed then" in page.notes()
    assert_browser_gone(browsing, before)


@pytest.mark.timeout(90)  # the test's own bound is the one that matters
async def test_a_page_whose_script_never_yields_is_stopped_at_the_deadline(
    browsing: Service, site: Site
) -> None:
    # The renderer never answers, so the runner cannot collect or close: the host's deadline
    # (the page timeout plus the start margin) kills the sandbox with everything in it.
    before = browser_processes()
    started = time.monotonic()
    deadline_s = STALL_TIMEOUT_S + START_MARGIN_S
    with pytest.raises(
        FetchTimedOut, match=f"did not finish within {deadline_s:g} s and was stopped"
    ):
        await browsing.browser.fetch(site.url("/busy"), timeout_s=STALL_TIMEOUT_S)
    assert time.monotonic() - started < deadline_s + 10
    assert_browser_gone(browsing, before)


@pytest.mark.timeout(90)  # the test's own bound is the one that matters
async def test_a_50_mb_page_is_cut_at_max_chars_in_bounded_time(
    browsing: Service, site: Site
) -> None:
    before = browser_processes()
    started = time.monotonic()
    page = await browsing.browser.fetch(site.url("/big"))
    elapsed = time.monotonic() - started
    assert elapsed < browsing.settings.browser_timeout_s + 30, elapsed
    assert page.title == "Big page"
    assert page.truncated and len(page.text) == MAX_CHARS
    assert page.text_chars > MAX_CHARS
    assert page.text.startswith("lorem ipsum dolor sit amet")
    assert any(note.startswith(f"text cut at {MAX_CHARS:,} characters") for note in page.notes())
    assert_browser_gone(browsing, before)


async def test_one_fetch_at_a_time_when_the_cap_is_one(tmp_path: Path, site: Site) -> None:
    async with open_service(tmp_path, browser_max_concurrent=1) as serial:
        url = site.url(f"/slow/serial?hold={SERIAL_HOLD_S}")
        pages = await asyncio.gather(serial.browser.fetch(url), serial.browser.fetch(url))
    assert [page.title for page in pages] == ["Slow", "Slow"]
    slow = site.slow["/slow/serial"]
    assert (slow.hits, slow.most) == (2, 1)


async def test_two_fetches_overlap_under_the_default_cap(browsing: Service, site: Site) -> None:
    # The control for the test above: the same two fetches do overlap when two are allowed.
    assert browsing.settings.browser_max_concurrent == 2
    url = site.url("/slow/parallel?hold=20")
    pages = await asyncio.gather(browsing.browser.fetch(url), browsing.browser.fetch(url))
    assert [page.title for page in pages] == ["Slow", "Slow"]
    slow = site.slow["/slow/parallel"]
    assert (slow.hits, slow.most) == (2, 2)


def test_the_big_page_is_50_mb() -> None:
    assert sum(len(chunk) for chunk in big_body()) == BIG_BYTES
