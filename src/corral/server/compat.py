"""coderunner's REST routes, with its shapes and status codes, so its clients work unchanged.

`POST /execute` answers `{stdout, stderr, execution_time, cpu_time}`; the session routes
answer `{session_id, status, created_at}` and errors as `{"error": message}`; the browser
routes answer 200 with `status` "success" or "error", as coderunner does.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from corral import errors as e
from corral import texts
from corral.browser.fetch import PageResult
from corral.kernels.sessions import SessionInfo
from corral.server import schemas as s
from corral.server.auth import role_of
from corral.server.errors import status_of
from corral.server.operation import Api, service_of, wire
from corral.server.queries import CompatSessionQuery, CompatStopQuery
from corral.server.schemas import (
    CompatBrowserRequest,
    CompatExecuteRequest,
    CompatSessionRequest,
)

NOT_AN_OBJECT = 'The body must be a JSON object, such as {"session_id": "s1"}, or empty.'
BROWSER_TEXT = (
    "Every answer is 200, as in coderunner: a malformed body, a missing `url` or a page that "
    'cannot be loaded gives `status` "error" with the reason in `error`.'
)
STOP_TEXT = (
    "coderunner's clients may give `session_id` in a JSON body instead of the query; the "
    "query wins when both are given, and a body given is checked either way."
)

# Each handler reads its own input (`parse=False`): a bad one is answered in coderunner's
# shape for that route, not corral's.
api = Api()


@api(
    "POST",
    "/execute",
    "coderunner: run code",
    body=s.CompatExecuteRequest,
    ok=(200, s.CompatExecuteResponse),
    error_model=s.CompatExecuteResponse,
    parse=False,
)
async def execute(request: Request) -> Response:
    try:
        body = CompatExecuteRequest.model_validate(json.loads(await request.body() or b"{}"))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as exc:
        return _exec_failure(400, f"Invalid request body: {exc}")
    code = body.code or body.command
    if not code:
        return _exec_failure(400, "Missing 'code' or 'command' field in request body")
    try:
        result = await service_of(request).executions.run(
            code,
            session_id=body.session_id,
            language=body.language,
            timeout_s=body.timeout,
            actor=role_of(request.scope).value,
            resume=False,
        )
    except (e.SessionNotFound, e.SessionClosed) as exc:  # coderunner answers these with 200
        return _exec_failure(200, texts.failure_text(exc))
    except e.CorralError as exc:
        return _exec_failure(status_of(exc)[0], texts.failure_text(exc))
    seconds = round(result.duration_s, 6)
    stdout, stderr = texts.compat_output(result)
    return JSONResponse(
        {"stdout": stdout, "stderr": stderr, "execution_time": seconds, "cpu_time": seconds}
    )


def _exec_failure(status: int, message: str) -> Response:
    return JSONResponse(
        {"stdout": "", "stderr": message, "execution_time": 0.0, "cpu_time": 0.0},
        status_code=status,
    )


@api(
    "POST",
    "/v1/sessions/session",
    "coderunner: create a session",
    body=s.CompatSessionRequest,
    body_required=False,
    ok=(201, s.CompatSession),
    error_model=s.CompatError,
    parse=False,
)
async def create_session(request: Request) -> Response:
    body = await _session_body(request)
    if isinstance(body, Response):
        return body
    return await _call(lambda: _created(request, body.get("session_id")))


async def _session_body(request: Request) -> dict[str, Any] | Response:
    """The session routes' optional body: a JSON object (empty when absent), or the error."""
    try:
        body = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "Invalid JSON body.")
    if not isinstance(body, dict):
        return _error(400, NOT_AN_OBJECT)
    return body


async def _created(request: Request, session_id: str | None) -> Response:
    info = await service_of(request).create_session(session_id, actor=role_of(request.scope).value)
    return JSONResponse(wire(s.CompatSession, info), status_code=201)


@api(
    "GET",
    "/v1/sessions/session",
    "coderunner: get one session (or list them all)",
    query=CompatSessionQuery,
    ok=(200, s.CompatSessionOrList),
    error_model=s.CompatError,
    parse=False,
)
async def get_session(request: Request) -> Response:
    session_id = request.query_params.get("session_id")
    service = service_of(request)
    if session_id is None:
        return JSONResponse(wire(s.CompatSessionList, {"sessions": service.active_sessions()}))
    return await _call(lambda: _got(service.get_session(session_id)))


async def _got(info: SessionInfo) -> Response:
    if not info.open:  # coderunner forgets a stopped session
        raise e.SessionNotFound(info.id)
    return JSONResponse(wire(s.CompatSession, info))


@api(
    "DELETE",
    "/v1/sessions/session",
    "coderunner: stop a session",
    description=STOP_TEXT,
    body=s.CompatSessionRequest,
    body_required=False,
    query=CompatStopQuery,
    ok=(200, s.CompatSession),
    error_model=s.CompatError,
    parse=False,
)
async def delete_session(request: Request) -> Response:
    """The session in the query, else in the body; a body given is checked either way."""
    body = await _session_body(request)
    if isinstance(body, Response):
        return body
    try:
        named = CompatSessionRequest.model_validate(body).session_id
    except ValidationError as exc:
        return _error(400, f"Invalid request body: {exc}")
    session_id = request.query_params.get("session_id") or named
    if not session_id:
        return _error(400, "Missing session_id.")
    return await _call(lambda: _stopped(request, session_id))


async def _stopped(request: Request, session_id: str) -> Response:
    actor = role_of(request.scope).value
    info = await service_of(request).stop_session(session_id, actor=actor, only_open=True)
    return JSONResponse(wire(s.CompatSession, info))


async def _call(action: Any) -> Response:
    try:
        response: Response = await action()
    except e.CorralError as exc:
        return _error(status_of(exc)[0], str(exc))
    return response


@api(
    "POST",
    "/v1/browser/interactions/navigate",
    "coderunner: load a page and return its visible text",
    description=BROWSER_TEXT,
    body=s.CompatBrowserRequest,
    body_required=False,
    any_body=True,
    ok=(200, s.CompatNavigateResponse),
    error_model=s.CompatNavigateResponse,
    parse=False,
)
async def browser_navigate(request: Request) -> Response:
    """coderunner's navigate: `{status, url, title, content}` or `{status: "error", error}`."""
    page = await _fetch_for_compat(request)
    if isinstance(page, str):
        return JSONResponse({"status": "error", "error": page})
    return JSONResponse(
        {
            "status": "success",
            "url": page.url,
            "title": page.title,
            "content": texts.page_text(page),
        }
    )


@api(
    "POST",
    "/v1/browser/interactions/content",
    "coderunner: load a page and return its readable content",
    description=BROWSER_TEXT,
    body=s.CompatBrowserRequest,
    body_required=False,
    any_body=True,
    ok=(200, s.CompatContentResponse),
    error_model=s.CompatContentResponse,
    parse=False,
)
async def browser_content(request: Request) -> Response:
    """coderunner's content: `{status, readable_content: {content}}`, anchors when asked."""
    page = await _fetch_for_compat(request)
    if isinstance(page, str):
        return JSONResponse({"status": "error", "error": page})
    answer: dict[str, Any] = {"status": "success", "readable_content": {"content": page.text}}
    options = _browser_body(await request.body())
    if isinstance(options, CompatBrowserRequest) and options.include_anchors:
        answer["anchors"] = page.links[: options.max_anchors]
    return JSONResponse(answer)


async def _fetch_for_compat(request: Request) -> PageResult | str:
    body = _browser_body(await request.body())
    if isinstance(body, str):
        return body
    if not body.url:
        return "Error: Missing 'url' field in request body"
    timeout_s = body.wait_timeout / 1000 if body.wait_timeout else None
    service = service_of(request)
    if timeout_s is not None:
        timeout_s = min(timeout_s, service.settings.browser_timeout_s)
    try:
        return await service.browser.fetch(body.url, timeout_s=timeout_s)
    except e.CorralError as exc:
        return texts.fetch_failure_text(exc)


def _browser_body(raw: bytes) -> CompatBrowserRequest | str:
    try:
        return CompatBrowserRequest.model_validate(json.loads(raw or b"{}"))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as exc:
        return f"Error: Invalid request body: {exc}"


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status)


# Every path coderunner serves: its REST routes, its health check and its MCP endpoint.
PATHS = frozenset({op.path for op in api.operations} | {"/health", "/mcp"})
