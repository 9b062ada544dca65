"""Request and response bodies of the REST API, validated at the edge with pydantic.

The same models produce the OpenAPI document, so the document cannot drift from what the
routes accept.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

MAX_CODE_CHARS = 1_000_000
SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExecuteRequest(Strict):
    code: str = Field(max_length=MAX_CODE_CHARS, description="The code to run, sent once.")
    language: Literal["python", "bash"] = "python"
    timeout_s: float | None = Field(default=None, gt=0, description="At most the server's cap.")


class ExecuteAnyRequest(ExecuteRequest):
    session_id: str | None = Field(
        default=None, pattern=SESSION_ID_PATTERN, description="Omitted: the default session."
    )


class CreateSessionRequest(Strict):
    id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN)


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


class SessionModel(BaseModel):
    id: str
    state: Literal["starting", "idle", "busy", "stopped", "failed"]
    created_at: float
    last_used_at: float
    kernels: list[str]


class SessionList(BaseModel):
    sessions: list[SessionModel]


class ExecutionErrorModel(BaseModel):
    ename: str
    evalue: str
    traceback: list[str]


class ExecutionResultModel(BaseModel):
    status: Literal["ok", "error", "timeout", "interrupted", "died"]
    stdout: str
    stderr: str
    results: list[dict[str, Any]] = Field(description="MIME bundles, in order.")
    error: ExecutionErrorModel | None
    execution_count: int | None
    language: str
    session_id: str
    started_at: float
    queued_s: float
    duration_s: float
    output_bytes: int
    output_truncated: bool
    output_cut_bytes: int
    kernel_restarted: bool
    message: str | None


class FileEntryModel(BaseModel):
    path: str
    kind: Literal["file", "dir", "link", "other"]
    size_bytes: int
    modified_at: float


class FileListing(BaseModel):
    entries: list[FileEntryModel]
    truncated: bool


class HealthModel(BaseModel):
    status: Literal["ok", "unavailable"]
    version: str
    checks: dict[str, str]


class AuditEntryModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: int
    at: float
    kind: str


class AuditPageModel(BaseModel):
    entries: list[AuditEntryModel]
    next_before_id: int | None


class CompatExecuteRequest(BaseModel):
    """coderunner's POST /execute: `code` or `command`, optional `session_id`."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"anyOf": [{"required": ["code"]}, {"required": ["command"]}]},
    )
    code: str | None = Field(default=None, max_length=MAX_CODE_CHARS)
    command: str | None = Field(default=None, max_length=MAX_CODE_CHARS)
    session_id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN)
    language: Literal["python", "bash"] = "python"
    timeout: float | None = Field(default=None, gt=0)


class CompatExecuteResponse(BaseModel):
    """coderunner's answer to POST /execute (errors too, with the message in `stderr`)."""

    stdout: str
    stderr: str
    execution_time: float
    cpu_time: float


class CompatSession(BaseModel):
    session_id: str
    status: Literal["active", "stopped"]
    created_at: str


class CompatSessionList(BaseModel):
    sessions: list[CompatSession]


class CompatSessionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    session_id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN)


class CompatSessionOrList(RootModel[CompatSession | CompatSessionList]):
    """GET /v1/sessions/session: one session with ?session_id=, else all of them."""


class CompatError(BaseModel):
    """coderunner's error body: a message string."""

    error: str


class NetworkPolicyRequest(Strict):
    mode: Literal["none", "allowlist", "public"]
    allow: list[str] = Field(default_factory=list, max_length=500)


class NetworkHostsRequest(Strict):
    hosts: list[str] = Field(min_length=1, max_length=100)


class NetworkAccessRequest(Strict):
    hosts: list[str] = Field(min_length=1, max_length=20)
    reason: str = Field(default="", max_length=2000)


class NetworkPolicyModel(BaseModel):
    mode: Literal["none", "allowlist", "public"]
    allow: list[str]
    stats: dict[str, int] | None = None
    tunnels_closed: int | None = None


class NetworkRequestModel(BaseModel):
    id: int
    session: str
    hosts: list[str]
    reason: str
    status: Literal["pending", "approved", "rejected"]
    created_at: float
    decided_at: float | None


class NetworkRequestList(BaseModel):
    requests: list[NetworkRequestModel]
