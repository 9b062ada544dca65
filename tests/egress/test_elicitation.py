"""Opt-in: a human approves an access request in the MCP client (elicitation)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitResult

from corral.config import Settings
from tests.server.conftest import (
    RunningServer,
    variant_server,
)


@pytest.fixture
def eliciting(server_settings: Settings) -> Iterator[RunningServer]:
    with variant_server(server_settings, net_elicitation=True) as running:
        yield running


async def _ask(server: RunningServer, allow: bool, seen: list[str]) -> dict[str, Any]:
    async def answer(context: Any, params: Any) -> ElicitResult:
        seen.append(params.message)
        return ElicitResult(action="accept", content={"allow": allow})

    assert server.tokens is not None
    headers = {"Authorization": f"Bearer {server.tokens.agent}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        Client(
            streamable_http_client(server.mcp_url, http_client=http),
            mode="legacy",
            elicitation_callback=answer,
        ) as client,
    ):
        result = await client.call_tool(
            "request_network_access", {"hosts": ["example.org"], "reason": "docs"}
        )
    assert result.structured_content is not None
    return dict(result.structured_content)


async def test_user_approval_in_the_client_allows_the_hosts(eliciting: RunningServer) -> None:
    seen: list[str] = []
    made = await _ask(eliciting, True, seen)
    assert made["status"] == "approved"
    assert "example.org" in seen[0] and "docs" in seen[0]
    policy = eliciting.service.egress.policy("default")
    assert [entry.text for entry in policy.entries] == ["example.org"]


async def test_user_refusal_in_the_client_rejects(eliciting: RunningServer) -> None:
    made = await _ask(eliciting, False, [])
    assert made["status"] == "rejected"
    assert eliciting.service.egress.policy("default").mode == "none"


async def test_without_opt_in_the_client_is_never_asked(server: RunningServer) -> None:
    seen: list[str] = []
    made = await _ask(server, True, seen)
    assert made["status"] == "pending" and seen == []
