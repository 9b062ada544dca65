"""The dashboard in a real Chromium (Playwright), against a real server and real sandboxes.

An operator logs in with the admin token, sees a session an agent made over MCP, watches an
execution's output arrive while the code still runs, answers the agent's network requests
(and the sandbox's next request succeeds or is refused accordingly), edits an allowlist,
reads the audit log and stops a session, whose processes are then gone. The screenshots in
docs/screenshots are taken here, so they show what the code draws.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from corral.browser.fetch import find_chromium
from tests.loopback import HOST, serve
from tests.server.conftest import RunningServer
from tests.server.test_mcp import connect

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.timeout(180),
    pytest.mark.skipif(find_chromium(None) is None, reason="no Chromium installed on this host"),
]

SHOTS = Path(__file__).parents[2] / "docs" / "screenshots"
WAIT_MS = 60_000
FETCH = """
import urllib.error, urllib.request
try:
    with urllib.request.urlopen({url!r}, timeout=20) as reply:
        print(reply.status, reply.read().decode(), end="")
except urllib.error.HTTPError as exc:
    print(exc.code, end="")
"""


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = _launch(playwright)
        yield browser
        browser.close()


def _launch(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(executable_path=find_chromium(None))


@pytest.fixture
def page(chromium: Browser, board: RunningServer) -> Iterator[Page]:
    """A fresh browser context, logged in through the form."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    log_in(page, board)
    yield page
    context.close()


def log_in(page: Page, server: RunningServer) -> None:
    assert server.tokens is not None
    page.goto(f"{server.base_url}/ui/")
    expect(page).to_have_url(f"{server.base_url}/ui/login?next=%2Fui%2F")
    page.get_by_label("Admin token").fill(server.tokens.admin)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Sessions", exact=True)).to_be_visible()


def screenshot(page: Page, name: str) -> None:
    """Kept in docs/screenshots when the tree is writable (a user's copy may not be)."""
    with contextlib.suppress(OSError):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SHOTS / name, full_page=True)


def apart(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run an async client in a thread of its own: Playwright's loop holds this one."""
    failed: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(work())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=main)
    thread.start()
    thread.join(120)
    if failed:
        raise failed[0]


def agent(server: RunningServer, method: str, path: str, body: Any = None) -> Any:
    with server.client() as http:
        answer = http.request(method, path, json=body)
    assert answer.status_code < 300, answer.text
    return answer.json() if answer.content else None


def run(server: RunningServer, session_id: str, code: str) -> dict[str, Any]:
    result: dict[str, Any] = agent(
        server, "POST", f"/v1/sessions/{session_id}/execute", {"code": code}
    )
    return result


@contextlib.contextmanager
def session(server: RunningServer, name: str) -> Iterator[str]:
    agent(server, "POST", "/v1/sessions", {"id": name})
    try:
        yield name
    finally:
        with server.client() as http:
            http.delete(f"/v1/sessions/{name}")


def test_a_session_an_agent_made_over_mcp_is_listed_live(page: Page, board: RunningServer) -> None:
    async def start_over_mcp() -> None:
        async with connect(board) as client:
            started = await client.call_tool("start_python_session", {"session_id": "from-mcp"})
            assert not started.is_error
            ran = await client.call_tool(
                "execute_python_code",
                {"command": "x = [0] * 5_000_000; print('held')", "session_id": "from-mcp"},
            )
            assert not ran.is_error

    apart(start_over_mcp)  # after the page loaded: the list shows it live
    card = page.locator("article.session", has_text="from-mcp")
    expect(card).to_be_visible()
    expect(card.locator("dd").first).to_contain_text("idle")
    expect(card).to_contain_text("MiB of 2.0 GiB")
    expect(card.locator("svg.spark").first).to_be_visible()  # two looks make a chart
    screenshot(page, "sessions.png")
    agent(board, "DELETE", "/v1/sessions/from-mcp")
    expect(card).to_have_count(0)


def test_an_executions_output_appears_while_it_runs(page: Page, board: RunningServer) -> None:
    with session(board, "live-out") as name:
        page.goto(f"{board.base_url}/ui/sessions/{name}")
        code = (
            "import os, time\n"
            "import matplotlib.pyplot as plt\n"
            "print('first line', flush=True)\n"
            "plt.plot([1, 4, 2, 5]); plt.title('a plot'); plt.show()\n"
            "while not os.path.exists('go'):\n"
            "    time.sleep(0.05)\n"
            "print('second line')\n"
        )
        done: list[dict[str, Any]] = []
        worker = threading.Thread(target=lambda: done.append(run(board, name, code)))
        worker.start()
        try:
            card = page.locator("li.execution").last
            expect(card.locator("pre.stdout").first).to_contain_text("first line")
            expect(card.locator("img.result")).to_be_visible()
            expect(card.locator(".status")).to_contain_text("running")  # still waiting
            expect(card.locator(".code")).to_contain_text("plt.title")
        finally:
            with board.client() as http:
                made = http.put(
                    f"/v1/sessions/{name}/files/content", params={"path": "go"}, content=b""
                )
                assert made.status_code == 201, made.text
            worker.join(120)
        assert done and done[0]["status"] == "ok"
        expect(card.locator(".outputs")).to_contain_text("second line")
        expect(card.locator(".status")).to_contain_text("ok")
        screenshot(page, "timeline.png")
        page.reload()  # the page as drawn from scratch: the same execution, once
        expect(page.locator("li.execution")).to_have_count(1)
        expect(page.locator("li.execution img.result")).to_be_visible()


def test_html_output_is_shown_in_a_sandboxed_frame(page: Page, board: RunningServer) -> None:
    with session(board, "html-out") as name:
        code = (
            "from IPython.display import HTML, display\n"
            "display(HTML('<b id=bold>bold</b><script>parent.document.title=\"owned\"</script>'))"
        )
        run(board, name, code)
        page.goto(f"{board.base_url}/ui/sessions/{name}")
        frame = page.locator("iframe.result")
        expect(frame).to_have_attribute("sandbox", "")
        expect(page.frame_locator("iframe.result").locator("#bold")).to_have_text("bold")
        assert page.title() != "owned"


@contextlib.contextmanager
def site() -> Iterator[int]:
    class Hello(__import__("http.server").server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"hello"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    with serve(Hello) as port:
        yield port


def fetch(server: RunningServer, name: str, port: int) -> str:
    result = run(server, name, FETCH.format(url=f"http://{HOST}:{port}/"))
    assert result["status"] == "ok", result
    return str(result["stdout"])


def test_approving_a_request_lets_the_next_request_through(
    page: Page, board: RunningServer
) -> None:
    with session(board, "net-approve") as name, site() as port:
        assert not fetch(board, name, port).startswith("200")
        page.goto(f"{board.base_url}/ui/network")
        target = f"{HOST}:{port}"
        agent(
            board,
            "POST",
            f"/v1/sessions/{name}/network/requests",
            {"hosts": [target], "reason": "to read the test page"},
        )
        request = page.locator("li.request", has_text=name)  # arrives live
        expect(request).to_contain_text("to read the test page")
        expect(request).to_contain_text(target)
        screenshot(page, "network.png")
        request.get_by_role("button", name="Approve").click()
        expect(page.locator("li.request", has_text=name)).to_have_count(0)
        assert fetch(board, name, port) == "200 hello"
        expect(page.locator(f"#p-x{name.encode().hex()}")).to_contain_text(target)
        page.goto(f"{board.base_url}/ui/sessions/{name}")  # decisions beside their code
        items = page.locator("#timeline > li")
        expect(items.filter(has_text=f"refused {target}")).to_have_count(1)
        expect(items.filter(has_text=f"allowed {target}")).to_have_count(1)
        texts = items.all_inner_texts()
        refused = next(i for i, t in enumerate(texts) if f"refused {target}" in t)
        allowed = next(i for i, t in enumerate(texts) if f"allowed {target}" in t)
        assert "urlopen" in texts[refused - 1] and "urlopen" in texts[allowed - 1]


def test_rejecting_a_request_leaves_the_sandbox_refused(page: Page, board: RunningServer) -> None:
    with session(board, "net-reject") as name, site() as port:
        target = f"{HOST}:{port}"
        agent(
            board,
            "POST",
            f"/v1/sessions/{name}/network/requests",
            {"hosts": [target], "reason": "please"},
        )
        page.goto(f"{board.base_url}/ui/network")
        request = page.locator("li.request", has_text=name)
        request.get_by_role("button", name="Reject").click()
        expect(page.locator("li.request", has_text=name)).to_have_count(0)
        assert not fetch(board, name, port).startswith("200")
        with board.client("admin") as admin:
            listed = admin.get("/v1/admin/network/requests").json()["requests"]
        assert [r["status"] for r in listed if r["session"] == name] == ["rejected"]


def test_the_allowlist_is_edited_with_the_apis_validation(page: Page, board: RunningServer) -> None:
    with session(board, "net-edit") as name:
        page.goto(f"{board.base_url}/ui/network")
        block = page.locator("article.netsession", has_text=name)
        block.get_by_role("textbox", name="Allow").fill("pypi.org, *.example.com:443")
        block.get_by_role("button", name="Add").click()
        block = page.locator("article.netsession", has_text=name)
        expect(block.locator("ul.allow")).to_contain_text("*.example.com:443")
        assert policy(board, name)["allow"] == ["pypi.org", "*.example.com:443"]
        block.get_by_role("button", name="Remove pypi.org from").click()
        block = page.locator("article.netsession", has_text=name)
        expect(block.locator("ul.allow")).not_to_contain_text("pypi.org")
        assert policy(board, name)["allow"] == ["*.example.com:443"]
        block.get_by_role("button", name="github").click()
        expect(page.locator("article.netsession", has_text=name)).to_contain_text(
            "*.githubusercontent.com"
        )
        block = page.locator("article.netsession", has_text=name)
        block.get_by_role("textbox", name="Allow").fill("no such host!")
        block.get_by_role("button", name="Add").click()
        expect(page.get_by_role("heading", name="Not done")).to_be_visible()
        assert "no such host!" not in policy(board, name)["allow"]


def policy(server: RunningServer, name: str) -> dict[str, Any]:
    with server.client("admin") as admin:
        answer = admin.get(f"/v1/admin/sessions/{name}/network")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_stopping_a_session_ends_its_processes(page: Page, board: RunningServer) -> None:
    with session(board, "to-stop") as name:
        run(board, name, "print(1)")
        box = board.service.sessions.session(name).box
        assert box is not None
        pids = box.processes()
        assert pids
        page.goto(f"{board.base_url}/ui/sessions/{name}")
        page.get_by_text("Stop…").click()
        page.get_by_role("button", name=f"Stop {name}").click()
        expect(page.locator(".figures .state").first).to_have_text("stopped")
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in pids):
            assert time.monotonic() < deadline, "the session's processes outlived its stop"
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_audit_log_filters_and_links_to_timelines(page: Page, board: RunningServer) -> None:
    with session(board, "audited") as name:
        run(board, name, "print('audited code')")
        page.goto(f"{board.base_url}/ui/audit")
        page.get_by_label("Kind").select_option("execution")
        page.get_by_label("Session").fill(name)
        page.get_by_role("button", name="Show").click()
        rows = page.locator("table.audit tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("audited code")
        rows.first.get_by_role("link", name=name).click()
        expect(page.get_by_role("heading", name=f"Session {name}")).to_be_visible()


def test_a_workspace_file_downloads(page: Page, board: RunningServer) -> None:
    with session(board, "files") as name:
        run(board, name, "open('report.txt', 'w').write('the report')")
        page.goto(f"{board.base_url}/ui/sessions/{name}")
        with page.expect_download() as download:
            page.get_by_role("link", name="report.txt").click()
        saved = download.value.path()
        assert Path(saved).read_text() == "the report"
        assert download.value.suggested_filename == "report.txt"


def test_the_audit_log_pages(page: Page, board: RunningServer) -> None:
    with session(board, "paged") as name:
        run(board, name, "print('one')")
        run(board, name, "print('two')")
        page.goto(f"{board.base_url}/ui/audit?kind=execution&session={name}&limit=1")
        expect(page.locator("table.audit tbody")).to_contain_text("print('two')")
        page.get_by_role("link", name="Older entries").click()
        expect(page.locator("table.audit tbody")).to_contain_text("print('one')")
        expect(page.locator("table.audit tbody tr")).to_have_count(1)


def test_the_keyboard_alone_logs_in_and_moves_around(
    chromium: Browser, board: RunningServer
) -> None:
    assert board.tokens is not None
    context = chromium.new_context()
    page = context.new_page()
    try:
        page.goto(f"{board.base_url}/ui/login")
        page.keyboard.type(board.tokens.admin)  # the token field has the focus
        page.keyboard.press("Enter")
        expect(page.get_by_role("heading", name="Sessions", exact=True)).to_be_visible()
        page.keyboard.press("Tab")
        expect(page.get_by_role("link", name="Skip to the content")).to_be_focused()
        for _ in range(3):  # the skip link, the name, then Sessions and Network
            page.keyboard.press("Tab")
        expect(page.get_by_role("link", name="Network")).to_be_focused()
        page.keyboard.press("Enter")
        expect(page.get_by_role("heading", name="Network", exact=True)).to_be_visible()
    finally:
        context.close()


def test_pages_read_without_javascript(chromium: Browser, board: RunningServer) -> None:
    context = chromium.new_context(java_script_enabled=False)
    page = context.new_page()
    try:
        log_in(page, board)
        for path, heading in (("/ui/network", "Network"), ("/ui/audit", "Audit log")):
            page.goto(f"{board.base_url}{path}")
            expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
    finally:
        context.close()


def test_a_phone_width_page_does_not_scroll_sideways(
    chromium: Browser, board: RunningServer
) -> None:
    context = chromium.new_context(viewport={"width": 390, "height": 800})
    page = context.new_page()
    try:
        log_in(page, board)
        for path in ("/ui/", "/ui/network", "/ui/audit"):
            page.goto(f"{board.base_url}{path}")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, (path, width)
    finally:
        context.close()


def test_the_vendored_files_are_the_pinned_ones() -> None:
    import hashlib

    vendor = Path(__file__).parents[2] / "src" / "corral" / "dashboard" / "static" / "vendor"
    table = (vendor / "LICENSES.md").read_text()
    for file in vendor.glob("*.js"):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        assert f"| {file.name} |" in table and digest in table, file.name
