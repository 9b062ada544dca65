"""The query strings of the REST API, one pydantic model per operation that takes one.

`corral.server.operation` validates a request's query against its operation's model and the
OpenAPI document lists the model's fields as the operation's query parameters, so what the
document promises and what the route accepts are one declaration. A refusal a model words
itself (a `ValueError` below) reaches the client as written.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, WithJsonSchema

from corral.audit import KINDS, MAX_QUERY_LIMIT
from corral.errors import InvalidInput
from corral.server.patterns import SESSION_ID

ARCHIVE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,123}\.zip")


def _not_empty(path: str) -> str:
    if not path:
        raise ValueError("the 'path' query parameter is empty: use '.' for /workspace itself")
    return path


def _known_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown audit kind {kind!r}; expected one of {', '.join(KINDS)}")
    return kind


def _within_page(limit: int) -> int:
    if limit > MAX_QUERY_LIMIT:
        raise ValueError(f"limit must be at most {MAX_QUERY_LIMIT}, not {limit}")
    return limit


def _archive_name(name: str) -> str:
    if not ARCHIVE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a skill archive's file name (NAME.zip)")
    return name


WorkspacePath = Annotated[
    str,
    AfterValidator(_not_empty),
    WithJsonSchema({"type": "string", "minLength": 1}),
    Field(description="Relative to /workspace."),
]
Recursive = Annotated[bool, Field(description="Into directories too.")]
SessionId = Annotated[str, Field(pattern=SESSION_ID)]
AuditKind = Annotated[
    str, AfterValidator(_known_kind), WithJsonSchema({"type": "string", "enum": list(KINDS)})
]
PageLimit = Annotated[
    int,
    Field(ge=1),
    AfterValidator(_within_page),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_QUERY_LIMIT}),
]
ArchiveName = Annotated[
    str,
    AfterValidator(_archive_name),
    WithJsonSchema({"type": "string", "pattern": f"^{ARCHIVE_NAME.pattern}$"}),
]
EventNumber = Annotated[int, Field(ge=0, description="The last event number seen.")]


class FilesQuery(BaseModel):
    path: WorkspacePath = "."
    recursive: Recursive = False


class FileQuery(BaseModel):
    path: WorkspacePath


class FileDeleteQuery(BaseModel):
    path: WorkspacePath
    recursive: Recursive = False


class EventsQuery(BaseModel):
    after: EventNumber | None = None  # None: the SSE Last-Event-ID header, else 0


class ExecutionsQuery(BaseModel):
    session_id: SessionId | None = None


class AuditQuery(BaseModel):
    kind: AuditKind | None = None
    session: str | None = None
    before_id: Annotated[int, Field(ge=1)] | None = None
    limit: PageLimit = 100


class NetworkRequestsQuery(BaseModel):
    status: Literal["pending", "approved", "rejected"] | None = None


class SkillArchiveQuery(BaseModel):
    name: ArchiveName = "skill.zip"


class CompatSessionQuery(BaseModel):
    """coderunner's GET: one session, or every session without `session_id`."""

    session_id: SessionId | None = None


class CompatStopQuery(BaseModel):
    """coderunner's DELETE: its clients may send `session_id` in the body instead."""

    session_id: SessionId


def int_param(raw: str | None, default: int) -> int:
    """A path parameter or header that must be a whole number; `default` when absent."""
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise InvalidInput(f"{raw!r} is not a whole number") from exc
