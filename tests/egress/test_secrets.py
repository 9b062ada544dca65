"""Secrets through a real server and a real sandbox: the sandbox holds a placeholder, the
proxy puts the value into plain-HTTP requests to the secret's hosts only, and the value is
nowhere the sandbox or the logs can show it.

The upstream is a loopback HTTP server on 127.0.0.2 that records what it was sent and
answers "ok" (never echoing a header back, so the value cannot return to the sandbox).
"""

from __future__ import annotations

import contextlib
import http.server
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.loopback import HOST, serve
from tests.server.conftest import RunningServer, corral

pytestmark = pytest.mark.bwrap

VALUE = "sk-test-0123456789abcdef-the-real-value"
SEND = """
import os, urllib.error, urllib.request
token = os.environ.get("API_TOKEN", "")
print("placeholder" if token.startswith("corral-secret-") else "other:" + token[:8])
request = urllib.request.Request({url!r}, headers={{"Authorization": "Bearer " + token}})
try:
    with urllib.request.urlopen(request, timeout=20) as reply:
        print(reply.status, reply.read().decode())
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode())
"""


@contextlib.contextmanager
def recording_site() -> Iterator[tuple[int, list[str]]]:
    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the test reads `seen`."""

    with serve(Recorder) as port:
        yield port, seen


def admin(server: RunningServer, method: str, path: str, body: Any = None) -> httpx.Response:
    with server.client("admin") as http:
        return http.request(method, path, json=body)


def run(server: RunningServer, sid: str, code: str) -> dict[str, Any]:
    with server.client() as http:
        answer = http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-token"
    path.write_text(VALUE + "\n")
    path.chmod(0o600)
    return path


def test_the_value_goes_only_to_the_secrets_host_and_never_inside(
    server: RunningServer, sid: str, secret_file: Path
) -> None:
    with recording_site() as (port, seen), recording_site() as (other_port, other_seen):
        defined = admin(
            server,
            "PUT",
            "/v1/admin/secrets/API_TOKEN",
            {"from_file": str(secret_file), "hosts": [f"{HOST}:{port}"]},
        )
        assert defined.status_code == 200, defined.text
        assert VALUE not in defined.text
        attached = admin(server, "PUT", f"/v1/admin/sessions/{sid}/secrets/API_TOKEN")
        assert attached.status_code == 200 and attached.json()["attached"] is True
        shown = admin(server, "GET", f"/v1/admin/sessions/{sid}/network").json()
        assert shown["secrets"] == [{"name": "API_TOKEN", "hosts": [f"{HOST}:{port}"]}]
        allowed = admin(
            server,
            "POST",
            f"/v1/admin/sessions/{sid}/network/allow",
            {"hosts": [f"{HOST}:{port}", f"{HOST}:{other_port}"]},
        )
        assert allowed.status_code == 200, allowed.text
        with server.client() as http:
            assert http.post(f"/v1/sessions/{sid}/restart").status_code == 200

        right = run(server, sid, SEND.format(url=f"http://{HOST}:{port}/v1/models"))
        assert right["stdout"] == "placeholder\n200 ok\n", right
        assert seen == [f"Bearer {VALUE}"]

        wrong = run(server, sid, SEND.format(url=f"http://{HOST}:{other_port}/steal"))
        assert wrong["stdout"].startswith("placeholder\n403 "), wrong
        assert "API_TOKEN may not be sent" in wrong["stdout"]
        assert other_seen == []

        inside = run(
            server,
            sid,
            "import glob, os\n"
            "paths = glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline')\n"
            f"found = [p for p in paths if {VALUE!r}.encode() in open(p, 'rb').read()]\n"
            f"found += [k for k, v in os.environ.items() if {VALUE!r} in v]\n"
            "print(found)",
        )
        assert inside["stdout"] == "[]\n", inside

        with server.client("admin") as http:
            entries = http.get("/v1/admin/audit", params={"session": sid, "kind": "network"})
        audit = entries.text
        assert VALUE not in audit
        actions = [(e["action"], e["detail"].get("secrets")) for e in entries.json()["entries"]]
        assert ("secret", ["API_TOKEN"]) in actions
        assert ("secret_refused", ["API_TOKEN"]) in actions

        detached = admin(server, "DELETE", f"/v1/admin/sessions/{sid}/secrets/API_TOKEN")
        assert detached.json()["attached"] is False
        after = run(server, sid, SEND.format(url=f"http://{HOST}:{port}/v1/models"))
        assert after["stdout"].startswith("placeholder\n403 "), after  # the next request
        assert "does not hold" in after["stdout"]
        assert len(seen) == 1
        assert admin(server, "DELETE", "/v1/admin/secrets/API_TOKEN").status_code == 204


def test_removing_a_secret_counts_from_the_next_request(
    server: RunningServer, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_SECRET_VALUE", VALUE)
    with recording_site() as (port, seen):
        assert (
            admin(
                server,
                "PUT",
                "/v1/admin/secrets/API_TOKEN",
                {"from_env": "CORRAL_TEST_SECRET_VALUE", "hosts": [f"{HOST}:{port}"]},
            ).status_code
            == 200
        )
        admin(server, "PUT", f"/v1/admin/sessions/{sid}/secrets/API_TOKEN")
        admin(
            server, "POST", f"/v1/admin/sessions/{sid}/network/allow", {"hosts": [f"{HOST}:{port}"]}
        )
        with server.client() as http:
            http.post(f"/v1/sessions/{sid}/restart")
        first = run(server, sid, SEND.format(url=f"http://{HOST}:{port}/"))
        assert first["stdout"] == "placeholder\n200 ok\n", first
        listed = admin(server, "GET", "/v1/admin/secrets").json()["secrets"]
        assert [(s["name"], s["source"], s["sessions"]) for s in listed] == [
            ("API_TOKEN", "env", [sid])
        ]
        assert admin(server, "DELETE", "/v1/admin/secrets/API_TOKEN").status_code == 204
        second = run(server, sid, SEND.format(url=f"http://{HOST}:{port}/"))
        assert second["stdout"].startswith("placeholder\n403 "), second
        assert seen == [f"Bearer {VALUE}"]


@pytest.mark.parametrize(
    ("body", "status", "wanted"),
    [
        ({"hosts": ["api.example.com"]}, 422, "exactly one of"),
        ({"from_env": "A", "from_file": "/x", "hosts": ["api.example.com"]}, 422, "exactly one"),
        ({"from_file": "relative/path", "hosts": ["api.example.com"]}, 422, "match pattern"),
        ({"from_env": "TOKEN", "from_file": None, "hosts": ["a.example"]}, 422, "rather than"),
        ({"from_env": "TOKEN", "hosts": []}, 422, "at least 1"),
        ({"from_env": "TOKEN", "hosts": ["not a host!"]}, 422, "host"),
    ],
)
def test_a_bad_definition_is_refused(
    server: RunningServer, body: dict[str, Any], status: int, wanted: str
) -> None:
    answer = admin(server, "PUT", "/v1/admin/secrets/API_TOKEN", body)
    assert answer.status_code == status, answer.text
    assert wanted in json.dumps(answer.json())


@pytest.mark.parametrize("name", ["PATH", "HTTPS_PROXY", "lower"])
def test_a_name_the_sandbox_needs_is_refused(server: RunningServer, name: str) -> None:
    answer = admin(
        server, "PUT", f"/v1/admin/secrets/{name}", {"from_env": "X", "hosts": ["a.example"]}
    )
    assert answer.status_code == 400, answer.text


def test_the_agent_token_cannot_touch_secrets(server: RunningServer, sid: str) -> None:
    with server.client() as http:
        for method, path in (
            ("GET", "/v1/admin/secrets"),
            ("PUT", "/v1/admin/secrets/API_TOKEN"),
            ("PUT", f"/v1/admin/sessions/{sid}/secrets/API_TOKEN"),
        ):
            answer = http.request(method, path, json={"from_env": "HOME", "hosts": ["a.example"]})
            assert answer.status_code == 403, (method, path, answer.text)


def test_the_command_line_adds_attaches_lists_and_removes(
    server: RunningServer, sid: str, secret_file: Path
) -> None:
    code, text = corral(
        server,
        "secrets",
        "add",
        "CLI_TOKEN",
        "--from-file",
        str(secret_file),
        "--hosts",
        "a.example,*.b.example",
    )
    assert code == 0, text
    assert "secret CLI_TOKEN: from" in text and VALUE not in text
    code, text = corral(server, "secrets", "attach", sid, "CLI_TOKEN")
    assert code == 0 and f"session {sid} holds secret CLI_TOKEN" in text, text
    code, text = corral(server, "net", "show", sid)
    assert code == 0 and "secret CLI_TOKEN for a.example, *.b.example" in text, text
    code, text = corral(server, "secrets", "list")
    assert code == 0 and "CLI_TOKEN" in text and sid in text and VALUE not in text, text
    code, text = corral(server, "secrets", "detach", sid, "CLI_TOKEN")
    assert code == 0 and "no longer holds" in text, text
    code, text = corral(server, "secrets", "remove", "CLI_TOKEN")
    assert code == 0 and "removed" in text, text
    code, text = corral(server, "secrets", "remove", "CLI_TOKEN")
    assert code == 1 and "no secret 'CLI_TOKEN'" in text, text
    code, text = corral(server, "secrets", "add", "X", "--hosts", "a.example")
    assert code == 2 and "exactly one of" in text, text
