"""The OpenAPI document of the REST API, built from the same pydantic models the routes use.

`OPERATIONS` names every REST route once; a test checks it against the app's routing table,
so a route cannot exist without being documented, or the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from corral import __version__
from corral.audit import KINDS, MAX_QUERY_LIMIT
from corral.server import compat
from corral.server import schemas as s
from corral.server.admin import ARCHIVE_NAME, SkillAdded

JSON = "application/json"
# One server-sent event (OpenAPI 3.1 has a stream's schema describe each event): its kind,
# its number and the event itself as a JSON object.
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data", "event"],
    "properties": {
        "event": {"type": "string", "description": "The event's kind."},
        "id": {"type": "string", "description": "The event's number, `seq`."},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The event as a JSON object: `seq`, `kind` and its details.",
        },
        "retry": {"type": "integer"},
    },
}
NDJSON_STREAM: dict[str, Any] = {
    "type": "string",
    "description": "One JSON object per line, the same objects as the SSE events' data.",
}
PATH_Q: dict[str, Any] = {"type": "string", "minLength": 1}
BOOL_Q: dict[str, Any] = {"type": "boolean"}
ID_Q: dict[str, Any] = {"type": "string", "pattern": s.SESSION_ID_PATTERN}
TEXT_Q: dict[str, Any] = {"type": "string"}
KIND_Q: dict[str, Any] = {"type": "string", "enum": list(KINDS)}
ID_NUMBER_Q: dict[str, Any] = {"type": "integer", "minimum": 1}
STATUS_Q: dict[str, Any] = {"type": "string", "enum": ["pending", "approved", "rejected"]}
LIMIT_Q: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": MAX_QUERY_LIMIT}
ARCHIVE_Q: dict[str, Any] = {"type": "string", "pattern": f"^{ARCHIVE_NAME.pattern}$"}
EXECUTION_ID_P: dict[str, Any] = {"type": "string", "pattern": "^ex-[0-9a-f]{16}$"}
AFTER_Q: dict[str, Any] = {"type": "integer", "minimum": 0}
EXECUTION_HEADER: dict[str, Any] = {
    "X-Corral-Execution-Id": {
        "description": "The execution's id, for GET /v1/executions/{eid}",
        "required": True,
        "schema": EXECUTION_ID_P,
    }
}
_EXECUTION_ID = (("eid", "$response.header.X-Corral-Execution-Id"),)
EXECUTION_LINKS = (
    ("GetExecution", "get_v1_executions_eid", _EXECUTION_ID),
    ("GetExecutionEvents", "get_v1_executions_eid_events", _EXECUTION_ID),
)
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
COMPAT_BROWSER_TEXT = (
    "Every answer is 200, as in coderunner: a malformed body, a missing `url` or a page that "
    'cannot be loaded gives `status` "error" with the reason in `error`.'
)


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    body: type[BaseModel] | None = None
    ok: tuple[int, type[BaseModel] | None] = (200, None)
    query: tuple[tuple[str, dict[str, Any], bool], ...] = field(
        default=()
    )  # name, schema, required
    body_required: bool = True
    any_body: bool = False  # any JSON is taken; what does not fit `body` gets the error shape
    raw_body: bool = False
    raw_response: bool = False
    open: bool = False
    admin: bool = False
    error_model: type[BaseModel] = s.ErrorResponse
    description: str = ""  # what the schemas cannot say
    extra_errors: tuple[tuple[str, str], ...] = ()  # status and meaning, past ERRORS
    headers: dict[str, Any] = field(default_factory=dict)  # of the success response
    stream: bool = False  # the success response is an event stream
    # Where the success response's values lead: link name -> (operation, its parameters as
    # OpenAPI runtime expressions), so a client (or a stateful test) can follow real ids.
    links: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = ()


OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/health", "Liveness and what works", ok=(200, s.HealthModel), open=True),
    Operation("GET", "/openapi.json", "This document", ok=(200, None)),
    Operation(
        "POST",
        "/v1/sessions",
        "Create a session",
        body=s.CreateSessionRequest,
        body_required=False,
        ok=(201, s.SessionModel),
        links=(
            ("DeleteFile", "delete_v1_sessions_id_files", (("id", "$response.body#/id"),)),
            (
                "StopCoderunnerSession",
                "delete_v1_sessions_session",
                (("query.session_id", "$response.body#/id"),),
            ),
        ),
    ),
    Operation("GET", "/v1/sessions", "List sessions", ok=(200, s.SessionList)),
    Operation("GET", "/v1/sessions/{id}", "Get a session", ok=(200, s.SessionModel)),
    Operation("DELETE", "/v1/sessions/{id}", "Stop a session and delete its files", ok=(204, None)),
    Operation(
        "POST",
        "/v1/sessions/{id}/stop",
        "Stop a session's kernels (files stay)",
        ok=(200, s.SessionModel),
    ),
    Operation(
        "POST", "/v1/sessions/{id}/restart", "Replace a session's kernels", ok=(200, s.SessionModel)
    ),
    Operation(
        "POST",
        "/v1/sessions/{id}/execute",
        "Run code in a session",
        description=STREAM_TEXT,
        body=s.ExecuteRequest,
        ok=(200, s.ExecutionResultModel),
        headers=EXECUTION_HEADER,
        links=EXECUTION_LINKS,
    ),
    Operation(
        "POST",
        "/v1/execute",
        "Run code in a named or the default session",
        description=STREAM_TEXT,
        body=s.ExecuteAnyRequest,
        ok=(200, s.ExecutionResultModel),
        headers=EXECUTION_HEADER,
        links=EXECUTION_LINKS,
    ),
    Operation(
        "GET",
        "/v1/sessions/{id}/events",
        "A session's status events after number `after` (or Last-Event-ID), then each as "
        "it happens: created, busy, idle, kernel_died, kernel_restarted, limit, restarted, "
        "stopped, deleted; SSE unless Accept asks for application/x-ndjson",
        description="Each event has `seq` (the SSE `id`), `kind`, `at` and its details. The "
        "newest 500 are kept per session; a client further behind first gets a `missed` "
        "event with their count. The stream ends when the session is deleted or the server "
        "stops; an idle one carries a keep-alive every 15 s.",
        query=(("after", AFTER_Q, False),),
        stream=True,
    ),
    Operation(
        "GET",
        "/v1/executions",
        "The executions kept by id (running, and ended ones for a while), newest first",
        ok=(200, s.ExecutionList),
        query=(("session_id", ID_Q, False),),
    ),
    Operation(
        "GET",
        "/v1/executions/{eid}",
        "An execution's state and, once it ended, its result",
        ok=(200, s.ExecutionModel),
    ),
    Operation(
        "GET",
        "/v1/executions/{eid}/events",
        "An execution's output events after number `after` (or Last-Event-ID), as they "
        "happen, then its result; SSE unless Accept asks for application/x-ndjson",
        query=(("after", AFTER_Q, False),),
        stream=True,
    ),
    Operation(
        "GET",
        "/v1/sessions/{id}/files",
        "List workspace files",
        ok=(200, s.FileListing),
        query=(("path", PATH_Q, False), ("recursive", BOOL_Q, False)),
        description=PATH_TEXT,
    ),
    Operation(
        "DELETE",
        "/v1/sessions/{id}/files",
        "Delete a workspace file or directory",
        ok=(204, None),
        query=(("path", PATH_Q, True), ("recursive", BOOL_Q, False)),
        description=PATH_TEXT,
    ),
    Operation(
        "GET",
        "/v1/sessions/{id}/files/content",
        "Download a workspace file",
        query=(("path", PATH_Q, True),),
        description=PATH_TEXT,
        raw_response=True,
    ),
    Operation(
        "PUT",
        "/v1/sessions/{id}/files/content",
        "Upload a workspace file (raw body; none writes an empty file)",
        ok=(201, s.FileEntryModel),
        query=(("path", PATH_Q, True),),
        description=PATH_TEXT,
        raw_body=True,
        body_required=False,
    ),
    Operation(
        "GET",
        "/v1/admin/audit",
        "Page through the audit log (admin)",
        ok=(200, s.AuditPageModel),
        admin=True,
        query=(
            ("kind", KIND_Q, False),
            ("session", TEXT_Q, False),
            ("before_id", ID_NUMBER_Q, False),
            ("limit", LIMIT_Q, False),
        ),
    ),
    Operation(
        "POST",
        "/v1/admin/sessions/{id}/stop",
        "Stop any session (admin)",
        ok=(200, s.SessionModel),
        admin=True,
    ),
    Operation(
        "DELETE",
        "/v1/admin/sessions/{id}",
        "Stop any session and delete its files (admin)",
        ok=(204, None),
        admin=True,
    ),
    Operation(
        "POST",
        "/v1/admin/skills",
        "Add a skill from a .zip body, unpacked with the size, count and path checks (admin)",
        ok=(201, SkillAdded),
        query=(("name", ARCHIVE_Q, False),),
        raw_body=True,
        admin=True,
        description="A body that is not a zip archive of one skill, or that fails the size, "
        "count or path checks, gets 400 `invalid_input` naming the check.",
    ),
    Operation(
        "GET",
        "/v1/admin/sessions/{id}/limits",
        "A session's limits, what enforces them and its usage (admin)",
        ok=(200, s.SessionLimitsModel),
        admin=True,
    ),
    Operation(
        "PATCH",
        "/v1/admin/sessions/{id}/limits",
        "Change a session's limits; running sandboxes change at once where possible (admin)",
        body=s.LimitsChange,
        ok=(200, s.SessionLimitsModel),
        admin=True,
        description="A value the schema admits can still be refused: a size string that "
        "comes to less than the minimum (128 MiB of memory, 1 byte otherwise) or more than "
        "8192 TiB gets 400 "
        "`invalid_input`; memory below what the session uses now gets 409 `conflict`.",
    ),
    Operation(
        "PUT",
        "/v1/admin/sessions/{id}/bridge",
        "Enable or disable a session's SSH agent bridge, from its next start (admin)",
        body=s.BridgeRequest,
        ok=(200, s.BridgeModel),
        admin=True,
    ),
    Operation(
        "POST",
        "/v1/sessions/{id}/network/requests",
        "Ask the operator for network access (grants nothing by itself)",
        body=s.NetworkAccessRequest,
        ok=(202, s.NetworkRequestModel),
    ),
    Operation(
        "GET",
        "/v1/admin/sessions/{id}/network",
        "A session's network policy (admin)",
        ok=(200, s.NetworkPolicyModel),
        admin=True,
    ),
    Operation(
        "PUT",
        "/v1/admin/sessions/{id}/network",
        "Replace a session's policy (admin)",
        body=s.NetworkPolicyRequest,
        ok=(200, s.NetworkPolicyModel),
        admin=True,
    ),
    Operation(
        "POST",
        "/v1/admin/sessions/{id}/network/allow",
        "Allow hosts (admin)",
        body=s.NetworkHostsRequest,
        ok=(200, s.NetworkPolicyModel),
        admin=True,
    ),
    Operation(
        "POST",
        "/v1/admin/sessions/{id}/network/deny",
        "Remove hosts (admin)",
        body=s.NetworkHostsRequest,
        ok=(200, s.NetworkPolicyModel),
        admin=True,
    ),
    Operation(
        "GET",
        "/v1/admin/network/requests",
        "Agents' access requests (admin)",
        ok=(200, s.NetworkRequestList),
        admin=True,
        query=(("status", STATUS_Q, False),),
    ),
    Operation(
        "POST",
        "/v1/admin/network/requests/{rid}/approve",
        "Approve a request (admin)",
        ok=(200, s.NetworkRequestModel),
        admin=True,
    ),
    Operation(
        "POST",
        "/v1/admin/network/requests/{rid}/reject",
        "Reject a request (admin)",
        ok=(200, s.NetworkRequestModel),
        admin=True,
    ),
    Operation(
        "GET",
        "/v1/skills",
        "The skills, public and the user's",
        ok=(200, s.SkillList),
        links=(
            (
                "GetSkillFile",
                "get_v1_skills_name_files_filename",
                (("name", "$response.body#/skills/0/name"), ("filename", "SKILL.md")),
            ),
        ),
    ),
    Operation("GET", "/v1/skills/{name}", "A skill and its SKILL.md", ok=(200, s.SkillInfo)),
    Operation(
        "GET",
        "/v1/skills/{name}/files/{filename}",
        "A file of a skill (its path inside the skill folder)",
        ok=(200, None),
        raw_response=True,
    ),
    Operation(
        "POST",
        "/v1/browser/fetch",
        "Load a web page in a sandboxed browser: title, final URL, text, links",
        body=s.FetchRequest,
        ok=(200, s.PageModel),
        extra_errors=(
            (
                "403",
                "The browsing policy refused the page's host; the message says how to allow it",
            ),
            ("502", "The page could not be loaded; the message says why"),
            ("504", "The page did not load within the timeout"),
        ),
    ),
    Operation(
        "POST",
        "/v1/browser/interactions/navigate",
        "coderunner: load a page and return its visible text",
        description=COMPAT_BROWSER_TEXT,
        body=s.CompatBrowserRequest,
        body_required=False,
        any_body=True,
        ok=(200, s.CompatNavigateResponse),
        error_model=s.CompatNavigateResponse,
    ),
    Operation(
        "POST",
        "/v1/browser/interactions/content",
        "coderunner: load a page and return its readable content",
        description=COMPAT_BROWSER_TEXT,
        body=s.CompatBrowserRequest,
        body_required=False,
        any_body=True,
        ok=(200, s.CompatContentResponse),
        error_model=s.CompatContentResponse,
    ),
    Operation(
        "POST",
        "/execute",
        "coderunner: run code",
        body=s.CompatExecuteRequest,
        ok=(200, s.CompatExecuteResponse),
        error_model=s.CompatExecuteResponse,
    ),
    Operation(
        "POST",
        "/v1/sessions/session",
        "coderunner: create a session",
        body=s.CompatSessionRequest,
        body_required=False,
        ok=(201, s.CompatSession),
        error_model=s.CompatError,
    ),
    Operation(
        "GET",
        "/v1/sessions/session",
        "coderunner: get one session (or list them all)",
        ok=(200, s.CompatSessionOrList),
        query=(("session_id", ID_Q, False),),
        error_model=s.CompatError,
    ),
    Operation(
        "DELETE",
        "/v1/sessions/session",
        "coderunner: stop a session",
        description="coderunner's clients may give `session_id` in a JSON body instead of "
        "the query; the query wins when both are given, and a body given is checked either way.",
        body=s.CompatSessionRequest,
        body_required=False,
        ok=(200, s.CompatSession),
        query=(("session_id", ID_Q, True),),
        error_model=s.CompatError,
    ),
)

ERRORS = {
    "400": "Malformed input",
    "401": "Missing or wrong token",
    "403": "Not allowed",
    "404": "Not found",
    "409": "Conflict",
    "413": "Too large",
    "421": "Foreign Host",
    "422": "Invalid fields",
    "429": "A limit was reached",
    "503": "Unavailable",
    "507": "No space left where the server keeps its state",
}


# Answered by the guard and the body limit before any route runs, always in corral's shape.
GUARD_CODES = frozenset({"401", "413", "421"})
# Answered by the guard (403 Origin, 503 no token) or by the route, in the route's shape.
SHARED_CODES = frozenset({"403", "503"})


def document() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document."""
    paths: dict[str, dict[str, Any]] = {}
    models: dict[str, Any] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, models)
    _check_links()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "corral",
            "version": __version__,
            "description": "Sandboxed code execution for AI agents.",
        },
        "paths": paths,
        "components": {
            "schemas": models,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-API-Key",
                    "description": "The same token, as the InstaVM SDK sends it; read only "
                    "when the request has no Authorization header.",
                },
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }


def _operation(op: Operation, models: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"summary": op.summary, "operationId": _operation_id(op)}
    if op.description:
        spec["description"] = op.description
    parameters = [_path_param(name) for name in _path_names(op.path)]
    parameters += [
        {"name": name, "in": "query", "required": required, "schema": schema}
        for name, schema, required in op.query
    ]
    if parameters:
        spec["parameters"] = parameters
    if op.body is not None:
        body = _schema(op.body, models)
        if op.any_body:
            body = {"anyOf": [body, {"description": "anything else: answered as an error"}]}
        spec["requestBody"] = {"required": op.body_required, "content": {JSON: {"schema": body}}}
    elif op.raw_body:
        spec["requestBody"] = {
            "required": op.body_required,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    spec["responses"] = _responses(op, models)
    if op.open:
        spec["security"] = []
    return spec


def _responses(op: Operation, models: dict[str, Any]) -> dict[str, Any]:
    status, model = op.ok
    ok: dict[str, Any] = {"description": "Success"}
    if op.raw_response:
        ok["content"] = {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
        }
    elif op.stream:
        ok["content"] = {
            "text/event-stream": {"schema": SSE_EVENT},
            "application/x-ndjson": {"schema": NDJSON_STREAM},
        }
    elif status != 204:
        schema = _schema(model, models) if model is not None else {"type": "object"}
        ok["content"] = {JSON: {"schema": schema}}
    route_error = _schema(op.error_model, models)
    guard_error = _schema(s.ErrorResponse, models)
    if op.headers:
        ok["headers"] = op.headers
    if op.links:
        ok["links"] = {
            name: {"operationId": target, "parameters": dict(parameters)}
            for name, target, parameters in op.links
        }
    responses = {str(status): ok}
    coderunner = op.path in compat.PATHS
    for code, text in (*ERRORS.items(), *op.extra_errors):
        if coderunner and code == "421":
            continue  # coderunner's paths refuse a foreign Host with its 403
        if coderunner and code == "403":
            schema = {"anyOf": [_schema(s.CompatError, models), guard_error]}
            text = "Not allowed (a foreign Host or Origin: coderunner's body)"
        elif code in GUARD_CODES:
            schema = guard_error
        elif code in SHARED_CODES and route_error != guard_error:
            schema = {"anyOf": [route_error, guard_error]}
        else:
            schema = route_error
        responses[code] = {"description": text, "content": {JSON: {"schema": schema}}}
    return responses


def _schema(model: type[BaseModel] | None, models: dict[str, Any]) -> dict[str, Any]:
    if model is None:
        return {"type": "object"}
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        models[name] = definition
    models[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def _path_param(name: str) -> dict[str, Any]:
    schema = {"rid": ID_NUMBER_Q, "eid": EXECUTION_ID_P}.get(
        name, {"type": "string", "pattern": s.SESSION_ID_PATTERN}
    )
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
    }


def _check_links() -> None:
    """Every link names an operation of this document (ids are written by hand in links)."""
    ids = {_operation_id(op) for op in OPERATIONS}
    for op in OPERATIONS:
        for name, target, _ in op.links:
            if target not in ids:
                raise ValueError(f"link {name} of {op.method} {op.path}: no operation {target}")


def _operation_id(op: Operation) -> str:
    words = [w.strip("{}") for w in op.path.strip("/").replace(".", "_").split("/") if w]
    return "_".join([op.method.lower(), *words])
