"""The clean `/v1` REST API: thin handlers that call the service and return what it
returns, each declared once with its route, its OpenAPI entry and the model that writes its
answer (`corral.server.operation`); only the streams are written here.

Errors are not handled here: the app maps `corral.errors` and validation failures to
statuses in one place (`corral.server.errors`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from corral.audit import AuditPage
from corral.browser.fetch import PageResult
from corral.controls import BridgeReport, LimitsReport
from corral.egress.network import NetworkStatus, PolicyChange
from corral.errors import InvalidInput
from corral.execution import Event as OutputEvent
from corral.execution import Execution
from corral.files import FileEntry, Listing
from corral.kernels.pool import PoolStatus
from corral.kernels.session import SessionInfo
from corral.server import queries as q
from corral.server import schemas as s
from corral.server.auth import role_of
from corral.server.operation import Api, service_of, wire
from corral.skills.catalog import SkillInfo, SkillListing
from corral.store import NetRequest

STREAM_TYPES = {"text/event-stream": "sse", "application/x-ndjson": "ndjson"}
MEDIA = {mode: media for media, mode in STREAM_TYPES.items()}
EXECUTION_HEADER = "X-Corral-Execution-Id"
KEEPALIVE_S = 15.0
EXECUTION_ID_PATTERN = "^ex-[0-9a-f]{16}$"

api = Api()

# What the document says of the routes beyond their schemas.
STREAM_TEXT = (
    "Accept: text/event-stream or application/x-ndjson streams an `execution` event (its id), "
    "then stdout, stderr, display and error events, each with its number `seq` (the SSE "
    "`id`), then the result. The code runs on if the client goes away; "
    "GET /v1/executions/{eid}/events?after=SEQ resumes the stream."
)
PATH_TEXT = (
    "`path` is relative to /workspace; one that leaves it (`..`, an absolute path elsewhere, "
    "a link out) or holds a NUL gets 400 `path_refused`."
)
EXECUTION_ID_HEADER: dict[str, Any] = {
    EXECUTION_HEADER: {
        "description": "The execution's id, for GET /v1/executions/{eid}",
        "required": True,
        "schema": {"type": "string", "pattern": EXECUTION_ID_PATTERN},
    }
}
_EXECUTION_ID = (("eid", f"$response.header.{EXECUTION_HEADER}"),)
EXECUTION_LINKS = (
    ("GetExecution", "get_v1_executions_eid", _EXECUTION_ID),
    ("GetExecutionEvents", "get_v1_executions_eid_events", _EXECUTION_ID),
)
SESSION_LINKS = (
    ("DeleteFile", "delete_v1_sessions_id_files", (("id", "$response.body#/id"),)),
    (
        "StopCoderunnerSession",
        "delete_v1_sessions_session",
        (("query.session_id", "$response.body#/id"),),
    ),
)
SKILL_LINKS = (
    (
        "GetSkillFile",
        "get_v1_skills_name_files_filename",
        (("name", "$response.body#/skills/0/name"), ("filename", "SKILL.md")),
    ),
)
SESSION_EVENTS_TEXT = (
    "Each event has `seq` (the SSE `id`), `kind`, `at` and its details. The newest 500 are "
    "kept per session; a client further behind first gets a `missed` event with their "
    "count. The stream ends when the session is deleted or the server stops; an idle one "
    "carries a keep-alive every 15 s."
)
LIMITS_TEXT = (
    "A value the schema admits can still be refused: a size string that comes to less than "
    "the minimum (128 MiB of memory, 1 byte otherwise) or more than 8192 TiB gets 400 "
    "`invalid_input`; memory below what the session uses now gets 409 `conflict`."
)
FETCH_ERRORS = (
    ("403", "The browsing policy refused the page's host; the message says how to allow it"),
    ("502", "The page could not be loaded; the message says why"),
    ("504", "The page did not load within the timeout"),
)


# -- sessions ------------------------------------------------------------------------------


@api(
    "POST",
    "/v1/sessions",
    "Create a session",
    body=s.CreateSessionRequest,
    body_required=False,
    ok=(201, s.SessionModel),
    links=SESSION_LINKS,
)
async def create_session(request: Request, body: s.CreateSessionRequest) -> SessionInfo:
    return await service_of(request).create_session(
        body.id, actor=role_of(request.scope).value, mounts=body.mounts
    )


@api("GET", "/v1/sessions", "List sessions", ok=(200, s.SessionList))
async def list_sessions(request: Request) -> dict[str, list[SessionInfo]]:
    return {"sessions": service_of(request).list_sessions()}


@api("GET", "/v1/sessions/{id}", "Get a session", ok=(200, s.SessionModel))
async def get_session(request: Request) -> SessionInfo:
    return service_of(request).get_session(request.path_params["id"])


@api("DELETE", "/v1/sessions/{id}", "Stop a session and delete its files", ok=(204, None))
async def delete_session(request: Request) -> Response:
    await service_of(request).delete_session(
        request.path_params["id"], actor=role_of(request.scope).value
    )
    return Response(status_code=204)


@api(
    "POST",
    "/v1/sessions/{id}/stop",
    "Stop a session's kernels (files stay)",
    ok=(200, s.SessionModel),
)
async def stop_session(request: Request) -> SessionInfo:
    return await service_of(request).stop_session(
        request.path_params["id"], actor=role_of(request.scope).value
    )


@api("POST", "/v1/sessions/{id}/restart", "Replace a session's kernels", ok=(200, s.SessionModel))
async def restart_session(request: Request) -> SessionInfo:
    return await service_of(request).restart_session(
        request.path_params["id"], actor=role_of(request.scope).value
    )


# -- execution -----------------------------------------------------------------------------


@api(
    "POST",
    "/v1/sessions/{id}/execute",
    "Run code in a session",
    description=STREAM_TEXT,
    body=s.ExecuteRequest,
    ok=(200, s.ExecutionResultModel),
    stream=s.EXECUTION_EVENTS,
    headers=EXECUTION_ID_HEADER,
    links=EXECUTION_LINKS,
)
async def execute_in_session(request: Request, body: s.ExecuteRequest) -> Response:
    return await _execute(request, request.path_params["id"], body)


@api(
    "POST",
    "/v1/execute",
    "Run code in a named or the default session",
    description=STREAM_TEXT,
    body=s.ExecuteAnyRequest,
    ok=(200, s.ExecutionResultModel),
    stream=s.EXECUTION_EVENTS,
    headers=EXECUTION_ID_HEADER,
    links=EXECUTION_LINKS,
)
async def execute_any(request: Request, body: s.ExecuteAnyRequest) -> Response:
    return await _execute(request, body.session_id, body)


async def _execute(request: Request, session_id: str | None, body: s.ExecuteRequest) -> Response:
    """The result as JSON, or streamed as SSE/NDJSON events when the client accepts that.

    The request is checked before anything starts, so a refusal is a plain status; once
    running, a client that leaves does not stop the code (see `corral.execution`). The
    execution's id is in the `X-Corral-Execution-Id` header and a stream's first event, for
    a client that must come back to it (`GET /v1/executions/{id}`).
    """
    mode = _stream_mode(request)
    execution = service_of(request).executions.start(
        body.code,
        session_id=session_id,
        language=body.language,
        timeout_s=body.timeout_s,
        actor=role_of(request.scope).value,
    )
    if mode is None:
        result = wire(s.ExecutionResultModel, await execution.result())
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
        yield _event(mode, "execution", wire(s.ExecutionBegunEvent, execution))
    async for number, event in execution.events(after):
        yield _event(mode, event.kind, _output(number, event), number)
    try:
        result = await execution.result()
    except Exception as exc:  # reported in the stream: headers are already sent
        yield _event(mode, "failure", wire(s.StreamFailureEvent, {"message": str(exc)}))
        return
    yield _event(mode, "result", wire(s.ExecutionResultModel, result))


def _output(number: int, event: OutputEvent) -> dict[str, Any]:
    """An output event on the wire: its number, then the fields of its kind."""
    model = s.OUTPUT_EVENTS[event.kind]
    fields = {name: getattr(event, name) for name in model.model_fields if name != "seq"}
    return wire(model, {"seq": number, **fields})


def _event(mode: str, name: str, data: dict[str, Any], number: int | None = None) -> str:
    if mode == "sse":
        numbered = f"id: {number}\n" if number is not None else ""
        return f"{numbered}event: {name}\ndata: {json.dumps(data)}\n\n"
    return json.dumps({"type": name, **data}) + "\n"


# -- executions a client comes back to --------------------------------------------------------


@api(
    "GET",
    "/v1/executions",
    "The executions kept by id (running, and ended ones for a while), newest first",
    query=q.ExecutionsQuery,
    ok=(200, s.ExecutionList),
)
async def list_executions(request: Request, query: q.ExecutionsQuery) -> dict[str, Any]:
    kept = service_of(request).executions.listed(query.session_id)
    return {"executions": [execution_view(e, with_result=False) for e in kept]}


@api(
    "GET",
    "/v1/executions/{eid}",
    "An execution's state and, once it ended, its result",
    ok=(200, s.ExecutionModel),
)
async def get_execution(request: Request) -> dict[str, Any]:
    execution = service_of(request).executions.get(request.path_params["eid"])
    return execution_view(execution, with_result=True)


@api(
    "GET",
    "/v1/executions/{eid}/events",
    "An execution's output events after number `after` (or Last-Event-ID), as they "
    "happen, then its result; SSE unless Accept asks for application/x-ndjson",
    query=q.EventsQuery,
    stream=s.EXECUTION_EVENTS,
)
async def execution_events(request: Request, query: q.EventsQuery) -> Response:
    """The events after `?after=N` (or the SSE `Last-Event-ID`), then the result."""
    execution = service_of(request).executions.get(request.path_params["eid"])
    after = _after(request, query)
    return _streamed(execution, _stream_mode(request) or "sse", after=after, announce=False)


@api(
    "GET",
    "/v1/sessions/{id}/events",
    "A session's status events after number `after` (or Last-Event-ID), then each as "
    "it happens: created, busy, idle, kernel_died, kernel_restarted, limit, restarted, "
    "stopped, deleted; SSE unless Accept asks for application/x-ndjson",
    description=SESSION_EVENTS_TEXT,
    query=q.EventsQuery,
    stream=s.SESSION_EVENTS,
)
async def session_events(request: Request, query: q.EventsQuery) -> Response:
    """The session's status events after `?after=N` (or `Last-Event-ID`), then each as it
    happens, until the session is deleted or the server stops; SSE unless Accept asks
    for NDJSON. A comment (SSE) or an empty line (NDJSON) every KEEPALIVE_S keeps an idle
    connection open."""
    after = _after(request, query)
    mode = _stream_mode(request) or "sse"
    events = service_of(request).follow_session(request.path_params["id"], after, KEEPALIVE_S)
    missed = service_of(request).session_events.missed(request.path_params["id"], after)

    async def body() -> AsyncIterator[str]:
        if missed:
            yield _event(mode, "missed", wire(s.EventsMissedEvent, {"count": missed}))
        async for event in events:
            if event is None:
                yield ": keep-alive\n\n" if mode == "sse" else "\n"
            else:
                yield _event(mode, event.kind, wire(s.SessionEventModel, event), event.seq)

    return StreamingResponse(body(), media_type=MEDIA[mode], headers={"Cache-Control": "no-store"})


def _after(request: Request, query: q.EventsQuery) -> int:
    """The last event number the client saw: `?after=N`, else SSE's `Last-Event-ID`."""
    if query.after is not None:
        return query.after
    after = _int_param(request.headers.get("last-event-id"), 0)
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
        view["result"] = execution.outcome()
    return view


# -- files ---------------------------------------------------------------------------------


@api(
    "GET",
    "/v1/sessions/{id}/files",
    "List workspace files",
    query=q.FilesQuery,
    ok=(200, s.FileListing),
    description=PATH_TEXT,
)
async def list_files(request: Request, query: q.FilesQuery) -> Listing:
    return service_of(request).files.list(
        request.path_params["id"], query.path, recursive=query.recursive
    )


@api(
    "GET",
    "/v1/sessions/{id}/files/content",
    "Download a workspace file",
    query=q.FileQuery,
    description=PATH_TEXT,
    raw_response=True,
)
async def download_file(request: Request, query: q.FileQuery) -> Response:
    data = service_of(request).files.read(request.path_params["id"], query.path)
    return Response(data, media_type="application/octet-stream")


@api(
    "PUT",
    "/v1/sessions/{id}/files/content",
    "Upload a workspace file (raw body; none writes an empty file)",
    query=q.FileQuery,
    ok=(201, s.FileEntryModel),
    description=PATH_TEXT,
    raw_body=True,
    body_required=False,
)
async def upload_file(request: Request, query: q.FileQuery) -> FileEntry:
    data = await request.body()
    return service_of(request).files.write(request.path_params["id"], query.path, data)


@api(
    "DELETE",
    "/v1/sessions/{id}/files",
    "Delete a workspace file or directory",
    query=q.FileDeleteQuery,
    ok=(204, None),
    description=PATH_TEXT,
)
async def delete_file(request: Request, query: q.FileDeleteQuery) -> Response:
    service_of(request).files.delete(
        request.path_params["id"], query.path, recursive=query.recursive
    )
    return Response(status_code=204)


# -- admin ---------------------------------------------------------------------------------


@api(
    "GET",
    "/v1/admin/audit",
    "Page through the audit log (admin)",
    query=q.AuditQuery,
    ok=(200, s.AuditPageModel),
)
async def admin_audit(request: Request, query: q.AuditQuery) -> AuditPage:
    return await service_of(request).audit.page(
        kind=query.kind, session=query.session, before_id=query.before_id, limit=query.limit
    )


@api(
    "GET",
    "/v1/admin/pool",
    "The warm pool: kernels ready for new sessions, its target and memory (admin)",
    ok=(200, s.PoolModel),
)
async def admin_pool(request: Request) -> PoolStatus:
    return service_of(request).controls.pool()


@api(
    "POST",
    "/v1/admin/sessions/{id}/stop",
    "Stop any session (admin)",
    ok=(200, s.SessionModel),
)
async def admin_stop_session(request: Request) -> SessionInfo:
    return await service_of(request).admin_stop_session(request.path_params["id"])


@api(
    "GET",
    "/v1/admin/sessions/{id}/limits",
    "A session's limits, what enforces them and its usage (admin)",
    ok=(200, s.SessionLimitsModel),
)
async def admin_get_limits(request: Request) -> LimitsReport:
    return service_of(request).controls.limits(request.path_params["id"])


@api(
    "PATCH",
    "/v1/admin/sessions/{id}/limits",
    "Change a session's limits; running sandboxes change at once where possible (admin)",
    body=s.LimitsChange,
    ok=(200, s.SessionLimitsModel),
    description=LIMITS_TEXT,
)
async def admin_set_limits(request: Request, body: s.LimitsChange) -> LimitsReport:
    changes = body.model_dump(exclude_none=True)  # the model refuses nulls and {}
    return await service_of(request).controls.set_limits(request.path_params["id"], changes)


@api(
    "PUT",
    "/v1/admin/sessions/{id}/bridge",
    "Enable or disable a session's SSH agent bridge, from its next start (admin)",
    body=s.BridgeRequest,
    ok=(200, s.BridgeModel),
)
async def admin_set_bridge(request: Request, body: s.BridgeRequest) -> BridgeReport:
    return await service_of(request).controls.set_bridge(request.path_params["id"], body.ssh_agent)


@api(
    "GET",
    "/v1/skills",
    "The skills, public and the user's",
    ok=(200, s.SkillList),
    links=SKILL_LINKS,
)
async def list_skills(request: Request) -> SkillListing:
    return await service_of(request).skills.list()


@api("GET", "/v1/skills/{name}", "A skill and its SKILL.md", ok=(200, s.SkillInfo))
async def skill_info(request: Request) -> SkillInfo:
    return await service_of(request).skills.info(request.path_params["name"])


@api(
    "GET",
    "/v1/skills/{name}/files/{filename:path}",
    "A file of a skill (its path inside the skill folder)",
    ok=(200, None),
    raw_response=True,
)
async def skill_file(request: Request) -> Response:
    params = request.path_params
    data = await service_of(request).skills.file(params["name"], params["filename"])
    return Response(data, media_type="application/octet-stream")


@api(
    "POST",
    "/v1/browser/fetch",
    "Load a web page in a sandboxed browser: title, final URL, text, links",
    body=s.FetchRequest,
    ok=(200, s.PageModel),
    extra_errors=FETCH_ERRORS,
)
async def browser_fetch(request: Request, body: s.FetchRequest) -> PageResult:
    return await service_of(request).browser.fetch(
        body.url, screenshot=body.screenshot, timeout_s=body.timeout_s
    )


# -- network ---------------------------------------------------------------------------------


@api(
    "POST",
    "/v1/sessions/{id}/network/requests",
    "Ask the operator for network access (grants nothing by itself)",
    body=s.NetworkAccessRequest,
    ok=(202, s.NetworkRequestModel),
)
async def request_network(request: Request, body: s.NetworkAccessRequest) -> NetRequest:
    """The agent asks for access; the answer comes from the operator, later."""
    return await service_of(request).network.request_access(
        request.path_params["id"], body.hosts, body.reason
    )


@api(
    "GET",
    "/v1/admin/sessions/{id}/network",
    "A session's network policy (admin)",
    ok=(200, s.NetworkPolicyModel),
)
async def admin_get_network(request: Request) -> NetworkStatus:
    return service_of(request).network.policy(request.path_params["id"])


@api(
    "PUT",
    "/v1/admin/sessions/{id}/network",
    "Replace a session's policy (admin)",
    body=s.NetworkPolicyRequest,
    ok=(200, s.NetworkPolicyModel),
)
async def admin_set_network(request: Request, body: s.NetworkPolicyRequest) -> PolicyChange:
    return await service_of(request).network.set(request.path_params["id"], body.mode, body.allow)


@api(
    "POST",
    "/v1/admin/sessions/{id}/network/allow",
    "Allow hosts (admin)",
    body=s.NetworkHostsRequest,
    ok=(200, s.NetworkPolicyModel),
)
async def admin_allow_network(request: Request, body: s.NetworkHostsRequest) -> PolicyChange:
    return await service_of(request).network.allow(request.path_params["id"], body.hosts)


@api(
    "POST",
    "/v1/admin/sessions/{id}/network/deny",
    "Remove hosts (admin)",
    body=s.NetworkHostsRequest,
    ok=(200, s.NetworkPolicyModel),
)
async def admin_deny_network(request: Request, body: s.NetworkHostsRequest) -> PolicyChange:
    return await service_of(request).network.deny(request.path_params["id"], body.hosts)


@api(
    "GET",
    "/v1/admin/network/requests",
    "Agents' access requests (admin)",
    query=q.NetworkRequestsQuery,
    ok=(200, s.NetworkRequestList),
)
async def admin_network_requests(
    request: Request, query: q.NetworkRequestsQuery
) -> dict[str, list[NetRequest]]:
    return {"requests": await service_of(request).network.requests(query.status)}


@api(
    "POST",
    "/v1/admin/network/requests/{rid}/approve",
    "Approve a request (admin)",
    ok=(200, s.NetworkRequestModel),
)
async def admin_approve_request(request: Request) -> NetRequest:
    return await _decide_request(request, approve=True)


@api(
    "POST",
    "/v1/admin/network/requests/{rid}/reject",
    "Reject a request (admin)",
    ok=(200, s.NetworkRequestModel),
)
async def admin_reject_request(request: Request) -> NetRequest:
    return await _decide_request(request, approve=False)


async def _decide_request(request: Request, *, approve: bool) -> NetRequest:
    request_id = _int_param(request.path_params["rid"], default=0)
    return await service_of(request).network.decide(request_id, approve)


def _int_param(raw: str | None, default: int) -> int:
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise InvalidInput(f"{raw!r} is not a whole number") from exc


ROUTES = api.routes()
