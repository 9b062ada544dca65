"""Who may open the dashboard: the admin token at the login form, then only its cookie.

Against a real server: the agent token, a bearer token without a cookie, a missing or
forged CSRF token, a missing or foreign Origin, an expired or logged-out cookie are each
refused, and a refused change changes nothing.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.responses import Response

from corral.dashboard.gate import Gate
from corral.dashboard.logins import COOKIE, Logins
from tests.dashboard.conftest import logged_in
from tests.server.conftest import RunningServer, variant_server

pytestmark = pytest.mark.bwrap


@pytest.fixture
def session(board: RunningServer) -> Iterator[str]:
    with board.client() as agent:
        assert agent.post("/v1/sessions", json={"id": "gate"}).status_code == 201
    yield "gate"
    with board.client() as agent:
        agent.delete("/v1/sessions/gate")


def state_of(server: RunningServer, session_id: str) -> bool:
    with server.client("admin") as admin:
        return bool(admin.get(f"/v1/sessions/{session_id}").json()["open"])


def test_login_page_is_open_and_says_where_the_admin_token_is(board: RunningServer) -> None:
    page = httpx.get(f"{board.base_url}/ui/login")
    assert page.status_code == 200
    assert 'name="token"' in page.text
    assert str(board.settings.config_dir / "admin.token") in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]


def test_pages_without_a_login_go_to_the_login_form(board: RunningServer) -> None:
    for path in ("/ui/", "/ui/network", "/ui/audit", "/ui/sessions/x"):
        answer = httpx.get(f"{board.base_url}{path}")
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/ui/login?next=")
    live = httpx.get(f"{board.base_url}/ui/live/sessions")
    assert live.status_code == 401


def test_bearer_tokens_do_not_open_the_dashboard(board: RunningServer) -> None:
    for role in ("agent", "admin"):
        with board.client(role) as http:
            answer = http.get("/ui/", follow_redirects=False)
        assert answer.status_code == 303, role


def test_the_agent_token_does_not_log_in(board: RunningServer) -> None:
    assert board.tokens is not None
    answer = httpx.post(
        f"{board.base_url}/ui/login",
        data={"token": board.tokens.agent},
        headers={"Origin": board.base_url},
    )
    assert answer.status_code == 401
    assert "not this server's admin token" in html.unescape(answer.text)
    assert COOKIE not in answer.headers.get("set-cookie", "")


def test_login_needs_this_servers_origin(board: RunningServer) -> None:
    assert board.tokens is not None
    url = f"{board.base_url}/ui/login"
    missing = httpx.post(url, data={"token": board.tokens.admin})
    assert missing.status_code == 403 and "set-cookie" not in missing.headers
    foreign = httpx.post(
        url, data={"token": board.tokens.admin}, headers={"Origin": "http://evil.example"}
    )
    assert foreign.status_code == 403 and "set-cookie" not in foreign.headers


def test_the_cookie_is_httponly_strict_scoped_and_bounded(board: RunningServer) -> None:
    assert board.tokens is not None
    answer = httpx.post(
        f"{board.base_url}/ui/login",
        data={"token": board.tokens.admin, "next": "/ui/audit"},
        headers={"Origin": board.base_url},
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/audit"
    cookie = answer.headers["set-cookie"].lower()
    for part in ("httponly", "samesite=strict", "path=/ui", "max-age=28800"):
        assert part in cookie, part
    assert "secure" not in cookie  # loopback: plain HTTP


def test_the_cookie_is_secure_off_loopback() -> None:
    response = Response()
    gate = Gate(None, Logins(60), secure=True)
    gate.set_cookie(response, gate.logins.begin())
    assert "secure" in response.headers["set-cookie"].lower()


def test_a_login_redirect_stays_on_the_dashboard(board: RunningServer) -> None:
    assert board.tokens is not None
    for target in ("https://evil.example/", "//evil.example/ui/", "/v1/sessions"):
        answer = httpx.post(
            f"{board.base_url}/ui/login",
            data={"token": board.tokens.admin, "next": target},
            headers={"Origin": board.base_url},
        )
        assert answer.headers["location"] == "/ui/", target


def test_a_change_without_or_with_a_forged_csrf_token_is_refused(
    board: RunningServer, session: str
) -> None:
    origin = {"Origin": board.base_url}
    with logged_in(board) as (client, csrf):
        missing = client.post(f"/ui/sessions/{session}/stop", headers=origin)
        forged = client.post(
            f"/ui/sessions/{session}/stop", data={"csrf": csrf[:-2] + "xy"}, headers=origin
        )
        no_origin = client.post(f"/ui/sessions/{session}/stop", data={"csrf": csrf})
        foreign = client.post(
            f"/ui/sessions/{session}/stop",
            data={"csrf": csrf},
            headers={"Origin": "http://evil.example"},
        )
    assert missing.status_code == forged.status_code == no_origin.status_code == 403
    assert "CSRF" in missing.text and "CSRF" in forged.text
    assert foreign.status_code == 403
    assert state_of(board, session)  # still running: nothing changed


def test_another_logins_csrf_token_is_refused(board: RunningServer, session: str) -> None:
    with logged_in(board) as (first, _), logged_in(board) as (_second, theirs):
        answer = first.post(
            f"/ui/sessions/{session}/stop",
            data={"csrf": theirs},
            headers={"Origin": board.base_url},
        )
    assert answer.status_code == 403
    assert state_of(board, session)


def test_a_change_with_the_csrf_token_is_done(board: RunningServer, session: str) -> None:
    with logged_in(board) as (client, csrf):
        answer = client.post(
            f"/ui/sessions/{session}/stop",
            data={"csrf": csrf, "next": "/ui/"},
            headers={"Origin": board.base_url},
        )
    assert answer.status_code == 303
    assert not state_of(board, session)
    with board.client("admin") as admin:
        entries = admin.get("/v1/admin/audit", params={"session": session}).json()["entries"]
    done = [(e["kind"], e["action"], e["actor"]) for e in entries[:2]]
    assert done == [("admin", "stop_session", "admin"), ("session", "stopped", "admin")]


def test_logging_out_ends_the_login_on_the_server(board: RunningServer) -> None:
    with logged_in(board) as (client, csrf):
        kept = client.cookies.get(COOKIE)
        out = client.post("/ui/logout", data={"csrf": csrf}, headers={"Origin": board.base_url})
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    replayed = httpx.get(f"{board.base_url}/ui/", cookies={COOKIE: kept or ""})
    assert replayed.status_code == 303


def test_logging_out_ends_the_live_streams(board: RunningServer) -> None:
    with logged_in(board) as (client, csrf), client.stream("GET", "/ui/live/sessions") as live:
        assert live.status_code == 200
        lines = live.iter_lines()
        assert next(lines) == "event: update"  # the page's state, sent at once
        out = client.post("/ui/logout", data={"csrf": csrf}, headers={"Origin": board.base_url})
        assert out.status_code == 303
        deadline = time.monotonic() + 30
        for _ in lines:  # the stream ends within a tick of the logout
            assert time.monotonic() < deadline, "the stream outlived its login"


def test_a_forged_cookie_opens_nothing(board: RunningServer) -> None:
    answer = httpx.get(f"{board.base_url}/ui/", cookies={COOKIE: "x" * 43})
    assert answer.status_code == 303


def test_an_expired_login_opens_nothing(board: RunningServer) -> None:
    with variant_server(board.settings, ui_login_ttl_s=1.0) as short:
        deadline = time.monotonic() + 20
        with logged_in(short) as (client, _):
            while client.get("/ui/").status_code == 200:
                assert time.monotonic() < deadline, "the login never expired"
                time.sleep(0.2)
            assert client.get("/ui/").headers["location"].startswith("/ui/login")


def test_logins_are_bounded_and_expire() -> None:
    now = [1000.0]
    logins = Logins(ttl_s=10, max_count=3, clock=lambda: now[0])
    made = [logins.begin() for _ in range(5)]
    assert [logins.find(m.id) is not None for m in made] == [False, False, True, True, True]
    now[0] += 10
    assert logins.find(made[-1].id) is None
    assert logins.find("") is None and logins.find(None) is None
