"""Every error corral raises on purpose, one class per meaning.

    CorralError
    ├── InvalidInput            the caller sent something malformed (bad id, bad path, bad value)
    │   ├── PathRefused         a workspace path that escapes (absolute, '..', through a link)
    │   └── UnsafePath          (fsafe) a link, special file, odd name or shared directory met
    │                           on a walk; callers turn it into one of their own errors
    ├── NotFound                a named thing does not exist
    │   ├── SessionNotFound
    │   ├── MountNotFound       a session asked for a project mount nobody configured
    │   ├── ExecutionNotFound   no execution by that id is kept
    │   └── FileNotFoundInWorkspace
    ├── Conflict                the request contradicts current state
    │   ├── SessionExists
    │   ├── SessionClosed       a named session was stopped, on a route that does not resume
    │   ├── LimitRefused        (sandbox.boxes) the kernel refused a new limit
    │   ├── MountBusy           (kernels.projects) a folder is in use read-write
    │   ├── StateOwned          (owner) another process owns the state directory
    │   └── AddressInUse        the server's port is already taken
    ├── CapacityExceeded        a configured maximum was reached
    │   ├── TooManySessions
    │   ├── StorageFull         no space left for a workspace file (507)
    │   └── TooLarge            an upload, file or request body past its cap
    ├── ServerRefused           (CLI) the running server refused a call; its message
    ├── FetchFailed             a browser fetch reached no page (refused, unreachable, failed)
    │   ├── FetchRefused        ... the browsing policy refused the page's own host
    │   └── FetchTimedOut       ... or ran past its time limit
    └── SandboxError            corral itself could not do its job (never the user's code)
        ├── SandboxUnavailable  bwrap, user namespaces or seccomp are missing or refused
        │   └── ShuttingDown    the server is stopping; the call was not run (503)
        ├── StateUnavailable    the state database stayed locked or its disk is full (503)
        ├── AdmissionFailed     (sandbox.launch) a sandbox could not be put under its limits
        ├── KernelStartFailed   a kernel did not come up inside its sandbox
        ├── KernelUnreachable   a running kernel stopped answering before the code was sent
        └── ServerUnavailable   (CLI) no corral server runs, or the one named does not answer

Failures of the user's code (exceptions, timeouts, a kernel that dies while running it) are
not errors: they are results (`corral.kernels.results.ExecutionResult`). The REST, MCP and CLI
edges map these classes to their own forms; nothing else of jupyter_client, zmq or subprocess
leaks past the service.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.owner import ServerInfo


class CorralError(Exception):
    """Base of every error corral raises on purpose."""


class InvalidInput(CorralError):
    """The caller sent something malformed."""


class NotFound(CorralError):
    """A named thing does not exist."""


class MountNotFound(NotFound):
    """A session asked for a project mount the operator did not configure."""


class ExecutionNotFound(NotFound):
    """No execution by that id is kept (never made, or ended too long ago)."""


class SessionNotFound(NotFound):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"Session {session_id!r} not found.")
        self.session_id = session_id


class Conflict(CorralError):
    """The request contradicts the current state."""


class SessionExists(Conflict):
    """An open session has this id (a stopped one is started again instead)."""

    def __init__(self, session_id: str, message: str | None = None) -> None:
        super().__init__(message or f"Session {session_id!r} already exists.")
        self.session_id = session_id


class SessionClosed(Conflict):
    """A stopped session, asked for on a route that does not start it again (coderunner's)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"Session {session_id!r} is closed. Start it again to resume it with its files "
            "and installed packages (start_python_session, or POST /v1/sessions/session), "
            "or omit session_id to use the default session."
        )
        self.session_id = session_id


class CapacityExceeded(CorralError):
    """A configured maximum was reached."""


class StorageFull(CapacityExceeded):
    """The filesystem holding the workspace has no space left."""


class TooManySessions(CapacityExceeded):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the maximum of {limit} running sessions is reached; stop one "
            "(corral sessions stop ID) or raise CORRAL_MAX_SESSIONS"
        )
        self.limit = limit


class SandboxError(CorralError):
    """corral itself could not do its job."""


class SandboxUnavailable(SandboxError):
    """bwrap, user namespaces or seccomp are missing or refused on this host."""


class StateUnavailable(SandboxError):
    """The state database stayed locked or its disk is full: try again later."""


class ShuttingDown(SandboxUnavailable):
    """The server is stopping: the call was not run; send it again once the server is back."""


class AdmissionFailed(SandboxError):
    """A sandbox could not be put under its limits before it ran; nothing of it runs."""


class KernelStartFailed(SandboxError):
    """A kernel did not come up inside its sandbox."""


class KernelUnreachable(SandboxError):
    """A kernel stopped answering before the code was sent to it."""


class StateOwned(Conflict):
    """Another process holds the state directory's lock (`corral.owner`)."""

    def __init__(self, state_dir: Path, pid: int | None, server: ServerInfo | None) -> None:
        who = f"corral pid {pid}" if pid is not None else "another corral process"
        where = f"serving {server.url}" if server is not None else "serving no HTTP API"
        super().__init__(f"the state in {state_dir} is owned by {who}, {where}")
        self.state_dir = state_dir
        self.pid = pid
        self.server = server


class AddressInUse(Conflict):
    def __init__(self, host: str, port: int) -> None:
        super().__init__(
            f"{host}:{port} is already in use; stop what listens there or pass --port N"
        )
        self.host = host
        self.port = port


class ServerUnavailable(SandboxError):
    """The CLI found no running server for the state (or the one named does not answer)."""


class ServerRefused(CorralError):
    """The running server answered a CLI call with an error; the message is the server's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class PathRefused(InvalidInput):
    """A workspace path that is absolute, climbs out with '..', or goes through a link."""


class FileNotFoundInWorkspace(NotFound):
    """No such file or directory in the session's workspace."""


class TooLarge(CapacityExceeded):
    """An upload, a file or a request body is past its size cap."""


class BodyTimedOut(CorralError):
    """A request body stopped arriving, or took longer than its time bound."""


class FetchFailed(CorralError):
    """A browser fetch reached no page: refused by the browsing policy, unreachable, or the
    browser failed. The message says which."""


class FetchRefused(FetchFailed):
    """The browsing policy refused the page's own host: the operator's to change."""


class FetchTimedOut(FetchFailed):
    """A browser fetch ran past its time limit; the browser was stopped."""
