"""Running code (`/v1/sessions/{id}/execute`, `/v1/execute`), as JSON or streamed as SSE or
NDJSON, and what a client comes back to: executions by id, their events, a session's
status events. The one module that writes streams."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from corral.errors import InvalidInput
from corral.execution import Event as OutputEvent
from corral.execution import Execution
from corral.server import queries as q
from corral.server import schemas as s
from corral.server.auth import role_of
from corral.server.operation import Api, service_of, wire
from corral.server.queries import int_param

api = Api()

STREAM_TYPES = {"text/event-stream": "sse", "application/x-ndjson": "ndjson"}
MEDIA = {mode: media for media, mode in STREAM_TYPES.items()}
EXECUTION_HEADER = "X-Corral-Execution-Id"
KEEPALIVE_S = 15.0
EXECUTION_ID_PATTERN = "^ex-[0-9a-f]{16}$"
MEDIA = {mode: media for media, mode in STREAM_TYPES.items()}
EXECUTION_HEADER = "X-Corral-Execution-Id"
KEEPALIVE_S = 15.0
EXECUTION_ID_PATTERN = "^ex-[0-9a-f]{16}$"
EXECUTION_HEADER = "X-Corral-Execution-Id"
KEEPALIVE_S = 15.0
EXECUTION_ID_PATTERN = "^ex-[0-9a-f]{16}$"
KEEPALIVE_S = 15.0
EXECUTION_ID_PATTERN = "^ex-[0-9a-f]{16}$"
EXECUTION_ID_PATTERN = "^ex-[0-9a-f]{16}$"

STREAM_TEXT = (
    "Accept: text/event-stream or application/x-ndjson streams an `execution` event (its id), "
    "then stdout, stderr, display and error events, each with its number `seq` (the SSE "
    "`id`), then the result. The code runs on if the client goes away; "
    "GET /v1/executions/{eid}/events?after=SEQ resumes the stream."
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
SESSION_EVENTS_TEXT = (
    "Each event has `seq` (the SSE `id`), `kind`, `at` and its details. The newest 500 are "
    "kept per session; a client further behind first gets a `missed` event with their "
    "count. The stream ends when the session is deleted or the server stops; an idle one "
    "carries a keep-alive every 15 s."
)


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
    after = int_param(request.headers.get("last-event-id"), 0)
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
