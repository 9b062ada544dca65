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

from corral.errors import InvalidInput
from corral.execution import Execution
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
    running, a client that leaves does not stop the code (see `corral.execution`).
    """
    mode = STREAM_TYPES.get(request.headers.get("accept", "").split(",")[0].strip())
    execution = service_of(request).start_execution(
        body.code,
        session_id=session_id,
        language=body.language,
        timeout_s=body.timeout_s,
        actor=role_of(request.scope).value,
        keep_events=mode is not None,
    )
    if mode is None:
        return JSONResponse((await execution.result()).to_dict())
    media = "text/event-stream" if mode == "sse" else "application/x-ndjson"
    return StreamingResponse(
        _stream(execution, mode), media_type=media, headers={"Cache-Control": "no-store"}
    )


async def _stream(execution: Execution, mode: str) -> AsyncIterator[str]:
    """Output events as they happen, then the whole result as the last event."""
    async for event in execution.events():
        yield _event(mode, event.kind, event.to_dict())
    try:
        result = await execution.result()
    except Exception as exc:  # reported in the stream: headers are already sent
        yield _event(mode, "failure", {"message": str(exc)})
        return
    yield _event(mode, "result", result.to_dict())


def _event(mode: str, name: str, data: dict[str, Any]) -> str:
    if mode == "sse":
        return f"event: {name}\ndata: {json.dumps(data)}\n\n"
    return json.dumps({"type": name, **data}) + "\n"


# -- files ---------------------------------------------------------------------------------


async def list_files(request: Request) -> Response:
    params = request.query_params
    listing = service_of(request).list_files(
        request.path_params["id"],
        params.get("path", "."),
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
        limit=_int_param(params.get("limit"), default=100),
    )
    return JSONResponse(page.to_dict())


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
