"""The workspace file API: list, read, write, delete and stat inside one session's workspace.

The REST and MCP adapters call `Workspace`. The sandbox can put anything in the workspace
(symlinks to host paths or to other sessions, FIFOs, sockets, hard links) while the server runs
as root, so every operation walks the path one component at a time with directory descriptors
(`O_NOFOLLOW | O_DIRECTORY`, through `corral.fsafe`) and never follows a link, not even the
last component; nothing is resolved by name and then opened, so there is no check-then-use
race to win.

- Reads open the final file with `O_NOFOLLOW | O_NONBLOCK` after an lstat and read only a
  regular file (the fstat of the open descriptor decides), so a FIFO or device never blocks
  or wakes a driver.
- Writes never write into an existing inode: the data goes to a new temporary file in the
  same directory, is fsynced and then renamed over the name (or linked, when overwriting is
  not allowed). A hard link or a symlink planted at the name is replaced, never written through.
- Deletes unlink names (a link itself, never its target) and remove trees with descriptors.

Errors, all from `corral.errors`:
    PathRefused              an absolute path (other than under /workspace), '..', an empty or
                             NUL-containing path, a path over 4096 bytes or a component over
                             255 bytes, a symbolic link anywhere on the path, a special file
                             read, or an operation on the workspace root that needs a file
    FileNotFoundInWorkspace  a component or the named file does not exist
    Conflict                 a directory where a file is needed or the reverse, a non-empty
                             directory deleted without `recursive`, an existing name written
                             with `overwrite=False`
    TooLarge                 a file read or written past its byte cap
    StorageFull              the filesystem holding the workspace is full (507)
Other operating-system errors are not expected and propagate unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from corral.errors import (
    Conflict,
    CorralError,
    FileNotFoundInWorkspace,
    InvalidInput,
    PathRefused,
    StorageFull,
    TooLarge,
)
from corral.fsafe import (
    CREATE_FLAGS,
    Kind,
    LinkRefused,
    NotRegular,
    UnsafePath,
    closing,
    describe,
    kind_of,
    open_dir_at,
    open_file_at,
    remove_tree,
    walk,
)
from corral.sandbox.policy import WORKSPACE

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
MAX_LIST_DEPTH = 64  # directories deeper than this are listed but not entered
FILE_MODE = 0o644
DIR_MODE = 0o755
READ_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class FileEntry:
    """One name in the workspace, described by lstat (a link is described, never followed).

    `path` is relative to the workspace root ('.' for the root itself), '/'-separated.
    """

    path: str
    kind: Kind
    size_bytes: int
    modified_at: float  # seconds since the epoch


@dataclass(frozen=True)
class Listing:
    """The entries of a listing, and whether some were left out.

    `truncated` is True when the `max_entries` cap was reached or when a recursive listing met
    directories nested deeper than `MAX_LIST_DEPTH` and did not enter them.
    """

    entries: tuple[FileEntry, ...]
    truncated: bool


class Workspace:
    """The files of one workspace directory, safe against whatever the sandbox put in it.

    `root` is trusted (corral made it); everything under it is not. Every call opens the root
    afresh, so a `Workspace` holds no descriptor and is cheap to create per request.
    `max_file_bytes` caps every read and write.
    """

    def __init__(self, root: Path, *, max_file_bytes: int = 100 * 1024 * 1024) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes

    def list(
        self, path: str = ".", *, recursive: bool = False, max_entries: int = 10_000
    ) -> Listing:
        """The entries of directory `path` ('.' or '' is the root), sorted by name per directory.

        A recursive listing walks depth first and never enters a link. At most `max_entries`
        entries are returned (see `Listing.truncated`). Raises `Conflict` if `path` is not a
        directory, and `PathRefused` / `FileNotFoundInWorkspace` as described in the module.
        """
        if max_entries < 1:
            raise InvalidInput(f"max_entries must be at least 1, not {max_entries}")
        parts = _split(path)
        with _translated(path), self._open_dir(parts) as fd:
            lister = _Lister(max_entries, recursive)
            lister.visit(fd, "/".join(parts), depth=0)
        return Listing(tuple(lister.entries), lister.truncated)

    def stat(self, path: str) -> FileEntry:
        """The entry for `path` ('.' or '' is the root); a link is described, not followed."""
        parts = _split(path)
        with _translated(path):
            if not parts:
                with self._open_dir(()) as fd:
                    return _entry(".", os.fstat(fd))
            with self._open_parent(parts) as parent:
                info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        return _entry("/".join(parts), info)

    def read(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """The whole content of regular file `path`.

        Raises `TooLarge` when the file is longer than `max_bytes` (default: `max_file_bytes`),
        before reading it; `PathRefused` for a link or a special file (FIFO, socket, device),
        which are never opened for reading; `Conflict` for a directory.
        """
        cap = self.max_file_bytes if max_bytes is None else max_bytes
        parts = _split(path)
        _require_name(parts, path)
        with (
            _translated(path),
            self._open_parent(parts) as parent,
            closing(open_file_at(parent, parts[-1], parts[:-1])) as fd,
        ):
            _check_size(path, os.fstat(fd).st_size, cap)
            return _read_at_most(fd, cap, path)

    def write(
        self, path: str, data: bytes, *, make_parents: bool = True, overwrite: bool = True
    ) -> FileEntry:
        """Replace (or create) regular file `path` with `data`, atomically, mode 0644.

        Missing parent directories are created (mode 0755) unless `make_parents` is False, when
        they raise `FileNotFoundInWorkspace`. Raises `TooLarge` past `max_file_bytes` (nothing is
        written), `PathRefused` when a link or a special file holds the name, `Conflict` when a
        directory does or when the name exists and `overwrite` is False.
        """
        parts = _split(path)
        _require_name(parts, path)
        _check_size(path, len(data), self.max_file_bytes)
        name = parts[-1]
        with _translated(path), self._open_parent(parts, create=make_parents) as parent:
            _check_replaceable(parent, name, path, overwrite=overwrite)
            temp, info = _write_temp(parent, data)
            try:
                _commit(parent, temp, name, overwrite=overwrite)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=parent)
                raise
            os.fsync(parent)
        return _entry("/".join(parts), info)

    def delete(self, path: str, *, recursive: bool = False) -> None:
        """Remove `path`: a file or a link itself (its target is untouched), or a directory.

        A directory must be empty unless `recursive` is True; then its tree is removed without
        following any link in it. Raises `PathRefused` for the workspace root itself and
        `Conflict` for a non-empty directory without `recursive`.
        """
        parts = _split(path)
        if not parts:
            raise _refused(path, "the workspace root itself cannot be deleted")
        name = parts[-1]
        with _translated(path), self._open_parent(parts) as parent:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                os.unlink(name, dir_fd=parent)
            elif recursive:
                remove_tree(parent, name)
            else:
                os.rmdir(name, dir_fd=parent)

    # -- walking ---------------------------------------------------------------------------

    def _open_dir(
        self, parts: tuple[str, ...], *, create: bool = False
    ) -> contextlib.AbstractContextManager[int]:
        """A descriptor of the directory reached by walking `parts` from the root, no links."""
        return walk(self.root, parts, create_mode=DIR_MODE if create else None)

    def _open_parent(
        self, parts: tuple[str, ...], *, create: bool = False
    ) -> contextlib.AbstractContextManager[int]:
        """A descriptor of the directory holding the last of `parts`."""
        return self._open_dir(parts[:-1], create=create)


# -- paths -----------------------------------------------------------------------------------


def _split(path: str) -> tuple[str, ...]:
    """The components of a workspace path; () for the root. Raises `PathRefused`."""
    if not isinstance(path, str):
        raise PathRefused(f"refused {path!r}: a path must be a string")
    if "\0" in path:
        raise _refused(path, "it contains a NUL byte")
    try:
        encoded = os.fsencode(path)
    except UnicodeEncodeError:
        raise _refused(path, "it cannot be encoded as a file name") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise _refused(path, f"it is longer than {MAX_PATH_BYTES} bytes")
    relative = _strip_workspace_prefix(path)
    if relative.startswith("/"):
        raise _refused(path, f"absolute paths are refused; give a path relative to {WORKSPACE}")
    parts = tuple(p for p in relative.split("/") if p not in ("", "."))
    for part in parts:
        if part == "..":
            raise _refused(path, "'..' components are refused")
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise _refused(path, f"a component is longer than {MAX_NAME_BYTES} bytes")
    return parts


def _strip_workspace_prefix(path: str) -> str:
    """`path` relative to the workspace when it starts with the sandbox's /workspace."""
    if path == WORKSPACE:
        return ""
    if path.startswith(WORKSPACE + "/"):
        return path[len(WORKSPACE) + 1 :]
    return path


def _require_name(parts: tuple[str, ...], path: str) -> None:
    if not parts:
        reason = "the path is empty" if path == "" else "it names the workspace root, not a file"
        raise _refused(path, reason)


def _refused(path: str, reason: str) -> PathRefused:
    return PathRefused(f"refused {path!r}: {reason}")


@contextlib.contextmanager
def _translated(path: str) -> Iterator[None]:
    """Turn the OSErrors and `fsafe` refusals of `path` into corral errors (others pass)."""
    try:
        yield
    except UnsafePath as exc:
        raise _map_unsafe(exc, path) from exc
    except OSError as exc:
        mapped = _map_os_error(exc, path)
        if mapped is None:
            raise
        raise mapped from exc


def _map_unsafe(exc: UnsafePath, path: str) -> CorralError:
    name = exc.parts[-1] if exc.parts else path
    if isinstance(exc, LinkRefused):
        return _refused(path, f"{name!r} is a symbolic link, and links are never followed")
    if isinstance(exc, NotRegular) and exc.is_dir:
        return Conflict(f"{path!r} is a directory, not a file")
    if isinstance(exc, NotRegular):
        return _refused(path, f"it is {describe(exc.mode)}; only regular files are read")
    return _refused(path, "a component is not a plain name")


def _map_os_error(exc: OSError, path: str) -> CorralError | None:
    name = exc.filename if isinstance(exc.filename, str) else path
    if exc.errno == errno.ENOENT:
        return FileNotFoundInWorkspace(f"no such file or directory in the workspace: {path!r}")
    if exc.errno == errno.ELOOP:
        return _refused(path, f"{name!r} is a symbolic link, and links are never followed")
    if exc.errno == errno.ENAMETOOLONG:
        return _refused(path, "a name is too long")
    if exc.errno == errno.ENOTDIR:
        return Conflict(f"{path!r}: {name!r} is not a directory")
    if exc.errno == errno.EISDIR:
        return Conflict(f"{path!r} is a directory")
    if exc.errno == errno.ENOTEMPTY:
        return Conflict(f"{path!r} is a directory that is not empty; delete it recursively")
    if exc.errno == errno.EEXIST:
        return Conflict(f"{path!r} already exists")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"no space left in the workspace to write {path!r}")
    return None


def _entry(path: str, info: os.stat_result) -> FileEntry:
    return FileEntry(path, kind_of(info.st_mode), info.st_size, info.st_mtime)


# -- reading ---------------------------------------------------------------------------------


def _check_size(path: str, size: int, cap: int) -> None:
    if size > cap:
        raise TooLarge(f"{path!r} is {size} bytes, past the cap of {cap} bytes")


def _read_at_most(fd: int, cap: int, path: str) -> bytes:
    """All of `fd`, raising `TooLarge` as soon as it goes past `cap` (a file can grow)."""
    chunks: list[bytes] = []
    total = 0
    while chunk := os.read(fd, min(READ_CHUNK_BYTES, cap + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > cap:
            raise TooLarge(f"{path!r} grew past the cap of {cap} bytes while being read")
    return b"".join(chunks)


# -- writing ---------------------------------------------------------------------------------


def _check_replaceable(parent: int, name: str, path: str, *, overwrite: bool) -> None:
    """Refuse early when `name` is a link, a special file or a directory, or exists at all
    when `overwrite` is False. Only a clear error hangs on this: a swap made after it is
    still safe, as rename replaces a link or a FIFO itself and fails on a directory."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if not overwrite:
        raise Conflict(f"{path!r} already exists")
    if stat.S_ISDIR(mode):
        raise Conflict(f"{path!r} is a directory; only a file can be written")
    if stat.S_ISLNK(mode):
        raise _refused(path, f"{name!r} is a symbolic link; links are never written through")
    if not stat.S_ISREG(mode):
        raise _refused(path, f"it is {describe(mode)}; only regular files are replaced")


def _write_temp(parent: int, data: bytes) -> tuple[str, os.stat_result]:
    """A new, fsynced file in `parent` holding `data`: its name and its stat."""
    temp = f".corral-{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, CREATE_FLAGS, FILE_MODE, dir_fd=parent)
    try:
        os.fchmod(fd, FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        info = os.fstat(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        raise
    os.close(fd)
    return temp, info


def _commit(parent: int, temp: str, name: str, *, overwrite: bool) -> None:
    """Put `temp` at `name` in one step: rename replaces, link refuses an existing name."""
    if overwrite:
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        return
    os.link(temp, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
    os.unlink(temp, dir_fd=parent)


# -- listing ---------------------------------------------------------------------------------


@dataclass
class _Lister:
    """Collects entries depth first, up to `max_entries`, never entering a link."""

    max_entries: int
    recursive: bool
    entries: list[FileEntry] = field(default_factory=list)
    truncated: bool = False

    def visit(self, fd: int, prefix: str, depth: int) -> None:
        for name, entry in self._read(fd, prefix):
            if len(self.entries) >= self.max_entries:
                self.truncated = True
                return
            self.entries.append(entry)
            if self.recursive and entry.kind == "dir":
                self._descend(fd, name, entry.path, depth + 1)

    def _descend(self, fd: int, name: str, path: str, depth: int) -> None:
        if depth > MAX_LIST_DEPTH:
            self.truncated = True
            return
        try:
            child = open_dir_at(fd, name)
        except (OSError, UnsafePath):  # removed or swapped for a link since it was read
            return
        with closing(child):
            self.visit(child, path, depth)

    def _read(self, fd: int, prefix: str) -> list[tuple[str, FileEntry]]:
        """This directory's entries sorted by name, no more than could still be returned."""
        limit = self.max_entries - len(self.entries) + 1
        found: list[tuple[str, FileEntry]] = []
        with os.scandir(fd) as it:
            for item in islice(it, limit):
                with contextlib.suppress(FileNotFoundError):
                    info = item.stat(follow_symlinks=False)
                    path = f"{prefix}/{item.name}" if prefix else item.name
                    found.append((item.name, _entry(path, info)))
        return sorted(found, key=lambda pair: pair[0])
