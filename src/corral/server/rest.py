"""The clean `/v1` REST API: thin handlers that validate, call the service and shape JSON.

Errors are not handled here: the app maps `corral.errors` and validation failures to
statuses in one place (`corral.server.errors`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, TypeVar, overload

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from corral.audit import MAX_QUERY_LIMIT
from corral.errors import InvalidInput
from corral.execution import Execution
from corral.kernels.session import validate_session_id
from corral.server.auth import role_of
from corral.server.schemas import (
    BridgeRequest,
    CreateSessionRequest,
    ExecuteAnyRequest,
    ExecuteRequest,
    FetchRequest,
    LimitsChange,
    NetworkAccessRequest,
    NetworkHostsRequest,
    NetworkPolicyRequest,
)
from corral.service import Service

STREAM_TYPES = {"text/event-stream": "sse", "application/x-ndjson": "ndjson"}
MEDIA = {mode: media for media, mode in STREAM_TYPES.items()}
EXECUTION_HEADER = "X-Corral-Execution-Id"
KEEPALIVE_S = 15.0


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


ModelT = TypeVar("ModelT", bound=BaseModel)


async def parse_body(request: Request, model: type[ModelT]) -> ModelT:
    """The JSON body validated against `model`; InvalidInput for bad JSON, 422 for bad fields."""
    raw = await request.body()
    try:
        data = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the body is not valid JSON: {exc}") from exc
    return model.model_validate(data)


# -- sessions ------------------------------------------------------------------------------


async def create_session(request: Request) -> Response:
    body = await parse_body(request, CreateSessionRequest)
    info = await service_of(request).create_session(
        body.id, actor=role_of(request.scope).value, mounts=body.mounts
    )
    return JSONResponse(info.to_dict(), status_code=201)


async def list_sessions(request: Request) -> Response:
    sessions = [info.to_dict() for info in service_of(request).list_sessions()]
    return JSONResponse({"sessions": sessions})


async def get_session(request: Request) -> Response:
    return JSONResponse(service_of(request).get_session(request.path_params["id"]).to_dict())


async def delete_session(request: Request) -> Response:
    await service_of(request).delete_session(
        request.path_params["id"], actor=role_of(request.scope).value
    )
    return Response(status_code=204)


async def stop_session(request: Request) -> Response:
    info = await service_of(request).stop_session(
        request.path_params["id"], actor=role_of(request.scope).value
    )
    return JSONResponse(info.to_dict())


async def restart_session(request: Request) -> Response:
    info = await service_of(request).restart_session(
        request.path_params["id"], actor=role_of(request.scope).value
    )
    return JSONResponse(info.to_dict())


# -- execution -----------------------------------------------------------------------------


async def execute_in_session(request: Request) -> Response:
    body = await parse_body(request, ExecuteRequest)
    return await _execute(request, request.path_params["id"], body)


async def execute_any(request: Request) -> Response:
    body = await parse_body(request, ExecuteAnyRequest)
    return await _execute(request, body.session_id, body)


async def _execute(request: Request, session_id: str | None, body: ExecuteRequest) -> Response:
    """The result as JSON, or streamed as SSE/NDJSON events when the client accepts that.

    The request is checked before anything starts, so a refusal is a plain status; once
    running, a client that leaves does not stop the code (see `corral.execution`). The
    execution's id is in the `X-Corral-Execution-Id` header and a stream's first event, for
    a client that must come back to it (`GET /v1/executions/{id}`).
    """
    mode = _stream_mode(request)
    execution = service_of(request).start_execution(
        body.code,
        session_id=session_id,
        language=body.language,
        timeout_s=body.timeout_s,
        actor=role_of(request.scope).value,
    )
    if mode is None:
        result = (await execution.result()).to_dict()
        return JSONResponse(result, headers={EXECUTION_HEADER: execution.id})
    return _streamed(execution, mode, after=0, announce=True)


def _stream_mode(request: Request) -> str | None:
    return STREAM_TYPES.get(request.headers.get("accept", "").split(",")[0].strip())


def _streamed(execution: Execution, mode: str, *, after: int, announce: bool) -> Response:
    headers = {"Cache-Control": "no-store", EXECUTION_HEADER: execution.id}
    body = _stream(execution, mode, after=after, announce=announce)
    return StreamingResponse(body, media_type=MEDIA[mode], headers=headers)


async def _stream(
    execution: Execution, mode: str, *, after: int, announce: bool
) -> AsyncIterator[str]:
    """The execution's id first (when `announce`), then its output events after number
    `after` as they happen, each with its number, then the whole result as the last event."""
    if announce:
        yield _event(mode, "execution", {"id": execution.id, "session_id": execution.session_id})
    async for number, event in execution.events(after):
        yield _event(mode, event.kind, {"seq": number, **event.to_dict()}, number)
    try:
        result = await execution.result()
    except Exception as exc:  # reported in the stream: headers are already sent
        yield _event(mode, "failure", {"message": str(exc)})
        return
    yield _event(mode, "result", result.to_dict())


def _event(mode: str, name: str, data: dict[str, Any], number: int | None = None) -> str:
    if mode == "sse":
        numbered = f"id: {number}\n" if number is not None else ""
        return f"{numbered}event: {name}\ndata: {json.dumps(data)}\n\n"
    return json.dumps({"type": name, **data}) + "\n"


# -- executions a client comes back to --------------------------------------------------------


async def list_executions(request: Request) -> Response:
    session_id = request.query_params.get("session_id")
    if session_id is not None:
        validate_session_id(session_id)
    kept = service_of(request).executions.listed(session_id)
    return JSONResponse({"executions": [execution_view(e, with_result=False) for e in kept]})


async def get_execution(request: Request) -> Response:
    execution = service_of(request).executions.get(request.path_params["eid"])
    return JSONResponse(execution_view(execution, with_result=True))


async def execution_events(request: Request) -> Response:
    """The events after `?after=N` (or the SSE `Last-Event-ID`), then the result."""
    execution = service_of(request).executions.get(request.path_params["eid"])
    after = _after(request)
    return _streamed(execution, _stream_mode(request) or "sse", after=after, announce=False)


async def session_events(request: Request) -> Response:
    """The session's status events after `?after=N` (or `Last-Event-ID`), then each as it
    happens, until the session is deleted or the server stops; SSE unless Accept asks
    for NDJSON. A comment (SSE) or an empty line (NDJSON) every KEEPALIVE_S keeps an idle
    connection open."""
    after = _after(request)
    mode = _stream_mode(request) or "sse"
    events = service_of(request).follow_session(request.path_params["id"], after, KEEPALIVE_S)
    missed = service_of(request).session_events.missed(request.path_params["id"], after)

    async def body() -> AsyncIterator[str]:
        if missed:
            yield _event(mode, "missed", {"count": missed})
        async for event in events:
            if event is None:
                yield ": keep-alive\n\n" if mode == "sse" else "\n"
            else:
                yield _event(mode, event.kind, event.to_dict(), event.seq)

    return StreamingResponse(body(), media_type=MEDIA[mode], headers={"Cache-Control": "no-store"})


def _after(request: Request) -> int:
    """The last event number the client saw: `?after=N`, else SSE's `Last-Event-ID`."""
    raw = request.query_params.get("after") or request.headers.get("last-event-id")
    after = _int_param(raw, 0)
    if after < 0:
        raise InvalidInput("after must be an event number, 0 or more")
    return after


def execution_view(execution: Execution, *, with_result: bool) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": execution.id,
        "session_id": execution.session_id,
        "state": execution.state,
        "created_at": execution.created_at,
        "ended_at": execution.ended_at,
        "events": len(execution.log),
        "events_cut": execution.log.cut,
        "failure": execution.failure(),
    }
    if with_result:
        outcome = execution.outcome()
        view["result"] = outcome.to_dict() if outcome is not None else None
    return view


# -- files ---------------------------------------------------------------------------------


async def list_files(request: Request) -> Response:
    params = request.query_params
    path = params.get("path", ".")
    if not path:
        raise InvalidInput("the 'path' query parameter is empty: use '.' for /workspace itself")
    listing = service_of(request).list_files(
        request.path_params["id"],
        path,
        recursive=_bool_param(params.get("recursive")),
    )
    return JSONResponse(listing.to_dict())


async def download_file(request: Request) -> Response:
    data = service_of(request).read_file(request.path_params["id"], _required_path(request))
    return Response(data, media_type="application/octet-stream")


async def upload_file(request: Request) -> Response:
    data = await request.body()
    entry = service_of(request).write_file(request.path_params["id"], _required_path(request), data)
    return JSONResponse(entry.to_dict(), status_code=201)


async def delete_file(request: Request) -> Response:
    recursive = _bool_param(request.query_params.get("recursive"))
    service_of(request).delete_file(
        request.path_params["id"], _required_path(request), recursive=recursive
    )
    return Response(status_code=204)


def _required_path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise InvalidInput("the 'path' query parameter is required")
    return path


# -- admin ---------------------------------------------------------------------------------


async def admin_audit(request: Request) -> Response:
    params = request.query_params
    page = await service_of(request).audit_page(
        kind=params.get("kind"),
        session=params.get("session"),
        before_id=_int_param(params.get("before_id")),
        limit=_page_limit(params.get("limit")),
    )
    return JSONResponse(page.to_dict())


def _page_limit(raw: str | None) -> int:
    """`?limit=`, 100 by default; past `MAX_QUERY_LIMIT` it is refused, as documented."""
    limit = _int_param(raw, default=100)
    if limit > MAX_QUERY_LIMIT:
        raise InvalidInput(f"limit must be at most {MAX_QUERY_LIMIT}, not {limit}")
    return limit


async def admin_stop_session(request: Request) -> Response:
    info = await service_of(request).admin_stop_session(request.path_params["id"])
    return JSONResponse(info.to_dict())


async def admin_get_limits(request: Request) -> Response:
    return JSONResponse(service_of(request).session_limits(request.path_params["id"]).to_dict())


async def admin_set_limits(request: Request) -> Response:
    body = await parse_body(request, LimitsChange)
    changes = body.model_dump(exclude_none=True)  # the model refuses nulls and {}
    report = await service_of(request).set_session_limits(request.path_params["id"], changes)
    return JSONResponse(report.to_dict())


async def admin_set_bridge(request: Request) -> Response:
    body = await parse_body(request, BridgeRequest)
    report = await service_of(request).set_bridge(request.path_params["id"], body.ssh_agent)
    return JSONResponse(report.to_dict())


async def list_skills(request: Request) -> Response:
    return JSONResponse((await service_of(request).list_skills()).to_dict())


async def skill_info(request: Request) -> Response:
    info = await service_of(request).skill_info(request.path_params["name"])
    return JSONResponse(info.to_dict())


async def skill_file(request: Request) -> Response:
    params = request.path_params
    data = await service_of(request).skill_file(params["name"], params["filename"])
    return Response(data, media_type="application/octet-stream")


async def browser_fetch(request: Request) -> Response:
    body = await parse_body(request, FetchRequest)
    page = await service_of(request).fetch_page(
        body.url, screenshot=body.screenshot, timeout_s=body.timeout_s
    )
    return JSONResponse(page.to_dict())


# -- network ---------------------------------------------------------------------------------


async def request_network(request: Request) -> Response:
    """The agent asks for access; the answer comes from the operator, later."""
    body = await parse_body(request, NetworkAccessRequest)
    made = await service_of(request).request_network_access(
        request.path_params["id"], body.hosts, body.reason
    )
    return JSONResponse(made.to_dict(), status_code=202)


async def admin_get_network(request: Request) -> Response:
    return JSONResponse(service_of(request).network_policy(request.path_params["id"]).to_dict())


async def admin_set_network(request: Request) -> Response:
    body = await parse_body(request, NetworkPolicyRequest)
    changed = await service_of(request).set_network(
        request.path_params["id"], body.mode, body.allow
    )
    return JSONResponse(changed.to_dict())


async def admin_allow_network(request: Request) -> Response:
    body = await parse_body(request, NetworkHostsRequest)
    changed = await service_of(request).allow_network(request.path_params["id"], body.hosts)
    return JSONResponse(changed.to_dict())


async def admin_deny_network(request: Request) -> Response:
    body = await parse_body(request, NetworkHostsRequest)
    changed = await service_of(request).deny_network(request.path_params["id"], body.hosts)
    return JSONResponse(changed.to_dict())


async def admin_network_requests(request: Request) -> Response:
    status = request.query_params.get("status")
    found = await service_of(request).network_requests(status)
    return JSONResponse({"requests": [made.to_dict() for made in found]})


async def admin_approve_request(request: Request) -> Response:
    return await _decide_request(request, approve=True)


async def admin_reject_request(request: Request) -> Response:
    return await _decide_request(request, approve=False)


async def _decide_request(request: Request, *, approve: bool) -> Response:
    request_id = _int_param(request.path_params["rid"], default=0)
    decided = await service_of(request).decide_network_request(request_id, approve)
    return JSONResponse(decided.to_dict())


def _bool_param(raw: str | None) -> bool:
    if raw is None:
        return False
    value = raw.lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise InvalidInput(f"{raw!r} is not true or false")
    return value in ("true", "1", "yes")


@overload
def _int_param(raw: str | None) -> int | None: ...
@overload
def _int_param(raw: str | None, default: int) -> int: ...
def _int_param(raw: str | None, default: int | None = None) -> int | None:
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise InvalidInput(f"{raw!r} is not a whole number") from exc


ROUTES = [
    Route("/v1/sessions", create_session, methods=["POST"]),
    Route("/v1/sessions", list_sessions, methods=["GET"]),
    Route("/v1/sessions/{id}", get_session, methods=["GET"]),
    Route("/v1/sessions/{id}", delete_session, methods=["DELETE"]),
    Route("/v1/sessions/{id}/stop", stop_session, methods=["POST"]),
    Route("/v1/sessions/{id}/restart", restart_session, methods=["POST"]),
    Route("/v1/sessions/{id}/execute", execute_in_session, methods=["POST"]),
    Route("/v1/execute", execute_any, methods=["POST"]),
    Route("/v1/sessions/{id}/events", session_events, methods=["GET"]),
    Route("/v1/executions", list_executions, methods=["GET"]),
    Route("/v1/executions/{eid}", get_execution, methods=["GET"]),
    Route("/v1/executions/{eid}/events", execution_events, methods=["GET"]),
    Route("/v1/sessions/{id}/files", list_files, methods=["GET"]),
    Route("/v1/sessions/{id}/files", delete_file, methods=["DELETE"]),
    Route("/v1/sessions/{id}/files/content", download_file, methods=["GET"]),
    Route("/v1/sessions/{id}/files/content", upload_file, methods=["PUT"]),
    Route("/v1/browser/fetch", browser_fetch, methods=["POST"]),
    Route("/v1/skills", list_skills, methods=["GET"]),
    Route("/v1/skills/{name}", skill_info, methods=["GET"]),
    Route("/v1/skills/{name}/files/{filename:path}", skill_file, methods=["GET"]),
    Route("/v1/admin/audit", admin_audit, methods=["GET"]),
    Route("/v1/admin/sessions/{id}/stop", admin_stop_session, methods=["POST"]),
    Route("/v1/admin/sessions/{id}/limits", admin_get_limits, methods=["GET"]),
    Route("/v1/admin/sessions/{id}/limits", admin_set_limits, methods=["PATCH"]),
    Route("/v1/admin/sessions/{id}/bridge", admin_set_bridge, methods=["PUT"]),
    Route("/v1/sessions/{id}/network/requests", request_network, methods=["POST"]),
    Route("/v1/admin/sessions/{id}/network", admin_get_network, methods=["GET"]),
    Route("/v1/admin/sessions/{id}/network", admin_set_network, methods=["PUT"]),
    Route("/v1/admin/sessions/{id}/network/allow", admin_allow_network, methods=["POST"]),
    Route("/v1/admin/sessions/{id}/network/deny", admin_deny_network, methods=["POST"]),
    Route("/v1/admin/network/requests", admin_network_requests, methods=["GET"]),
    Route("/v1/admin/network/requests/{rid}/approve", admin_approve_request, methods=["POST"]),
    Route("/v1/admin/network/requests/{rid}/reject", admin_reject_request, methods=["POST"]),
]
