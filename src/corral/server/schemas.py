"""Request and response bodies of the REST API, validated at the edge with pydantic.

The same models produce the OpenAPI document, so the document cannot drift from what the
routes accept.
"""

from __future__ import annotations

import base64
import datetime
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from corral.browser.fetch import validate_url
from corral.egress.rules import parse_entry
from corral.egress.vault import NAME as SECRET_NAME
from corral.egress.vault import VARIABLE
from corral.errors import CorralError
from corral.mounts import check_name
from corral.sandbox.limits import (
    MAX_SIZE_BYTES,
    MAX_TASKS,
    MAX_WORKSPACE_FILES,
    MIN_MEMORY_BYTES,
    MIN_TASKS,
    MIN_WORKSPACE_FILES,
    parse_size,
)
from corral.server import patterns

MAX_CODE_CHARS = 1_000_000
SESSION_ID_PATTERN = patterns.SESSION_ID
TIMEOUT_TEXT = "Seconds; past the session's cap the cap applies (a timeout result says so)."


def _whole(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer; so does the edge (3.5 and "3" stay refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# The bound comes before the validator, or the document shows it as an unknown keyword.
SizeInt = Annotated[StrictInt, Field(ge=1, le=MAX_SIZE_BYTES), BeforeValidator(_whole)]
MemoryInt = Annotated[
    StrictInt, Field(ge=MIN_MEMORY_BYTES, le=MAX_SIZE_BYTES), BeforeValidator(_whole)
]
TaskCount = Annotated[StrictInt, Field(ge=MIN_TASKS, le=MAX_TASKS), BeforeValidator(_whole)]
FileCount = Annotated[
    StrictInt, Field(ge=MIN_WORKSPACE_FILES, le=MAX_WORKSPACE_FILES), BeforeValidator(_whole)
]


def _shaped(pattern: str, max_chars: int, parse: Callable[[str], object]) -> AfterValidator:
    """The check of a string the document gives `pattern` for (`_shape` says so there). One
    that does not match is refused with the reason the parser behind the edge gives for it,
    which a model can act on."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if len(value) <= max_chars and compiled.fullmatch(value):
            return value
        try:
            parse(value)
        except CorralError as exc:
            raise ValueError(str(exc)) from None
        raise ValueError(f"{value[:80]!r} is not in the form the OpenAPI document gives")

    return AfterValidator(check)


def _shape(pattern: str, max_chars: int) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "pattern": pattern, "maxLength": max_chars})


SIZE_CHARS = 40
MOUNT_CHARS = 64
SizeText = Annotated[
    StrictStr, _shaped(patterns.SIZE, SIZE_CHARS, parse_size), _shape(patterns.SIZE, SIZE_CHARS)
]
MountName = Annotated[
    StrictStr,
    _shaped(patterns.MOUNT_NAME, MOUNT_CHARS, check_name),
    _shape(patterns.MOUNT_NAME, MOUNT_CHARS),
]
HostEntry = Annotated[
    StrictStr,
    _shaped(patterns.HOST_ENTRY, patterns.HOST_ENTRY_MAX_CHARS, parse_entry),
    _shape(patterns.HOST_ENTRY, patterns.HOST_ENTRY_MAX_CHARS),
]
RuleEntry = Annotated[
    StrictStr,
    _shaped(patterns.RULE_ENTRY, patterns.RULE_ENTRY_MAX_CHARS, parse_entry),
    _shape(patterns.RULE_ENTRY, patterns.RULE_ENTRY_MAX_CHARS),
]
FetchUrl = Annotated[
    StrictStr,
    _shaped(patterns.URL, patterns.URL_MAX_CHARS, validate_url),
    _shape(patterns.URL, patterns.URL_MAX_CHARS),
]


class Strict(BaseModel):
    """A request body taken as the document states it: no unknown field, no coercion."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ExecuteRequest(Strict):
    code: str = Field(max_length=MAX_CODE_CHARS, description="The code to run, sent once.")
    language: Literal["python", "bash"] = "python"
    timeout_s: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description=TIMEOUT_TEXT
    )


class ExecuteAnyRequest(ExecuteRequest):
    session_id: str | None = Field(
        default=None, pattern=SESSION_ID_PATTERN, description="Omitted: the default session."
    )


class CreateSessionRequest(Strict):
    id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN)
    mounts: list[MountName] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"uniqueItems": True},
        description="Names of the operator's project mounts, shown at /workspace/NAME.",
    )

    @model_validator(mode="after")
    def _each_mount_once(self) -> CreateSessionRequest:
        repeated = sorted({name for name in self.mounts if self.mounts.count(name) > 1})
        if repeated:
            raise ValueError(f"mount {repeated[0]!r} is named twice")
        return self


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
    mounts: list[str] = Field(description="The project mounts of the session.")
    from_pool: bool = Field(
        description="Its python kernel was taken ready from the warm pool (no cold start)."
    )
    queued: int = Field(
        ge=0, description="Executions waiting in the session's queue behind the running one."
    )
    open: bool = Field(
        description="Started and not stopped since (coderunner's 'active'). A session stopped "
        "when idle stays open: its next call starts a kernel. `POST /v1/sessions/{id}/stop` "
        "closes it; naming it in `POST /v1/sessions` opens it again with its files."
    )


class SessionList(BaseModel):
    sessions: list[SessionModel]


class ExecutionErrorModel(BaseModel):
    ename: str
    evalue: str
    traceback: list[str]


class NetRefusalModel(BaseModel):
    target: str = Field(description="host:port the code tried to reach.")
    host: str
    rule: str = Field(description="Why the policy refused it.")


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
    limit: Literal["memory", "tasks", "disk", "time", "output"] | None = Field(
        description="The session limit that stopped or cut the code, if one did."
    )
    message: str | None
    network_refused: list[NetRefusalModel] = Field(
        description="Connections the egress proxy refused while the code ran (at most 20): "
        "ask the operator with request_network_access."
    )


class ToolExecutionModel(ExecutionResultModel):
    """An execute tool's structured result: coderunner's `result` beside corral's fields."""

    result: str = Field(
        description="coderunner's text of the result, the same as the text content: the "
        "output, stderr and text results, or the error."
    )
    results: list[dict[str, Any]] = Field(
        description="MIME bundles, in order; an image's bytes are not repeated here but "
        "named ('[sent as image content N]'): they come once, as image content."
    )


class ExecutionModel(BaseModel):
    """An execution kept by id: running, or ended within the server's keeping time."""

    id: str
    session_id: str
    state: Literal["queued", "running", "done"]
    created_at: float
    ended_at: float | None
    events: int = Field(ge=0, description="Output events kept, numbered 1 to this.")
    events_cut: bool = Field(description="Output past the kept bound was not kept.")
    failure: str | None = Field(description="Why an ended call has no result.")
    result: ExecutionResultModel | None = Field(
        default=None, description="Once it ended with one (not in a listing)."
    )


class ExecutionList(BaseModel):
    executions: list[ExecutionModel] = Field(description="Newest first, without results.")


# -- streamed events: each event's data (SSE) or, beside its `type`, its line (NDJSON) ----


class ExecutionBegunEvent(BaseModel):
    """`execution`, a stream's first event: the id to come back to the execution with."""

    model_config = ConfigDict(extra="forbid")
    id: str
    session_id: str


class OutputTextEvent(BaseModel):
    """`stdout` or `stderr`: only the joined text and the order of these events mean
    anything (the kernel may split or join output into any number of them)."""

    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=1)
    text: str


class OutputDisplayEvent(BaseModel):
    """`display`: a MIME bundle (an expression's value, a figure, HTML)."""

    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=1)
    data: dict[str, Any]


class OutputErrorEvent(BaseModel):
    """`error`: the exception the code raised."""

    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=1)
    ename: str
    evalue: str


class StreamFailureEvent(BaseModel):
    """`failure`: the call ended without a result (the stream's last event)."""

    model_config = ConfigDict(extra="forbid")
    message: str


class EventsMissedEvent(BaseModel):
    """`missed`: events past the kept bound that a reconnecting client cannot have."""

    model_config = ConfigDict(extra="forbid")
    count: int = Field(ge=1)


class SessionEventModel(BaseModel):
    """A session's status event; `kind` names it and the other fields depend on it."""

    model_config = ConfigDict(extra="allow")
    seq: int = Field(ge=1)
    kind: str
    at: float

    @model_validator(mode="before")
    @classmethod
    def _detail_beside_the_kind(cls, value: Any) -> Any:
        """The feed keeps an event's details apart; on the wire they sit beside `kind`."""
        detail = getattr(value, "detail", None)
        if detail is None:
            return value
        return {"seq": value.seq, "kind": value.kind, "at": value.at, **detail}


OUTPUT_EVENTS: dict[str, type[BaseModel]] = {
    "stdout": OutputTextEvent,
    "stderr": OutputTextEvent,
    "display": OutputDisplayEvent,
    "error": OutputErrorEvent,
}
EXECUTION_EVENTS = (
    ExecutionBegunEvent,
    OutputTextEvent,
    OutputDisplayEvent,
    OutputErrorEvent,
    StreamFailureEvent,
    ExecutionResultModel,
)
SESSION_EVENTS = (EventsMissedEvent, SessionEventModel)


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
    """One entry; the execution fields are null for every other kind."""

    model_config = ConfigDict(extra="allow")
    id: int
    at: float
    kind: str
    actor: str
    action: str
    session: str | None
    target: str | None
    detail: dict[str, Any]
    language: str | None
    code: str | None
    duration_s: float | None
    status: str | None
    output_bytes: int | None


class AuditPageModel(BaseModel):
    entries: list[AuditEntryModel]
    next_before_id: int | None


class CompatExecuteRequest(BaseModel):
    """coderunner's POST /execute: `code` or `command`, optional `session_id`."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "anyOf": [
                {"required": [name], "properties": {name: {"type": "string", "minLength": 1}}}
                for name in ("code", "command")
            ]
        },
    )
    code: str | None = Field(default=None, max_length=MAX_CODE_CHARS)
    command: str | None = Field(default=None, max_length=MAX_CODE_CHARS)
    session_id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN)
    language: Literal["python", "bash"] = "python"
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=TIMEOUT_TEXT)


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

    @model_validator(mode="before")
    @classmethod
    def _from_session(cls, value: Any) -> Any:
        """coderunner's view of a session (`SessionInfo`): `active` while it is open (even
        when its kernel was stopped for idleness: the next call starts one), `stopped` once
        it was stopped; its creation as an ISO 8601 time."""
        if not hasattr(value, "open"):
            return value
        created = datetime.datetime.fromtimestamp(value.created_at, datetime.UTC)
        shown = "active" if value.open else "stopped"
        return {"session_id": value.id, "status": shown, "created_at": created.isoformat()}


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


class CompatBrowserRequest(BaseModel):
    """coderunner's browser routes: a `url`; `session_id` and display options are accepted."""

    model_config = ConfigDict(extra="ignore")
    url: str | None = Field(default=None, max_length=8192)
    wait_timeout: int | None = Field(default=None, gt=0, description="Milliseconds.")
    include_anchors: bool = False
    max_anchors: int = Field(default=50, ge=0, le=500)


class CompatNavigateResponse(BaseModel):
    status: Literal["success", "error"]
    url: str | None = None
    title: str | None = None
    content: str | None = None
    error: str | None = None


class ReadableContent(BaseModel):
    content: str


class Anchor(BaseModel):
    href: str
    text: str


class CompatContentResponse(BaseModel):
    status: Literal["success", "error"]
    readable_content: ReadableContent | None = None
    anchors: list[Anchor] | None = None
    error: str | None = None


class FetchRequest(Strict):
    url: FetchUrl = Field(
        description="An http or https URL; an international host name in its xn-- form."
    )
    screenshot: bool = Field(default=False, description="Also return a PNG of the viewport.")
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds; past the server's cap the cap applies.",
    )


class PageModel(BaseModel):
    requested_url: str
    url: str = Field(description="The final URL, after redirects.")
    title: str
    status: int | None
    text: str = Field(description="The visible text, cut at the server's cap.")
    text_chars: int
    truncated: bool
    loaded: bool = Field(description="False: the page did not finish loading in time.")
    links: list[Anchor]
    refused: list[str] = Field(description="Connections the browsing policy refused.")
    screenshot_png_base64: str | None
    elapsed_s: float
    notes: list[str]

    @model_validator(mode="before")
    @classmethod
    def _from_page(cls, value: Any) -> Any:
        """A fetch's result as the browser gives it: the PNG's bytes as base64, and the
        notes an agent reads about what is missing."""
        if not hasattr(value, "screenshot_png"):
            return value
        shown = {name: getattr(value, name) for name in cls.model_fields if hasattr(value, name)}
        png = value.screenshot_png
        shown["screenshot_png_base64"] = base64.b64encode(png).decode("ascii") if png else None
        shown["notes"] = value.notes()
        return shown


class SkillModel(BaseModel):
    name: str
    description: str
    source: Literal["public", "user"]
    location: str = Field(description="Where the sandbox sees the skill's folder.")
    problem: str | None = Field(description="Why the skill is not usable, if it is not.")


class SetAsideModel(BaseModel):
    name: str
    reason: str


class SkillList(BaseModel):
    skills: list[SkillModel]
    set_aside: list[SetAsideModel] = Field(description="User archives refused, and why.")


class SkillInfo(SkillModel):
    content: str = Field(description="The SKILL.md text.")

    @model_validator(mode="before")
    @classmethod
    def _entry_beside_content(cls, value: Any) -> Any:
        """The catalog keeps a skill's listing entry apart from its text; the wire has one
        object."""
        entry = getattr(value, "entry", None)
        if entry is None:
            return value
        listed = {name: getattr(entry, name) for name in SkillModel.model_fields}
        return {**listed, "content": value.content}


class LimitsValues(BaseModel):
    memory_bytes: int = Field(description="Memory of the whole session, tmpfs included.")
    cpus: float
    tasks: int = Field(description="Processes and threads.")
    workspace_bytes: int = Field(description="The workspace and the package prefix.")
    tmp_bytes: int = Field(description="The size of /tmp (applies at the next start).")
    exec_timeout_s: float
    idle_timeout_s: float
    output_bytes: int
    workspace_files: int = Field(
        description="Files and directories in the workspace, the package prefix and the "
        "kernels' run directories."
    )


def _without_nulls(schema: dict[str, Any]) -> None:
    """A limit is named with a value or left out: the document offers no null."""
    schema["minProperties"] = 1
    for prop in schema["properties"].values():
        options = [o for o in prop.pop("anyOf", []) if o.get("type") != "null"]
        if options:
            prop["anyOf"] = options
        prop.pop("default", None)


class LimitsChange(Strict):
    """Only the limits to change, at least one; sizes as bytes or strings such as "1G"."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_without_nulls)

    memory_bytes: MemoryInt | SizeText | None = None
    cpus: float | None = Field(default=None, gt=0, le=1024, allow_inf_nan=False)
    tasks: TaskCount | None = None
    workspace_bytes: SizeInt | SizeText | None = None
    tmp_bytes: SizeInt | SizeText | None = None
    exec_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    idle_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    output_bytes: SizeInt | SizeText | None = None
    workspace_files: FileCount | None = None

    @model_validator(mode="before")
    @classmethod
    def _named_with_values(cls, data: Any) -> Any:
        if isinstance(data, dict):
            empty = sorted(name for name, value in data.items() if value is None)
            if empty:
                raise ValueError(f"give a value for {', '.join(empty)}, or leave it out")
            if not data:
                raise ValueError("name at least one limit to change")
        return data


class LimitsUsage(BaseModel):
    memory_bytes: int
    tasks: int
    cpu_seconds: float = Field(
        description="CPU time (user and system) used by the session's processes running now."
    )


class SessionLimitsModel(BaseModel):
    session_id: str
    limits: LimitsValues
    mechanism: Literal["cgroup2", "cgroup1", "rlimit"]
    enforcement: dict[str, str] = Field(description="What enforces each limit on this host.")
    usage: LimitsUsage | None = Field(description="While the session runs.")
    workspace_bytes_used: int | None = Field(description="At the last measurement.")
    workspace_files_used: int | None = Field(description="At the last measurement.")
    best_effort: list[str] = Field(
        description="The limits held only by a watchdog here (best effort: they may be "
        "overshot between two looks): the workspace on every host, and memory, cpu and "
        "tasks where the kernel does not enforce them."
    )
    changed_now: list[str] | None = None
    changed_at_next_start: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _changes_only_after_one(cls, value: Any) -> Any:
        """A plain look has no changed lists: they are left out, not null."""
        if not hasattr(value, "changed_now"):
            return value
        shown = {name: getattr(value, name) for name in cls.model_fields}
        if value.changed_now is None or value.changed_at_next_start is None:
            del shown["changed_now"], shown["changed_at_next_start"]
        return shown


class PoolModel(BaseModel):
    size: int = Field(ge=0, description="The configured size; 0: the pool is off.")
    target: int = Field(
        ge=0,
        description="Kernels it should hold now: fewer when the server has little room for "
        "more sessions, none once no session was started from it for its idle time.",
    )
    ready: int = Field(ge=0)
    starting: int = Field(ge=0, description="Kernels being started for it now.")
    memory_bytes: int = Field(
        ge=0, description="The ready kernels' PSS, measured as each became ready."
    )
    budget_bytes: int = Field(ge=0)
    taken: int = Field(ge=0, description="Sessions started from it since the server started.")
    missed: int = Field(ge=0, description="Sessions that found it empty and started cold.")
    failures: int = Field(ge=0, description="Kernels it could not start.")


class BridgeRequest(Strict):
    ssh_agent: StrictBool


class BridgeModel(BaseModel):
    session_id: str
    ssh_agent: bool
    active: bool = Field(description="A running bridge serves the session now.")
    restart_needed: bool


SECRET_NAME_PATTERN = f"^{SECRET_NAME.pattern}$"
SecretName = Annotated[StrictStr, Field(pattern=f"^{VARIABLE.pattern}$")]
AbsolutePath = Annotated[StrictStr, Field(pattern=r"^/", max_length=4096)]


def _no_default(schema: dict[str, Any]) -> None:
    """A field left out rather than null: the document shows no default."""
    schema.pop("default", None)


class SecretRequest(Strict):
    """Where a secret's value comes from (exactly one source) and where it may go."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"oneOf": [{"required": ["from_env"]}, {"required": ["from_file"]}]},
    )

    from_env: SecretName | SkipJsonSchema[None] = Field(
        default=None,
        description="A variable of the server's environment holding the value.",
        json_schema_extra=_no_default,
    )
    from_file: AbsolutePath | SkipJsonSchema[None] = Field(
        default=None,
        description="A file the server reads the value from.",
        json_schema_extra=_no_default,
    )
    hosts: list[HostEntry] = Field(
        min_length=1,
        max_length=50,
        description="Where the value may be sent: allowlist entries (domain, *.domain, "
        "host:port, address, range, preset).",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        for key in ("from_env", "from_file"):
            if isinstance(data, dict) and key in data and data[key] is None:
                raise ValueError(f"{key} is a string: leave it out rather than send null")
        return data

    @model_validator(mode="after")
    def _one_source(self) -> SecretRequest:
        if (self.from_env is None) == (self.from_file is None):
            raise ValueError("give exactly one of from_env and from_file")
        return self


class SecretModel(BaseModel):
    name: str
    source: Literal["env", "file"]
    location: str = Field(description="The variable's name or the file's path (never the value).")
    hosts: list[str]
    created_at: float
    sessions: list[str] = Field(description="The sessions that hold it.")


class SecretListModel(BaseModel):
    secrets: list[SecretModel]


class SecretAttachmentModel(BaseModel):
    session_id: str
    name: str
    attached: bool
    restart_needed: bool = Field(
        description="The session's kernels run: they get (or lose) the variable when they "
        "next start; the proxy applies the change from the next request."
    )


class NetworkPolicyRequest(Strict):
    mode: Literal["none", "allowlist", "public"]
    allow: list[RuleEntry] = Field(default_factory=list, max_length=500)


class NetworkHostsRequest(Strict):
    hosts: list[RuleEntry] = Field(min_length=1, max_length=100)


class NetworkAccessRequest(Strict):
    hosts: list[HostEntry] = Field(min_length=1, max_length=20)
    reason: str = Field(default="", max_length=2000)


class HeldSecretModel(BaseModel):
    name: str
    hosts: list[str]


class NetworkPolicyModel(BaseModel):
    mode: Literal["none", "allowlist", "public"]
    allow: list[str]
    stats: dict[str, int] | None = None
    tunnels_closed: int | None = None
    secrets: list[HeldSecretModel] | None = Field(
        default=None,
        description="The secrets the session holds and where each may go: the proxy reads "
        "HTTPS to those hosts (with corral's CA) to put them in; other tunnels stay opaque.",
    )

    @model_validator(mode="before")
    @classmethod
    def _policy_beside_its_numbers(cls, value: Any) -> Any:
        """The egress keeps a policy apart from its proxy's counters (`NetworkStatus`) or
        from the tunnels a change closed (`PolicyChange`); the wire has one object."""
        policy = getattr(value, "policy", None)
        if policy is None:
            return value
        shown: dict[str, Any] = {"mode": policy.mode, "allow": policy.allow}
        if (stats := getattr(value, "stats", None)) is not None:
            shown["stats"] = dict(stats)
        if (closed := getattr(value, "tunnels_closed", None)) is not None:
            shown["tunnels_closed"] = closed
        if (held := getattr(value, "secrets", None)) is not None:
            shown["secrets"] = [{"name": h.name, "hosts": list(h.hosts)} for h in held]
        return shown


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
