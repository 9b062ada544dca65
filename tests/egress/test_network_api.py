"""The network policy through the edges: admin REST routes, agents' requests, MCP and `corral net`.

Runs against the shared real server (tests/egress/conftest.py). Host servers bind 127.0.0.2,
which a sandbox reaches only when its policy lists that exact address.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.loopback import HOST, serve_directory
from tests.server.conftest import RunningServer, corral, free_port

HELLO = "hello from the host\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A static file server on 127.0.0.2 with hello.txt; yields its port."""
    root = tmp_path_factory.mktemp("api-site")
    (root / "hello.txt").write_text(HELLO)
    with serve_directory(root) as port:
        yield port


@pytest.fixture(scope="module")
def quiet(server: RunningServer) -> Iterator[str]:
    """A session for tests that leave its policy alone (mode none), to start one kernel less."""
    name = "net-api-quiet"
    with server.client() as http:
        created = http.post("/v1/sessions", json={"id": name})
        assert created.status_code == 201, created.text
        yield name
        http.delete(f"/v1/sessions/{name}")


# -- helpers -------------------------------------------------------------------------------


def call(
    server: RunningServer, role: str | None, method: str, path: str, body: Any = None
) -> httpx.Response:
    """A request with the agent's or the admin's token (None: no token)."""
    with server.client(role) as http:
        if isinstance(body, bytes):
            return http.request(
                method, path, content=body, headers={"Content-Type": "application/json"}
            )
        return http.request(method, path, json=body)


def admin(server: RunningServer, method: str, path: str, body: Any = None) -> Any:
    response = call(server, "admin", method, path, body)
    assert response.status_code < 300, response.text
    return response.json()


def policy(server: RunningServer, sid: str) -> dict[str, Any]:
    return dict(admin(server, "GET", f"/v1/admin/sessions/{sid}/network"))


def ask(server: RunningServer, sid: str, hosts: list[str], reason: str = "") -> dict[str, Any]:
    """The agent's request for access: 202 and pending."""
    response = call(
        server,
        "agent",
        "POST",
        f"/v1/sessions/{sid}/network/requests",
        {"hosts": hosts, "reason": reason},
    )
    assert response.status_code == 202, response.text
    made = response.json()
    assert made["status"] == "pending" and made["session"] == sid and made["hosts"] == hosts
    return dict(made)


def requests_listed(server: RunningServer, status: str | None = None) -> list[dict[str, Any]]:
    query = f"?status={status}" if status else ""
    return list(admin(server, "GET", f"/v1/admin/network/requests{query}")["requests"])


FETCH = """
import urllib.error, urllib.request
try:
    with urllib.request.urlopen({url!r}, timeout=20) as reply:
        print(reply.status, reply.read().decode(), end="")
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode(), end="")
"""


def fetch_in_sandbox(server: RunningServer, sid: str, port: int) -> tuple[int, str]:
    """(status, body) of urllib (which follows the proxy variables) inside the sandbox."""
    code = FETCH.format(url=f"http://{HOST}:{port}/hello.txt")
    result = call(server, "agent", "POST", f"/v1/sessions/{sid}/execute", {"code": code})
    assert result.status_code == 200, result.text
    body = result.json()
    assert body["status"] == "ok", body
    status, _, text = body["stdout"].partition(" ")
    return int(status), text


def error_message(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


# -- admin routes --------------------------------------------------------------------------


def admin_routes(sid: str) -> list[tuple[str, str, Any]]:
    return [
        ("GET", f"/v1/admin/sessions/{sid}/network", None),
        ("PUT", f"/v1/admin/sessions/{sid}/network", {"mode": "public", "allow": []}),
        ("POST", f"/v1/admin/sessions/{sid}/network/allow", {"hosts": [HOST]}),
        ("POST", f"/v1/admin/sessions/{sid}/network/deny", {"hosts": [HOST]}),
        ("GET", "/v1/admin/network/requests", None),
        ("POST", "/v1/admin/network/requests/1/approve", None),
        ("POST", "/v1/admin/network/requests/1/reject", None),
    ]


def test_admin_network_routes_refuse_the_agent_token(server: RunningServer, quiet: str) -> None:
    for method, path, body in admin_routes(quiet):
        refused = call(server, "agent", method, path, body)
        assert refused.status_code == 403, (method, path, refused.text)
        assert refused.json()["error"]["code"] == "admin_only"
        anonymous = call(server, None, method, path, body)
        assert anonymous.status_code == 401, (method, path, anonymous.text)
    assert policy(server, quiet)["mode"] == "none"  # none of those changed anything


def test_admin_reads_and_changes_a_policy(server: RunningServer, sid: str) -> None:
    shown = policy(server, sid)
    assert (shown["mode"], shown["allow"]) == ("none", [])
    assert set(shown["stats"]) == {"active", "connections", "refused", "bytes_out", "bytes_in"}
    route = f"/v1/admin/sessions/{sid}/network"

    allowed = admin(server, "POST", f"{route}/allow", {"hosts": [HOST]})
    assert (allowed["mode"], allowed["allow"]) == ("allowlist", [HOST])  # none -> allowlist

    replaced = admin(
        server, "PUT", route, {"mode": "allowlist", "allow": ["Example.org", f"{HOST}:8080"]}
    )
    assert (replaced["mode"], replaced["allow"]) == ("allowlist", ["example.org", f"{HOST}:8080"])
    assert replaced["tunnels_closed"] == 0

    added = admin(server, "POST", f"{route}/allow", {"hosts": ["*.example.com"]})
    assert added["allow"] == ["example.org", f"{HOST}:8080", "*.example.com"]
    removed = admin(server, "POST", f"{route}/deny", {"hosts": ["example.org"]})
    assert (removed["mode"], removed["allow"]) == ("allowlist", [f"{HOST}:8080", "*.example.com"])
    assert policy(server, sid)["allow"] == removed["allow"]
    emptied = admin(server, "POST", f"{route}/deny", {"hosts": [f"{HOST}:8080", "*.example.com"]})
    assert (emptied["mode"], emptied["allow"]) == ("allowlist", [])  # still an allowlist

    public = admin(server, "PUT", route, {"mode": "public"})
    assert (public["mode"], public["allow"]) == ("public", [])
    kept_public = admin(server, "POST", f"{route}/allow", {"hosts": [HOST]})
    assert (kept_public["mode"], kept_public["allow"]) == ("public", [HOST])
    none = admin(server, "PUT", route, {"mode": "none"})
    assert (none["mode"], none["allow"]) == ("none", [])

    audit = admin(server, "GET", f"/v1/admin/audit?kind=admin&session={sid}")["entries"]
    assert [entry["action"] for entry in audit] == [
        "set_network",
        "allow_network",
        "set_network",
        "deny_network",
        "deny_network",
        "allow_network",
        "set_network",
        "allow_network",
    ]
    assert audit[0]["actor"] == "admin" and audit[0]["detail"]["mode"] == "none"


@pytest.mark.parametrize(
    ("method", "suffix", "body", "status", "words"),
    [
        ("PUT", "", {"mode": "sideways"}, 422, "mode"),
        ("PUT", "", {"mode": "allowlist", "allow": ["not a host!"]}, 422, "'not a host!'"),
        ("PUT", "", {"mode": "allowlist", "allow": [f"{HOST}:99999"]}, 422, "bad port"),
        ("PUT", "", {"mode": "allowlist", "allow": "example.org"}, 422, "allow"),
        ("PUT", "", {"mode": "none", "surprise": 1}, 422, "surprise"),
        ("PUT", "", b"{not json", 400, "not valid JSON"),
        ("POST", "/allow", {"hosts": ["exa mple.org"]}, 422, "'exa mple.org'"),
        ("POST", "/allow", {"hosts": []}, 422, "hosts"),
        ("POST", "/allow", {}, 422, "hosts"),
        ("POST", "/deny", {"hosts": ["*.*"]}, 422, "'*.*'"),
    ],
)
def test_bad_policy_bodies_are_refused_with_a_message(
    server: RunningServer,
    quiet: str,
    method: str,
    suffix: str,
    body: Any,
    status: int,
    words: str,
) -> None:
    response = call(server, "admin", method, f"/v1/admin/sessions/{quiet}/network{suffix}", body)
    assert response.status_code == status, response.text
    assert words in error_message(response)
    shown = policy(server, quiet)
    assert (shown["mode"], shown["allow"]) == ("none", [])


def test_an_unknown_session_is_a_404(server: RunningServer) -> None:
    for method, path, body in admin_routes("ghost-net")[:4]:
        response = call(server, "admin", method, path, body)
        assert response.status_code == 404, (method, path, response.text)
    asked = call(
        server, "agent", "POST", "/v1/sessions/ghost-net/network/requests", {"hosts": [HOST]}
    )
    assert asked.status_code == 404, asked.text


# -- agents' requests ----------------------------------------------------------------------


def test_a_request_is_pending_and_grants_nothing_until_the_operator_approves(
    server: RunningServer, sid: str, site: int
) -> None:
    target = f"{HOST}:{site}"
    made = ask(server, sid, [target], "fetch the test data")
    assert made["reason"] == "fetch the test data" and made["decided_at"] is None

    status, text = fetch_in_sandbox(server, sid, site)
    assert status == 403 and f"corral refused {target}" in text, text
    assert policy(server, sid)["mode"] == "none"
    assert made in requests_listed(server, "pending")
    assert made in requests_listed(server)
    self_approval = call(
        server, "agent", "POST", f"/v1/admin/network/requests/{made['id']}/approve"
    )
    assert self_approval.status_code == 403

    approved = admin(server, "POST", f"/v1/admin/network/requests/{made['id']}/approve")
    assert approved["status"] == "approved" and approved["decided_at"] is not None
    shown = policy(server, sid)
    assert (shown["mode"], shown["allow"]) == ("allowlist", [target])
    assert fetch_in_sandbox(server, sid, site) == (200, HELLO)

    assert made["id"] not in [r["id"] for r in requests_listed(server, "pending")]
    assert made["id"] in [r["id"] for r in requests_listed(server, "approved")]
    for decision in ("approve", "reject"):
        again = call(server, "admin", "POST", f"/v1/admin/network/requests/{made['id']}/{decision}")
        assert again.status_code == 409, again.text
        assert "already approved" in error_message(again)


def test_a_rejected_request_grants_nothing(server: RunningServer, quiet: str, site: int) -> None:
    made = ask(server, quiet, [f"{HOST}:{site}"], "please")
    rejected = admin(server, "POST", f"/v1/admin/network/requests/{made['id']}/reject")
    assert rejected["status"] == "rejected"
    shown = policy(server, quiet)
    assert (shown["mode"], shown["allow"]) == ("none", [])
    assert fetch_in_sandbox(server, quiet, site)[0] == 403
    assert made["id"] in [r["id"] for r in requests_listed(server, "rejected")]
    for decision in ("reject", "approve"):
        again = call(server, "admin", "POST", f"/v1/admin/network/requests/{made['id']}/{decision}")
        assert again.status_code == 409, again.text
        assert "already rejected" in error_message(again)
    assert policy(server, quiet)["mode"] == "none"


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"hosts": []}, 422, "hosts"),
        ({"hosts": [f"h{i}.example.org" for i in range(21)]}, 422, "hosts"),
        ({"hosts": ["no such host!"]}, 422, "'no such host!'"),
        ({"hosts": ["example.org"], "reason": "x" * 2001}, 422, "reason"),
        ({"hosts": ["example.org"], "grant": True}, 422, "grant"),
    ],
)
def test_bad_requests_by_the_agent_are_refused(
    server: RunningServer, quiet: str, body: dict[str, Any], status: int, words: str
) -> None:
    before = len(requests_listed(server))
    response = call(server, "agent", "POST", f"/v1/sessions/{quiet}/network/requests", body)
    assert response.status_code == status, response.text
    assert words in error_message(response)
    assert len(requests_listed(server)) == before


def test_deciding_an_unknown_or_malformed_request_id(server: RunningServer) -> None:
    missing = call(server, "admin", "POST", "/v1/admin/network/requests/999999/approve")
    assert missing.status_code == 404 and "999999" in error_message(missing)
    malformed = call(server, "admin", "POST", "/v1/admin/network/requests/abc/reject")
    assert malformed.status_code == 400 and "'abc'" in error_message(malformed)
    status = call(server, "admin", "GET", "/v1/admin/network/requests?status=maybe")
    assert status.status_code == 400 and "'maybe'" in error_message(status)


def test_a_new_session_with_a_deleted_ones_name_starts_without_its_policy(
    server: RunningServer,
) -> None:
    name = "net-reused-name"
    with server.client() as http:
        assert http.post("/v1/sessions", json={"id": name}).status_code == 201
        try:
            admin(server, "POST", f"/v1/admin/sessions/{name}/network/allow", {"hosts": [HOST]})
        finally:
            assert http.delete(f"/v1/sessions/{name}").status_code == 204
        assert http.post("/v1/sessions", json={"id": name}).status_code == 201
        try:
            shown = policy(server, name)
        finally:
            http.delete(f"/v1/sessions/{name}")
    assert (shown["mode"], shown["allow"]) == ("none", [])


# -- MCP -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def mcp_client(server: RunningServer) -> AsyncIterator[Client]:
    assert server.tokens is not None
    headers = {"Authorization": f"Bearer {server.tokens.agent}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        Client(streamable_http_client(server.mcp_url, http_client=http)) as client,
    ):
        yield client


async def test_the_mcp_tool_records_a_pending_request(server: RunningServer, quiet: str) -> None:
    async with mcp_client(server) as client:
        result = await client.call_tool(
            "request_network_access",
            {"hosts": ["example.org:443"], "reason": "read the docs", "session_id": quiet},
        )
    assert not result.is_error, result
    made = dict(result.structured_content or {})
    assert (made["status"], made["hosts"]) == ("pending", ["example.org:443"])
    assert f"corral net approve {made['id']}" in made["message"]
    listed = [r for r in requests_listed(server, "pending") if r["id"] == made["id"]]
    assert len(listed) == 1
    assert (listed[0]["session"], listed[0]["reason"]) == (quiet, "read the docs")
    assert policy(server, quiet)["mode"] == "none"


async def test_the_mcp_tool_refuses_a_bad_host(server: RunningServer, quiet: str) -> None:
    before = len(requests_listed(server))
    async with mcp_client(server) as client:
        result = await client.call_tool(
            "request_network_access", {"hosts": ["not a host!"], "reason": "", "session_id": quiet}
        )
    assert result.is_error
    assert len(requests_listed(server)) == before


# -- corral net ----------------------------------------------------------------------------


def test_corral_net_changes_the_policy_of_the_running_server(
    server: RunningServer, sid: str, site: int
) -> None:
    target = f"{HOST}:{site}"
    code, text = corral(server, "net", "show", sid)
    assert code == 0, text
    assert "mode: none" in text and "connections: 0 (0 refused, 0 open)" in text

    code, text = corral(server, "net", "allow", sid, target, "example.org")
    assert code == 0, text
    assert f"mode: allowlist\n  allow {target}\n  allow example.org\n" in text
    assert fetch_in_sandbox(server, sid, site) == (200, HELLO)

    code, text = corral(server, "net", "deny", sid, target)
    assert code == 0, text
    assert "mode: allowlist\n  allow example.org\n" in text and target not in text
    assert fetch_in_sandbox(server, sid, site)[0] == 403

    code, text = corral(server, "net", "set", sid, "allowlist", target)
    assert code == 0, text
    assert policy(server, sid)["allow"] == [target]
    code, text = corral(server, "net", "show", sid)
    assert code == 0, text
    assert f"  allow {target}" in text and "connections: 2 (1 refused," in text

    code, text = corral(server, "net", "set", sid, "none")
    assert code == 0, text
    assert text.startswith("mode: none\n") and "allow" not in text
    assert policy(server, sid)["mode"] == "none"


def test_corral_net_refuses_bad_input_with_a_message(server: RunningServer, quiet: str) -> None:
    code, text = corral(server, "net", "set", quiet, "sideways")
    assert code != 0 and "sideways" in text, text
    code, text = corral(server, "net", "allow", quiet, "not a host!")
    assert code != 0 and "'not a host!'" in text, text
    code, text = corral(server, "net", "show", "ghost-net")
    assert code != 0 and "ghost-net" in text, text
    assert policy(server, quiet)["mode"] == "none"


def test_corral_net_requests_and_approve(server: RunningServer, sid: str, site: int) -> None:
    target = f"{HOST}:{site}"
    made = ask(server, sid, [target], "for the cli")
    other = ask(server, sid, ["example.org"], "to reject")

    code, text = corral(server, "net", "requests")
    assert code == 0, text
    rows = [line for line in text.splitlines() if sid in line]
    assert any(str(made["id"]) in row and target in row and "for the cli" in row for row in rows)

    code, text = corral(server, "net", "approve", str(made["id"]))
    assert code == 0, text
    assert f"request {made['id']}: approved ({target})" in text
    assert policy(server, sid)["allow"] == [target]
    assert fetch_in_sandbox(server, sid, site) == (200, HELLO)

    code, text = corral(server, "net", "reject", str(other["id"]))
    assert code == 0 and f"request {other['id']}: rejected" in text, text
    assert policy(server, sid)["allow"] == [target]

    code, text = corral(server, "net", "approve", str(made["id"]))
    assert code != 0 and "already approved" in text, text
    code, text = corral(server, "net", "requests")
    assert code == 0, text
    assert not any(sid in line for line in text.splitlines()), text
    code, text = corral(server, "net", "requests", "--all")
    assert code == 0, text
    assert sum(sid in line for line in text.splitlines()) == 2, text


def test_corral_net_without_a_server_says_it_is_not_reachable(server: RunningServer) -> None:
    code, text = corral(server, "net", "show", "default", port=free_port())
    assert code != 0
    assert "not reachable" in text and "corral serve" in text, text
