"""Schema-based fuzzing of the REST API from its own OpenAPI document, against a real server.

schemathesis turns every documented operation into a strategy of requests, schema-valid and
schema-violating (its positive and negative modes); hypothesis draws a bounded, seeded number
of them per operation, sent with the agent token (the admin token on `/v1/admin/` routes).
Every response must not be a 5xx and must conform to the document: a documented status code,
its content type, its headers and its body schema. The document must also say what the server
accepts: a schema-valid request is not refused as malformed (positive data acceptance) and a
schema-violating one is (negative data rejection), except where an operation's description
states what a schema cannot (`AS_DESCRIBED` below).

The document is `corral.server.openapi.document()`, checked to be exactly what the live server
serves at `/openapi.json`. schemathesis' own pytest loaders are not used: under pytest 9.2,
`schemathesis.pytest.from_fixture` fails on the removed `Node._nodeid`, and
`schema.parametrize()` gives every operation the same node id.

The server is this module's own, not the shared `server` fixture: the fuzzer creates, stops,
restarts and deletes sessions up to the session cap and runs generated code, which would
disturb tests sharing a server. Its execution timeout is short, so no generated code holds a
case for long.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES

from corral.server.openapi import document
from tests.server.conftest import RunningServer, generated_requests_server

SEED = 20_261_129
MAX_EXAMPLES = 25  # per operation
REQUEST_TIMEOUT_S = 30.0  # per request; the server caps an execution far lower (5 s)
# A session that exists, so that requests reach real sessions as well as unknown ids.
KNOWN_SESSION = "fuzz-known"
# Refusals a JSON schema cannot state, each named in its operation's description: a value
# that is well formed but refused for its meaning (a size under the minimum, a body that is
# not a zip of one skill, a path that leaves the workspace). Only these may meet valid data.
FILES = {(400, "path_refused")}
AS_DESCRIBED: dict[str, set[tuple[int, str]]] = {
    "PATCH /v1/admin/sessions/{id}/limits": {(400, "invalid_input")},
    "POST /v1/admin/skills": {(400, "invalid_input")},
    "GET /v1/sessions/{id}/files": FILES,
    "DELETE /v1/sessions/{id}/files": FILES,
    "GET /v1/sessions/{id}/files/content": FILES,
    "PUT /v1/sessions/{id}/files/content": FILES,
}
# coderunner's browser routes answer everything with 200, a bad request with status "error".
IN_BAND_ERRORS = {"POST /v1/browser/interactions/navigate", "POST /v1/browser/interactions/content"}


def _error_code(response: Any) -> str | None:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


# A server error the document names: this server has no browser (see fuzz_server).
SERVER_ERRORS = {"POST /v1/browser/fetch": {(503, "sandbox_unavailable")}}


def no_undocumented_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' not_a_server_error, but for a server error the document names."""
    documented = SERVER_ERRORS.get(case.operation.label, set())
    if (response.status_code, _error_code(response)) in documented:
        return None
    return not_a_server_error(ctx, response, case)


def valid_data_is_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' positive data acceptance, but for the refusals a description names."""
    described = AS_DESCRIBED.get(case.operation.label, set())
    if (response.status_code, _error_code(response)) in described:
        return None
    return positive_data_acceptance(ctx, response, case)


def invalid_data_is_refused(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' negative data rejection; coderunner's browser routes refuse in-band."""
    if case.operation.label in IN_BAND_ERRORS and response.status_code == 200:
        negative = case.meta is not None and case.meta.generation.mode.is_negative
        if negative and response.json().get("status") != "error":
            raise AssertionError(f"invalid data was not refused: {response.text[:500]}")
        return None
    return negative_data_rejection(ctx, response, case)


CHECKS = [
    no_undocumented_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    valid_data_is_accepted,
    invalid_data_is_refused,
]

CONFIG = SchemathesisConfig.from_dict(
    {
        # Generated Authorization headers would only meet 401: every request has a real token.
        "generation": {"with-security-parameters": False},
        # A body past the server's size limit is refused with 413 before it is parsed.
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]
            }
        },
        # Failure reports hide the token but keep session ids, so that they can be replayed.
        "output": {
            "sanitization": {
                "keys-to-sanitize": ["authorization"],
                "sensitive-markers": ["token", "secret", "password"],
            }
        },
    }
)
SCHEMA = schemathesis.openapi.from_dict(document(), config=CONFIG)
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with generated_requests_server(tmp_path_factory.mktemp("fuzz")) as running:
        yield running


def test_fuzzed_document_is_the_one_the_server_serves(fuzz_server: RunningServer) -> None:
    with fuzz_server.client() as client:
        response = client.get("/openapi.json")
    assert response.status_code == 200
    assert response.json() == document()


def test_no_documented_schema_is_a_reference_to_itself() -> None:
    """A schema that is only a $ref to itself accepts anything: no body would be checked."""
    schemas = document()["components"]["schemas"]
    for name, schema in schemas.items():
        assert schema.get("$ref") != f"#/components/schemas/{name}", name


def _keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key
            yield from _keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from _keys(item)


def test_the_document_holds_no_pydantic_only_keyword() -> None:
    """A bound pydantic cannot express in JSON Schema shows as `ge` and binds no client."""
    leaked = {"ge", "gt", "le", "lt", "strict", "allow_inf_nan"} & set(_keys(document()))
    assert leaked == set()


def _strategy(label: str) -> Any:
    """Valid and invalid requests for one operation, some of them on a session that exists."""
    operation = OPERATIONS[label]
    strategies = [
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    ]
    # A known session's event stream never ends by itself (test_session_events.py reads it).
    if "{id}" in operation.path and not operation.path.endswith("/events"):
        strategies += [
            operation.as_strategy(mode, path_parameters={"id": KNOWN_SESSION})
            for mode in GenerationMode
        ]
    return st.one_of(strategies)


def _ensure_known_session(client: httpx.Client) -> None:
    """Create KNOWN_SESSION again if an earlier case deleted it (409: it is still there)."""
    response = client.post("/v1/sessions", json={"id": KNOWN_SESSION})
    assert response.status_code in (201, 409, 429), response.text


@pytest.fixture
def only_known_session(fuzz_server: RunningServer) -> None:
    """Each operation starts with KNOWN_SESSION alone, so that the session cap is not spent."""
    with fuzz_server.client() as client:
        for session in client.get("/v1/sessions").json()["sessions"]:
            if session["id"] != KNOWN_SESSION:
                assert client.delete(f"/v1/sessions/{session['id']}").status_code == 204
        _ensure_known_session(client)


@pytest.mark.usefixtures("only_known_session")
@pytest.mark.parametrize("label", list(OPERATIONS))
def test_rest_api_answers_generated_requests_without_5xx_and_as_documented(
    label: str, fuzz_server: RunningServer
) -> None:
    assert fuzz_server.tokens is not None
    admin = OPERATIONS[label].path.startswith("/v1/admin/")
    token = fuzz_server.tokens.admin if admin else fuzz_server.tokens.agent
    headers = {"Authorization": f"Bearer {token}"}

    @seed(SEED)
    @settings(
        max_examples=MAX_EXAMPLES,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: every case runs real code
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(case=_strategy(label))
    def fuzz(case: Any) -> None:
        if (case.path_parameters or {}).get("id") == KNOWN_SESSION:
            with fuzz_server.client() as client:
                _ensure_known_session(client)
        case.call_and_validate(
            base_url=fuzz_server.base_url,
            headers=headers,
            checks=CHECKS,
            timeout=REQUEST_TIMEOUT_S,
        )

    fuzz()


def test_an_upload_body_is_optional_as_the_server_treats_it() -> None:
    """Found by the conformance run: the server writes an empty file without a body."""
    put = document()["paths"]["/v1/sessions/{id}/files/content"]["put"]
    assert put["requestBody"]["required"] is False
    skills = document()["paths"]["/v1/admin/skills"]["post"]
    assert skills["requestBody"]["required"] is True
