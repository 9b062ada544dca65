"""The OpenAPI document of the REST API, built from the operations' declarations.

Each `Operation` (`corral.server.operation`) is declared once, beside its handler; its
route and its entry here both come from it, and every schema comes from a pydantic model:
the bodies and responses (`corral.server.schemas`) and the query strings
(`corral.server.queries`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from corral import __version__
from corral.server import compat
from corral.server import schemas as s
from corral.server.operation import Operation
from corral.server.rest.executions import EXECUTION_ID_PATTERN
from corral.server.routes import OPERATIONS

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
ID_NUMBER_P: dict[str, Any] = {"type": "integer", "minimum": 1}
# Path parameters by name; any other is a name of the session id's form.
PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    "rid": ID_NUMBER_P,
    "eid": {"type": "string", "pattern": EXECUTION_ID_PATTERN},
    "secret": {"type": "string", "pattern": s.SECRET_NAME_PATTERN},
}


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


def document(operations: Iterable[Operation] = OPERATIONS) -> dict[str, Any]:
    """The whole OpenAPI 3.1 document of `operations` (the server's, unless given)."""
    operations = tuple(operations)
    paths: dict[str, dict[str, Any]] = {}
    models: dict[str, Any] = {}
    for op in operations:
        paths.setdefault(op.documented_path, {})[op.method.lower()] = _operation(op, models)
    _check_links(operations)
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
    spec: dict[str, Any] = {"summary": op.summary, "operationId": op.operation_id}
    if op.description:
        spec["description"] = op.description
    parameters = [_path_param(name) for name in op.path_names]
    if op.query is not None:
        parameters += _query_parameters(op.query)
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


def _stream_content(events: tuple[type[BaseModel], ...], models: dict[str, Any]) -> dict[str, Any]:
    """An event stream's two forms; each event's data is one of `events` (OpenAPI 3.1 has
    the string's `contentSchema` say so)."""
    data = {"oneOf": [_schema(model, models) for model in events]}
    sse = copy.deepcopy(SSE_EVENT)
    sse["properties"]["data"]["contentSchema"] = data
    return {
        "text/event-stream": {"schema": sse},
        "application/x-ndjson": {"schema": NDJSON_STREAM},
    }


def _responses(op: Operation, models: dict[str, Any]) -> dict[str, Any]:
    status, model = op.ok
    ok: dict[str, Any] = {"description": "Success"}
    if op.raw_response:
        ok["content"] = {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
        }
    elif op.stream:  # a model beside: JSON unless the client asks for a stream
        whole = {JSON: {"schema": _schema(model, models)}} if model is not None else {}
        ok["content"] = {**whole, **_stream_content(op.stream, models)}
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
    coderunner = op.documented_path in compat.PATHS
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


def _path_param(name: str) -> dict[str, Any]:
    schema = PATH_PARAMETERS.get(name, {"type": "string", "pattern": s.SESSION_ID_PATTERN})
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """The model's fields as query parameters; an optional one is documented as its value's
    schema (a query string has no null: the parameter is left out)."""
    schema = model.model_json_schema()
    if "$defs" in schema:
        raise ValueError(f"{model.__name__}: a query's fields must not refer to other models")
    required = set(schema.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": _not_null(field)}
        for name, field in schema["properties"].items()
    ]


def _not_null(field: dict[str, Any]) -> dict[str, Any]:
    field = {key: value for key, value in field.items() if key != "title"}
    options = field.pop("anyOf", None)
    if options is None:
        return field
    values = [option for option in options if option != {"type": "null"}]
    if len(values) != 1:
        raise ValueError(f"a query parameter's schema must be one type: {options}")
    return {**values[0], **field}


def _check_links(operations: tuple[Operation, ...]) -> None:
    """Every link names an operation of this document (ids are written by hand in links)."""
    ids = {op.operation_id for op in operations}
    for op in operations:
        for name, target, _ in op.links:
            if target not in ids:
                raise ValueError(f"link {name} of {op.method} {op.path}: no operation {target}")
