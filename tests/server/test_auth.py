"""The guard, over real HTTP: tokens, roles, Host and Origin, fail-closed start."""

from __future__ import annotations

import httpx
import pytest

from corral.config import Settings
from tests.server.conftest import (
    RunningServer,
    variant_server,
)

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_health_is_open(server: RunningServer) -> None:
    with server.client(token=None) as http:
        response = http.get("/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


@pytest.mark.parametrize("path", ["/v1/sessions", "/openapi.json", "/v1/admin/audit"])
def test_missing_token_is_401_with_a_challenge(server: RunningServer, path: str) -> None:
    with server.client(token=None) as http:
        response = http.get(path)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["error"]["code"] == "unauthorized"


def test_wrong_token_is_401(server: RunningServer) -> None:
    with server.client(token="x" * 43) as http:
        assert http.get("/v1/sessions").status_code == 401


def test_non_bearer_scheme_is_401(server: RunningServer) -> None:
    assert server.tokens is not None
    with server.client(
        token=None, headers={"Authorization": f"Basic {server.tokens.agent}"}
    ) as http:
        assert http.get("/v1/sessions").status_code == 401


def test_mcp_needs_a_token(server: RunningServer) -> None:
    with server.client(token=None) as http:
        response = http.post("/mcp", json=INIT, headers=MCP_HEADERS)
    assert response.status_code == 401


@pytest.mark.parametrize("path", ["/v1/admin/audit", "/v1/admin/pool"])
def test_agent_token_cannot_use_admin_routes(server: RunningServer, path: str) -> None:
    with server.client("agent") as http:
        response = http.get(path)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "admin_only"


def test_admin_token_reaches_admin_and_agent_routes(server: RunningServer) -> None:
    with server.client("admin") as http:
        assert http.get("/v1/admin/audit").status_code == 200
        assert http.get("/v1/sessions").status_code == 200


@pytest.mark.parametrize("route", ["/v1/sessions", "/v1/executions", "/openapi.json"])
def test_foreign_host_is_refused_on_every_route(server: RunningServer, route: str) -> None:
    with server.client("agent", headers={"Host": "attacker.example:8222"}) as http:
        response = http.get(route)
    assert response.status_code == 421
    assert "DNS rebinding" in response.json()["error"]["message"]


CODERUNNER_REFUSAL = {"error": "Invalid Host or Origin header"}


@pytest.mark.parametrize(
    "route", ["/health", "/mcp", "/execute", "/v1/sessions/session"], ids=str.strip
)
@pytest.mark.parametrize(
    "headers",
    [{"Host": "evil.example"}, {"Host": "evil.example:8222"}, {"Origin": "http://evil.example"}],
    ids=lambda headers: next(iter(headers)),
)
def test_coderunner_paths_refuse_a_foreign_host_or_origin_as_coderunner_does(
    server: RunningServer, route: str, headers: dict[str, str]
) -> None:
    """coderunner answers 403 with its own body; its test-e2e.sh checks the status."""
    with server.client("agent", headers=headers) as http:
        response = http.post(route, json={"code": "1"}) if route != "/health" else http.get(route)
    assert (response.status_code, response.json()) == (403, CODERUNNER_REFUSAL)


@pytest.mark.parametrize("origin", ["http://attacker.example", "null", "file://"])
def test_foreign_origin_is_refused(server: RunningServer, origin: str) -> None:
    with server.client("agent", headers={"Origin": origin}) as http:
        assert http.get("/v1/sessions").status_code == 403
        assert http.post("/mcp", json=INIT, headers=MCP_HEADERS).status_code == 403


def test_own_origin_is_accepted(server: RunningServer) -> None:
    with server.client("agent", headers={"Origin": server.base_url}) as http:
        assert http.get("/v1/sessions").status_code == 200


def test_localhost_name_is_accepted(server: RunningServer) -> None:
    port = server.settings.port
    with server.client("agent", headers={"Host": f"localhost:{port}"}) as http:
        assert http.get("/v1/sessions").status_code == 200


def test_server_without_usable_tokens_fails_closed(server_settings: Settings) -> None:
    with (
        variant_server(
            server_settings, with_tokens=False, token_problem="the token file is a link"
        ) as running,
        httpx.Client(base_url=running.base_url) as http,
    ):
        assert http.get("/health").status_code == 200
        response = http.get("/v1/sessions", headers={"Authorization": "Bearer " + "a" * 43})
        assert response.status_code == 503
        assert "the token file is a link" in response.json()["error"]["message"]
        assert http.post("/mcp", json=INIT, headers=MCP_HEADERS).status_code == 503


# -- the InstaVM SDK's header, and OAuth discovery (coderunner's clients) -------------------


def test_the_agent_token_is_accepted_in_x_api_key(server: RunningServer) -> None:
    """The InstaVM SDK sends its `api_key` as X-API-Key and cannot send a bearer token."""
    assert server.tokens is not None
    with server.client(token=None, headers={"X-API-Key": server.tokens.agent}) as http:
        assert http.get("/v1/sessions").status_code == 200
        assert http.post("/execute", json={"code": "print(6 * 7)"}).json()["stdout"] == "42\n"
        assert http.get("/v1/admin/audit").status_code == 403  # the agent's role, as a bearer


def test_the_admin_token_in_x_api_key_has_the_admin_role(server: RunningServer) -> None:
    assert server.tokens is not None
    with server.client(token=None, headers={"X-API-Key": server.tokens.admin}) as http:
        assert http.get("/v1/admin/audit").status_code == 200


@pytest.mark.parametrize("key", ["", "x" * 43, "not a token at all"])
def test_a_wrong_x_api_key_is_401_and_names_both_headers(server: RunningServer, key: str) -> None:
    with server.client(token=None, headers={"X-API-Key": key}) as http:
        response = http.get("/v1/sessions")
    assert response.status_code == 401
    assert "X-API-Key" in response.json()["error"]["message"]


def test_a_wrong_bearer_is_not_rescued_by_a_right_x_api_key(server: RunningServer) -> None:
    """One credential per request: a refused bearer token is refused, whatever else is sent."""
    assert server.tokens is not None
    headers = {"X-API-Key": server.tokens.agent}
    with server.client(token="x" * 43, headers=headers) as http:
        assert http.get("/v1/sessions").status_code == 401


@pytest.mark.parametrize(
    "path",
    [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
        "/.well-known/oauth-authorization-server/mcp",
        "/.well-known/openid-configuration",
    ],
)
def test_oauth_discovery_is_404_without_a_token(server: RunningServer, path: str) -> None:
    """No OAuth here: a client that looks for it learns so, instead of starting a flow."""
    with server.client(token=None) as http:
        response = http.get(path)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "no_oauth"
    assert "Authorization: Bearer" in error["message"] and "X-API-Key" in error["message"]


def test_the_openapi_document_names_both_ways_to_send_the_token(server: RunningServer) -> None:
    with server.client() as http:
        spec = http.get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["apiKey"] == {**schemes["apiKey"], "in": "header", "name": "X-API-Key"}
    assert spec["security"] == [{"bearer": []}, {"apiKey": []}]
