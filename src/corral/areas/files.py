"""Sessions' workspaces as the file API sees them: listed, read, written within the
session's workspace limit, deleted (`corral.files.Workspace` does the descriptor-safe part)."""

from __future__ import annotations

from corral.errors import CorralError, StorageFull
from corral.files import FileEntry, Listing, Workspace
from corral.kernels.sessions import SessionManager
from corral.sandbox.limits import format_size


class FileService:
    """The files of every session's workspace; `max_file_bytes` caps one read or write."""

    def __init__(self, sessions: SessionManager, max_file_bytes: int) -> None:
        self.sessions = sessions
        self.max_file_bytes = max_file_bytes

    def workspace(self, session_id: str | None) -> Workspace:
        """The file API of a session's workspace (the default session's when None)."""
        info = self.sessions.session_for(session_id).info()
        return Workspace(info.workspace, max_file_bytes=self.max_file_bytes)

    def list(self, session_id: str | None, path: str = ".", *, recursive: bool = False) -> Listing:
        return self.workspace(session_id).list(path, recursive=recursive)

    def read(self, session_id: str | None, path: str) -> bytes:
        return self.workspace(session_id).read(path)

    def write(self, session_id: str | None, path: str, data: bytes) -> FileEntry:
        """Write a workspace file; refused (`StorageFull`) when it would take the session
        past its workspace limit."""
        session = self.sessions.session_for(session_id)
        workspace = self.workspace(session_id)
        replaced = _size_of_file(workspace, path)  # an overwrite frees what it replaces
        room_bytes, room_files = session.disk.room()
        if len(data) - replaced > room_bytes or (replaced == 0 and room_files < 1):
            limits = session.limits
            raise StorageFull(
                f"{path!r} ({format_size(len(data))}) does not fit: the workspace holds at most "
                f"{format_size(limits.workspace_bytes)} and {limits.workspace_files} files, "
                f"and {format_size(max(0, room_bytes))} are left; delete files to make room"
            )
        entry = workspace.write(path, data)
        session.disk.added(len(data) - replaced)
        return entry

    def delete(self, session_id: str | None, path: str, *, recursive: bool = False) -> None:
        self.workspace(session_id).delete(path, recursive=recursive)
        self.sessions.session_for(session_id).disk.look_soon()


def _size_of_file(workspace: Workspace, path: str) -> int:
    """The size of the regular file at `path`, or 0 (none there, or not a file: the write
    itself refuses what it must)."""
    try:
        entry = workspace.stat(path)
    except CorralError:
        return 0
    return entry.size_bytes if entry.kind == "file" else 0
