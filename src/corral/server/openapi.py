"""The OpenAPI document of the REST API, built from the same pydantic models the routes use.

`OPERATIONS` names every REST route once; a test checks it against the app's routing table,
so a route cannot exist without being documented, or the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from corral import __version__
from corral.server import schemas as s

JSON = "application/json"


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    body: type[BaseModel] | None = None
    ok: tuple[int, type[BaseModel] | None] = (200, None)
    query: tuple[tuple[str, str, bool], ...] = field(default=())  # name, type, required
    raw_body: bool = False
    raw_response: bool = False
    open: bool = False
    admin: bool = False
    error_model: type[BaseModel] = s.ErrorResponse


OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/health", "Liveness and what works", ok=(200, s.HealthModel), open=True),
    Operation("GET", "/openapi.json", "This document", ok=(200, None)),
    Operation(
        "POST",
        "/v1/sessions",
        "Create a session",
        body=s.CreateSessionRequest,
        ok=(201, s.SessionModel),
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
        "Run code; Accept text/event-stream or application/x-ndjson streams output",
        body=s.ExecuteRequest,
        ok=(200, s.ExecutionResultModel),
    ),
    Operation(
        "POST",
        "/v1/execute",
        "Run code in a named or the default session",
        body=s.ExecuteAnyRequest,
        ok=(200, s.ExecutionResultModel),
    ),
    Operation(
        "GET",
        "/v1/sessions/{id}/files",
        "List workspace files",
        ok=(200, s.FileListing),
        query=(("path", "string", False), ("recursive", "boolean", False)),
    ),
    Operation(
        "DELETE",
        "/v1/sessions/{id}/files",
        "Delete a workspace file or directory",
        ok=(204, None),
        query=(("path", "string", True), ("recursive", "boolean", False)),
    ),
    Operation(
        "GET",
        "/v1/sessions/{id}/files/content",
        "Download a workspace file",
        query=(("path", "string", True),),
        raw_response=True,
    ),
    Operation(
        "PUT",
        "/v1/sessions/{id}/files/content",
        "Upload a workspace file (raw body)",
        ok=(201, s.FileEntryModel),
        query=(("path", "string", True),),
        raw_body=True,
    ),
    Operation(
        "GET",
        "/v1/admin/audit",
        "Page through the audit log (admin)",
        ok=(200, s.AuditPageModel),
        admin=True,
        query=(
            ("kind", "string", False),
            ("session", "string", False),
            ("before_id", "integer", False),
            ("limit", "integer", False),
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
        ok=(201, s.CompatSession),
        error_model=s.CompatError,
    ),
    Operation(
        "GET",
        "/v1/sessions/session",
        "coderunner: get one session (or list them all)",
        ok=(200, s.CompatSessionOrList),
        query=(("session_id", "string", False),),
        error_model=s.CompatError,
    ),
    Operation(
        "DELETE",
        "/v1/sessions/session",
        "coderunner: stop a session",
        ok=(200, s.CompatSession),
        query=(("session_id", "string", False),),
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
}


def document() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document."""
    paths: dict[str, dict[str, Any]] = {}
    models: dict[str, Any] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, models)
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
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _operation(op: Operation, models: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"summary": op.summary, "operationId": _operation_id(op)}
    parameters = [_path_param(name) for name in _path_names(op.path)]
    parameters += [
        {"name": name, "in": "query", "required": required, "schema": {"type": kind}}
        for name, kind, required in op.query
    ]
    if parameters:
        spec["parameters"] = parameters
    if op.body is not None:
        spec["requestBody"] = {
            "required": True,
            "content": {JSON: {"schema": _schema(op.body, models)}},
        }
    elif op.raw_body:
        spec["requestBody"] = {
            "required": True,
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
    elif status != 204:
        schema = _schema(model, models) if model is not None else {"type": "object"}
        ok["content"] = {JSON: {"schema": schema}}
    error_ref = _schema(op.error_model, models)
    responses = {str(status): ok}
    for code, text in ERRORS.items():
        responses[code] = {"description": text, "content": {JSON: {"schema": error_ref}}}
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
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": s.SESSION_ID_PATTERN},
    }


def _operation_id(op: Operation) -> str:
    words = [w.strip("{}") for w in op.path.strip("/").replace(".", "_").split("/") if w]
    return "_".join([op.method.lower(), *words])
