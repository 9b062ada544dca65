"""One declaration per REST operation, from which its route and its OpenAPI entry both come.

A module of routes makes an `Api` and declares each handler with it:

    api = Api()

    @api("GET", "/v1/sessions/{id}/files", "List workspace files",
         query=FilesQuery, ok=(200, FileListing))
    async def list_files(request: Request, query: FilesQuery) -> Response: ...

The declaration names the method, the path, the request's models (`body`, `query`), the
success status and model, and what else the document must say. `Api.routes()` gives the
Starlette routes; `corral.server.openapi.document` builds the document from the same
`Operation`s, so a route cannot exist undocumented, or the reverse.

Unless an operation reads its own input (`parse=False`, coderunner's routes, which answer
bad input in coderunner's shapes), the handler is called with the parsed `query` and `body`
models. What it returns, unless a `Response`, is answered with the declared success status
in the shape of the declared model (`wire`): a handler returns the service's typed objects
and never writes a wire shape by hand. Bad JSON or a bad query value is `InvalidInput`
(400), a body that does not fit its model is pydantic's `ValidationError` (422), both
mapped at the app's edge. Who may call an
operation follows from its path: `/v1/admin/` needs the admin token (`corral.server.auth`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.errors import InvalidInput
from corral.server.schemas import ErrorResponse
from corral.service import Service

Handler = Callable[..., Awaitable[Any]]
HandlerT = TypeVar("HandlerT", bound=Handler)
ModelT = TypeVar("ModelT", bound=BaseModel)
# A link from a success response to another operation: its name, the operation's id, and
# the operation's parameters as OpenAPI runtime expressions.
Link = tuple[str, str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Operation:
    """One REST operation: how it is routed, what it takes and answers, what the document
    says of it. `path` is the router's (a `{name:path}` converter allowed)."""

    method: str
    path: str
    summary: str
    handler: Handler | None = None
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    ok: tuple[int, type[BaseModel] | None] = (200, None)
    body_required: bool = True
    any_body: bool = False  # any JSON is taken; what does not fit `body` gets the error shape
    raw_body: bool = False
    raw_response: bool = False
    open: bool = False  # no token needed
    parse: bool = True  # False: the handler reads its own input (coderunner's shapes)
    error_model: type[BaseModel] = ErrorResponse
    description: str = ""  # what the schemas cannot say
    extra_errors: tuple[tuple[str, str], ...] = ()  # status and meaning, past the common ones
    headers: dict[str, Any] = field(default_factory=dict)  # of the success response
    # The success response may be a stream of events (the only form without `ok`'s model),
    # each event's data one of these models.
    stream: tuple[type[BaseModel], ...] = ()
    links: tuple[Link, ...] = ()

    @property
    def documented_path(self) -> str:
        """The path as OpenAPI writes it: `{filename}`, not the router's `{filename:path}`."""
        return "/".join(_parameter(part) for part in self.path.split("/"))

    @property
    def path_names(self) -> list[str]:
        return [part[1:-1] for part in self.documented_path.split("/") if part.startswith("{")]

    @property
    def operation_id(self) -> str:
        words = self.documented_path.strip("/").replace(".", "_").split("/")
        return "_".join([self.method.lower(), *(w.strip("{}") for w in words if w)])

    def url(
        self, params: Mapping[str, object] | None = None, query: Mapping[str, object] | None = None
    ) -> str:
        """The path of a call to this operation: `params` in its path (quoted), `query` after
        it (None values left out); what the CLI and other clients request."""
        given = dict(params or {})
        if set(given) != set(self.path_names):
            raise ValueError(f"{self.path} takes {self.path_names}, not {sorted(given)}")
        parts = []
        for part in self.path.split("/"):
            if part.startswith("{"):
                name, _, converter = part[1:-1].partition(":")
                part = quote(str(given[name]), safe="/" if converter == "path" else "")
            parts.append(part)
        path = "/".join(parts)
        present = {name: value for name, value in (query or {}).items() if value is not None}
        return f"{path}?{urlencode(present)}" if present else path

    async def endpoint(self, request: Request) -> Response:
        """Starlette's endpoint: the input parsed as declared, then the handler."""
        if self.handler is None:
            raise RuntimeError(f"{self.method} {self.path} has no handler")
        inputs: dict[str, BaseModel] = {}
        if self.parse and self.query is not None:
            inputs["query"] = parse_query(request, self.query)
        if self.parse and self.body is not None:
            inputs["body"] = await parse_body(request, self.body)
        answer = await self.handler(request, **inputs)
        return answer if isinstance(answer, Response) else self.respond(answer)

    def respond(self, value: object) -> Response:
        """`value` (a core object, or a dict of them) as the declared success model says."""
        status, model = self.ok
        if model is None:
            raise TypeError(f"{self.method} {self.path} declares no model for {value!r:.80}")
        return JSONResponse(wire(model, value), status_code=status)

    def route(self) -> Route:
        return Route(self.path, self.endpoint, methods=[self.method])


class Api:
    """The operations of one module of routes, declared with their handlers."""

    def __init__(self) -> None:
        self.operations: list[Operation] = []

    def __call__(
        self, method: str, path: str, summary: str, **options: Any
    ) -> Callable[[HandlerT], HandlerT]:
        def declare(handler: HandlerT) -> HandlerT:
            self.operations.append(Operation(method, path, summary, handler=handler, **options))
            return handler

        return declare

    def routes(self) -> list[Route]:
        return [op.route() for op in self.operations]


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def wire(model: type[BaseModel], value: object) -> dict[str, Any]:
    """`value` in the shape `model` defines on the wire: read from its attributes (a core
    dataclass) or keys, checked, and dumped as JSON values. A field the value does not have
    is left out, not defaulted, so an optional part absent from the value stays absent."""
    return model.model_validate(value, from_attributes=True).model_dump(
        mode="json", exclude_unset=True
    )


async def parse_body(request: Request, model: type[ModelT]) -> ModelT:
    """The JSON body validated against `model` (no body is `{}`); `InvalidInput` for bad
    JSON, pydantic's `ValidationError` for bad fields."""
    raw = await request.body()
    try:
        data = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the body is not valid JSON: {exc}") from exc
    return model.model_validate(data)


def parse_query(request: Request, model: type[ModelT]) -> ModelT:
    """The query string validated against `model`; `InvalidInput` saying what is wrong (a
    parameter given twice counts once, its last value; unknown ones are ignored)."""
    try:
        return model.model_validate(dict(request.query_params))
    except ValidationError as exc:
        raise InvalidInput("; ".join(_query_problem(err) for err in exc.errors())) from exc


def _query_problem(err: Any) -> str:
    """A model's own message as it wrote it; pydantic's with the parameter and its value."""
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    name = ".".join(str(part) for part in err["loc"])
    if err["type"] == "missing":
        return f"the {name!r} query parameter is required"
    return f"the query parameter {name!r}: {err['msg']} (got {err.get('input')!r:.80})"


def _parameter(part: str) -> str:
    return part.split(":", 1)[0] + "}" if part.startswith("{") and ":" in part else part
