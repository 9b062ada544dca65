"""The one API of corral: REST, MCP and the CLI are thin callers of `Service`.

It owns the session manager and turns its lifecycle into an async context manager.
Errors it raises are `corral.errors` classes; the edges map them to their own forms.
"""

from __future__ import annotations

from types import TracebackType

from corral.config import Settings
from corral.kernels.execute import OutputHook
from corral.kernels.results import ExecutionResult
from corral.kernels.sessions import SessionInfo, SessionManager


class Service:
    """Sessions and execution for one corral server (or one CLI command)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sessions = SessionManager(settings)

    async def __aenter__(self) -> Service:
        await self.sessions.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.sessions.close()

    async def execute(
        self,
        code: str,
        *,
        session_id: str | None = None,
        language: str = "python",
        timeout_s: float | None = None,
        on_output: OutputHook | None = None,
    ) -> ExecutionResult:
        """Run code in a session (the default one when `session_id` is None)."""
        return await self.sessions.execute(
            session_id, code, language=language, timeout_s=timeout_s, on_output=on_output
        )

    async def create_session(self, session_id: str | None = None) -> SessionInfo:
        return await self.sessions.create(session_id)

    async def start_session(self, session_id: str) -> SessionInfo:
        return await self.sessions.start(session_id)

    def list_sessions(self) -> list[SessionInfo]:
        return self.sessions.list_sessions()

    def get_session(self, session_id: str) -> SessionInfo:
        return self.sessions.get(session_id)

    async def stop_session(self, session_id: str) -> SessionInfo:
        return await self.sessions.stop(session_id)

    async def restart_session(self, session_id: str) -> SessionInfo:
        return await self.sessions.restart(session_id)

    async def delete_session(self, session_id: str) -> None:
        await self.sessions.delete(session_id)
