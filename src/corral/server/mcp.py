"""The MCP tools: coderunner's names, parameters and text, plus shell and file tools.

Each tool is a thin caller of `Service`. Text follows coderunner's conventions (the output,
`[Execution successful with no output]`, or `Error: ...`), images come back as MCP image
content beside the text, and every tool publishes an output schema for its structured result.
Long executions send progress notifications. No tool can widen a sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent
from pydantic import BaseModel

from corral import __version__, texts
from corral.browser.fetch import PageResult
from corral.errors import CorralError
from corral.files import FileEntry, Listing
from corral.kernels.results import ExecutionResult
from corral.server.operation import wire
from corral.server.progress import report_progress
from corral.server.schemas import (
    CompatSession,
    ExecutionResultModel,
    FileListing,
    PageModel,
    ToolExecutionModel,
)
from corral.server.tooldocs import (
    TOOLS,
    Base64Encoded,
    FileContent,
    FilePath,
    FolderPath,
    Hosts,
    Mounts,
    NewSessionId,
    PageUrl,
    PythonCode,
    Reason,
    Recursive,
    Screenshot,
    SessionId,
    ShellCommand,
    SkillFile,
    SkillName,
    StopSessionId,
)
from corral.service import Service
from corral.store import NetRequest

MAX_TEXT_FILE_BYTES = 1_000_000
INSTRUCTIONS = (
    "corral runs code in sandboxed, persistent Jupyter kernels. Variables persist per session; "
    "files live in /workspace. Omit session_id to use the default session. The sandbox has no "
    "network unless the operator allows it; a refusal says what to ask for."
)


class SessionViews(BaseModel):
    result: list[CompatSession]  # coderunner's shape: its clients read structuredContent.result


class WriteResult(BaseModel):
    path: str
    size_bytes: int


def build_mcp(service: Service) -> MCPServer:
    """An MCP server whose tools call `service`."""
    mcp = MCPServer("corral", version=__version__, instructions=INSTRUCTIONS)
    tools = _Tools(service)
    for name, (description, hints) in TOOLS.items():
        mcp.tool(name=name, description=description, annotations=hints)(getattr(tools, name))
    return mcp


class _Tools:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def execute_python_code(
        self, command: PythonCode, ctx: Context, session_id: SessionId = None
    ) -> Annotated[CallToolResult, ToolExecutionModel]:
        return await self._execute(command, session_id, "python", ctx)

    async def execute_shell_command(
        self, command: ShellCommand, ctx: Context, session_id: SessionId = None
    ) -> Annotated[CallToolResult, ToolExecutionModel]:
        return await self._execute(command, session_id, "bash", ctx)

    async def _execute(
        self, code: str, session_id: str | None, language: str, ctx: Context
    ) -> CallToolResult:
        try:
            # A stopped session is refused, not started again: MCP clients start and stop
            # sessions themselves, as coderunner's do (SessionClosed says how to resume).
            execution = self.service.executions.start(
                code, session_id=session_id, language=language, resume=False
            )
            every_s = self.service.settings.progress_interval_s
            result = await report_progress(execution, ctx, every_s=every_s)
        except CorralError as exc:
            # coderunner's form: the text starts with "Error:"; the flag tells clients too.
            return CallToolResult(
                content=[TextContent(type="text", text=texts.failure_text(exc))], is_error=True
            )
        except asyncio.CancelledError:  # notifications/cancelled: see corral.execution
            await execution.cancel()
            raise
        return execution_content(result)

    async def list_skills(self) -> str:
        return texts.skills_text(await self.service.skills.list())

    async def get_skill_info(self, skill_name: SkillName) -> Annotated[CallToolResult, str]:
        try:
            info = await self.service.skills.info(skill_name)
        except CorralError as exc:
            return _refused(texts.skill_error_text(exc))
        return _text_result(texts.skill_info_text(info))

    async def get_skill_file(
        self, skill_name: SkillName, filename: SkillFile
    ) -> Annotated[CallToolResult, str]:
        try:
            file = await self.service.skills.text_file(skill_name, filename)
        except CorralError as exc:
            return _refused(texts.skill_error_text(exc))
        return _text_result(texts.skill_file_text(file))

    async def navigate_and_get_all_visible_text(
        self, url: PageUrl, screenshot: Screenshot = False
    ) -> Annotated[CallToolResult, PageModel]:
        try:
            page = await self.service.browser.fetch(url, screenshot=screenshot)
        except CorralError as exc:
            text = texts.fetch_failure_text(exc)
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        return page_content(page)

    async def start_python_session(
        self, session_id: NewSessionId = None, mounts: Mounts = None
    ) -> CompatSession:
        info = await _tool_call(self.service.create_session(session_id, mounts=mounts or ()))
        return CompatSession.model_validate(info)

    async def list_python_sessions(self) -> SessionViews:
        views = [CompatSession.model_validate(i) for i in self.service.active_sessions()]
        return SessionViews(result=views)

    async def stop_python_session(self, session_id: StopSessionId) -> CompatSession:
        info = await _tool_call(self.service.stop_session(session_id, only_open=True))
        return CompatSession.model_validate(info)

    async def list_files(
        self, path: FolderPath = ".", session_id: SessionId = None, recursive: Recursive = False
    ) -> FileListing:
        listing: Listing = _sync_tool_call(
            lambda: self.service.files.list(session_id, path, recursive=recursive)
        )
        return FileListing.model_validate(listing, from_attributes=True)

    async def read_file(self, path: FilePath, session_id: SessionId = None) -> str:
        data: bytes = _sync_tool_call(lambda: self.service.files.read(session_id, path))
        if len(data) > MAX_TEXT_FILE_BYTES:
            raise ToolError(
                f"{path} is {len(data)} bytes; read_file returns at most "
                f"{MAX_TEXT_FILE_BYTES}. Use execute_python_code to process it."
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "[binary file, base64]\n" + base64.b64encode(data).decode()

    async def request_network_access(
        self, hosts: Hosts, reason: Reason, ctx: Context, session_id: SessionId = None
    ) -> NetworkRequestView:
        made: NetRequest = await _tool_call(
            self.service.network.request_access(session_id, hosts, reason)
        )
        if self.service.settings.net_elicitation:
            made = await self._ask_user(made, ctx)
        if made.status == "approved":
            message = f"Approved: {' '.join(made.hosts)} can be reached now."
        elif made.status == "rejected":
            message = "The request was rejected."
        else:
            message = (
                f"Request {made.id} is waiting for the operator, who can approve it "
                f"with 'corral net approve {made.id}'. Nothing is allowed until then."
            )
        return NetworkRequestView(id=made.id, status=made.status, hosts=made.hosts, message=message)

    async def _ask_user(self, made: NetRequest, ctx: Context) -> NetRequest:
        """Ask the human through the client (opt-in: CORRAL_NET_ELICITATION=1).

        Only for clients that show elicitations to a person; an answer from a program would
        let the agent's side grant itself access. No answer leaves the request pending.
        """
        question = (
            f"Allow sandbox session {made.session!r} to reach "
            f"{', '.join(made.hosts)}?\nReason given: {made.reason or '(none)'}"
        )
        try:
            answer = await ctx.elicit(question, AccessAnswer)
        except Exception:  # the client cannot elicit: the operator decides later
            return made
        if answer.action == "accept" and isinstance(answer.data, AccessAnswer):
            return await self.service.network.decide(made.id, answer.data.allow)
        if answer.action == "decline":
            return await self.service.network.decide(made.id, False)
        return made

    async def write_file(
        self,
        path: FilePath,
        content: FileContent,
        session_id: SessionId = None,
        base64_encoded: Base64Encoded = False,
    ) -> WriteResult:
        data = _decode_content(content, base64_encoded)
        entry: FileEntry = _sync_tool_call(lambda: self.service.files.write(session_id, path, data))
        return WriteResult(path=entry.path, size_bytes=len(data))


class AccessAnswer(BaseModel):
    allow: bool


class NetworkRequestView(BaseModel):
    id: int
    status: str
    hosts: list[str]
    message: str


def page_content(page: PageResult) -> CallToolResult:
    """The page's text (with corral's notes), its screenshot as an image, the page as data."""
    blocks: list[ContentBlock] = [TextContent(type="text", text=texts.page_text(page))]
    if page.screenshot_png is not None:
        data = base64.b64encode(page.screenshot_png).decode("ascii")
        blocks.append(ImageContent(type="image", data=data, mime_type="image/png"))
    structured = wire(PageModel, page)
    return CallToolResult(content=blocks, structured_content=structured)


def execution_content(result: ExecutionResult) -> CallToolResult:
    """coderunner's text, images as image content, and the whole result as structured content."""
    images: list[ContentBlock] = [
        ImageContent(type="image", data=bundle[mime], mime_type=mime)
        for bundle in result.results
        for mime in texts.IMAGE_TYPES
        if mime in bundle
    ]
    text = texts.tool_text(result)
    blocks: list[ContentBlock] = [TextContent(type="text", text=text), *images]
    fields = {
        **wire(ExecutionResultModel, result),
        "result": text,
        "results": _images_named(result.results),
    }
    structured = ToolExecutionModel.model_validate(fields).model_dump(mode="json")
    return CallToolResult(content=blocks, structured_content=structured)


def _images_named(bundles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bundles with each image's bytes replaced by its place among the image contents:
    a client that feeds structured content to the model would otherwise send them twice."""
    named: list[dict[str, Any]] = []
    count = 0
    for bundle in bundles:
        shown = dict(bundle)
        for mime in texts.IMAGE_TYPES:
            if mime in shown:
                count += 1
                shown[mime] = f"[sent as image content {count}]"
        named.append(shown)
    return named


def _refused(text: str) -> CallToolResult:
    """What a tool answers when it could not do what it was asked: coderunner's "Error: ..."
    text, flagged as an error (the one rule for every tool; code that ran and failed is not
    one: its result says how it ended)."""
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _text_result(text: str) -> CallToolResult:
    """A text answer as the SDK makes one for a tool returning `str`: the text, and
    `{"result": text}` as structured content (what coderunner's clients read)."""
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content={"result": text}
    )


async def _tool_call(awaitable: Any) -> Any:
    try:
        return await awaitable
    except CorralError as exc:
        raise ToolError(str(exc)) from exc


def _sync_tool_call(action: Any) -> Any:
    try:
        return action()
    except CorralError as exc:
        raise ToolError(str(exc)) from exc


def _decode_content(content: str, base64_encoded: bool) -> bytes:
    if not base64_encoded:
        return content.encode("utf-8")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ToolError(f"content is not valid base64: {exc}") from exc
