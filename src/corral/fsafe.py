"""File access that never follows a symbolic link: the one place corral opens untrusted trees.

The sandbox can write its workspace and a read-write project, and anyone may write the user
skills folder, while the server may run as root. So such trees are never resolved by name
and then opened: a path is walked one component at a time from a directory descriptor, each
directory opened with `O_DIRECTORY | O_NOFOLLOW`, and a file is opened with `O_NOFOLLOW |
O_NONBLOCK` (a FIFO swapped in never blocks) and checked on its descriptor. There is then no
check-then-use race to win: a link swapped in between two calls is refused, not followed.
`remove_tree` deletes a directory the same way: a link in it is unlinked, never entered.

Callers: `files` (the workspace API), `protect` (the overlay sync), `skills` (the
catalog and the archive unpacker), `kernels.projects` (mount points), `tokens` and
`kernels.sandbox` (private directories).

Errors, each an `UnsafePath` (an `InvalidInput`) with `parts`, the path up to the offending
component, and a fixed message; callers translate them into the errors their APIs promise:
    BadComponent   an empty, '.', '..', NUL-containing or '/'-containing component (so
                   `parts_of` refuses an absolute path)
    LinkRefused    a symbolic link where a directory or a file is wanted
    NotRegular     a directory or a special file (FIFO, socket, device) where a file is wanted
    NotPrivate     a private directory that is a link, not a directory, owned by another
                   user than the effective one, or writable by its group or others
A missing component (`FileNotFoundError`) and a file where a directory is wanted
(`NotADirectoryError`) propagate as the `OSError`s they are: each caller has its own words for
"not found".
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from corral.errors import InvalidInput

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
TRUSTED_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # a path corral itself chose
PRIVATE_MODE = 0o700

Kind = Literal["file", "dir", "link", "other"]


class UnsafePath(InvalidInput):
    """A path refused because following it could leave the tree; `parts` names where."""

    def __init__(self, parts: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.parts = tuple(parts)

    @property
    def where(self) -> str:
        return "/".join(self.parts)


class BadComponent(UnsafePath):
    def __init__(self, parts: Sequence[str]) -> None:
        super().__init__(parts, f"{'/'.join(parts)!r}: a component is empty, '.', '..' or odd")


class LinkRefused(UnsafePath):
    def __init__(self, parts: Sequence[str]) -> None:
        super().__init__(parts, f"{'/'.join(parts)!r} is a symbolic link; it is not followed")


class NotRegular(UnsafePath):
    """`mode` is the offending entry's; `is_dir` tells a directory from a special file."""

    def __init__(self, parts: Sequence[str], mode: int) -> None:
        where = "/".join(parts)
        super().__init__(parts, f"{where!r} is {describe(mode)}, not a regular file")
        self.mode = mode

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class NotPrivate(UnsafePath):
    def __init__(self, path: Path, why: str) -> None:
        super().__init__((str(path),), f"{str(path)!r} is not a private directory: it {why}")
        self.why = why


# -- what a mode is --------------------------------------------------------------------------


def kind_of(mode: int) -> Kind:
    """What an `lstat` mode is: a file, a directory, a link, or something else."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def describe(mode: int) -> str:
    """A mode in words with its article: 'a FIFO', 'a directory', ..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a file of an unknown type"


def lstat_at(parent: int | None, name: str | Path) -> os.stat_result | None:
    """The lstat of `name` in directory `parent` (or of a path); None when there is none."""
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def lstat_kind(path: Path) -> Kind | None:
    """The kind of `path` itself (a link is a link), or None when nothing is there."""
    info = lstat_at(None, path)
    return None if info is None else kind_of(info.st_mode)


# -- opening ---------------------------------------------------------------------------------


@contextlib.contextmanager
def closing(fd: int) -> Iterator[int]:
    """Close descriptor `fd` when the block ends."""
    try:
        yield fd
    finally:
        os.close(fd)


def check_component(name: str, where: Sequence[str] = ()) -> None:
    """Refuse (`BadComponent`) a name that is not exactly one entry of a directory."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise BadComponent((*where, name))


def parts_of(path: str) -> tuple[str, ...]:
    """The components of relative path `path` ('a/b' is ('a', 'b')); `BadComponent` for an
    absolute path, an empty one, or an empty, '.' or '..' component."""
    parts = tuple(path.split("/"))
    for index, name in enumerate(parts):
        check_component(name, parts[:index])
    return parts


def open_dir_at(parent: int | None, name: str | Path, where: Sequence[str] = ()) -> int:
    """A descriptor of directory `name` in `parent` (or of a path), its last part no link.

    `where` is the path walked so far, for the error. Raises `LinkRefused` for a link,
    `NotADirectoryError` for anything else that is not a directory, `FileNotFoundError`.
    """
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        info = lstat_at(parent, name)
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise LinkRefused((*where, str(name))) from None
        raise


def open_child_dir(parent: int, name: str, where: Sequence[str] = (), *, mode: int) -> int:
    """`open_dir_at`, making the directory first (exactly `mode`, whatever the umask)."""
    try:
        return open_dir_at(parent, name, where)
    except FileNotFoundError:
        pass
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:  # made meanwhile: open whatever is there now, links refused
        return open_dir_at(parent, name, where)
    fd = open_dir_at(parent, name, where)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def walk(
    root: Path | int, parts: Sequence[str], *, create_mode: int | None = None
) -> Iterator[int]:
    """A descriptor of directory `root/parts...`, closed when the block ends.

    `root` is trusted (a path is followed, a descriptor is duplicated); no part may be a
    link. With `create_mode`, missing directories are made with that mode.
    """
    fd = os.dup(root) if isinstance(root, int) else os.open(root, TRUSTED_DIR_FLAGS)
    try:
        for index, name in enumerate(parts):
            where = tuple(parts[:index])
            check_component(name, where)
            if create_mode is None:
                child = open_dir_at(fd, name, where)
            else:
                child = open_child_dir(fd, name, where, mode=create_mode)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def open_file_at(parent: int, name: str, where: Sequence[str] = ()) -> int:
    """A read-only descriptor of regular file `name` in `parent`; never blocks.

    The lstat spares a special file an open (a device's driver is never woken); the check of
    the open descriptor is the one that counts. Raises `LinkRefused`, `NotRegular`,
    `FileNotFoundError`.
    """
    parts = (*where, name)
    check_component(name, where)
    require_regular_mode(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode, parts)
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO):  # ENXIO: a socket swapped in
            raise
        info = lstat_at(parent, name)
        require_regular_mode(stat.S_IFSOCK if info is None else info.st_mode, parts)
        raise
    try:
        require_regular(fd, parts)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file_beneath(root: Path | int, parts: Sequence[str]) -> int:
    """A read-only descriptor of regular file `root/parts...`, no link followed on the way."""
    if not parts:
        raise BadComponent(())
    with walk(root, parts[:-1]) as parent:
        return open_file_at(parent, parts[-1], tuple(parts[:-1]))


def require_regular_mode(mode: int, parts: Sequence[str]) -> None:
    """Raise `LinkRefused` or `NotRegular` unless `mode` is a regular file's."""
    if stat.S_ISLNK(mode):
        raise LinkRefused(parts)
    if not stat.S_ISREG(mode):
        raise NotRegular(parts, mode)


def require_regular(fd: int, parts: Sequence[str] = ()) -> os.stat_result:
    """The fstat of `fd`, which must be a regular file (`NotRegular` otherwise)."""
    info = os.fstat(fd)
    require_regular_mode(info.st_mode, parts)
    return info


def require_dir(fd: int, parts: Sequence[str] = ()) -> os.stat_result:
    """The fstat of `fd`, which must be a directory (`NotADirectoryError` otherwise)."""
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/".join(parts))
    return info


# -- private directories ---------------------------------------------------------------------


def private_dir(path: Path) -> None:
    """Make sure `path` is a directory only the effective user can use, creating it if missing.

    Missing parents are made 0700 too. An existing directory must be a real directory (no
    link) owned by the effective uid (the one new files get) and not writable by its group or
    others (they could have planted entries already); read and search bits for them are
    removed. Raises `NotPrivate` otherwise.
    """
    path.parent.mkdir(mode=PRIVATE_MODE, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, PRIVATE_MODE)
    try:
        fd = open_dir_at(None, path)
    except LinkRefused:
        raise NotPrivate(path, "is a symbolic link") from None
    except NotADirectoryError:
        raise NotPrivate(path, "is not a directory") from None
    with closing(fd):
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise NotPrivate(path, f"is owned by uid {info.st_uid}, not {os.geteuid()}")
        if info.st_mode & 0o022:
            raise NotPrivate(path, "is writable by its group or others")
        if stat.S_IMODE(info.st_mode) != PRIVATE_MODE:
            os.fchmod(fd, PRIVATE_MODE)


# -- removing --------------------------------------------------------------------------------


def remove_tree(parent: int, name: str) -> None:
    """Remove directory `name` of `parent` and all it holds, following no link.

    Depth costs no descriptors and no recursion: each pass over the top directory unlinks its
    non-directories, removes its empty directories and moves the children of the others up
    into it, until it is empty. Interrupted, the tree is left with some names moved up.
    Raises `LinkRefused` when `name` itself is a link (a link inside is unlinked, as a name).
    """
    with closing(open_dir_at(parent, name)) as top:
        while _remove_one_level(top):
            pass
    os.rmdir(name, dir_fd=parent)


def _remove_one_level(top: int) -> bool:
    """One pass of `remove_tree`; False when `top` was already empty."""
    seen = False
    with os.scandir(top) as it:
        for item in it:
            seen = True
            if not item.is_dir(follow_symlinks=False):
                _unlink_quietly(top, item.name)
            elif not _rmdir_if_empty(top, item.name):
                _hoist_children(top, item.name)
    return seen


def _hoist_children(top: int, name: str) -> None:
    """Unlink the non-directories of `name` and move its directories up into `top`."""
    with closing(open_dir_at(top, name)) as sub, os.scandir(sub) as it:
        for item in it:
            if item.is_dir(follow_symlinks=False):
                fresh = f".corral-rm-{secrets.token_hex(8)}"
                os.rename(item.name, fresh, src_dir_fd=sub, dst_dir_fd=top)
            else:
                _unlink_quietly(sub, item.name)


def _rmdir_if_empty(parent: int, name: str) -> bool:
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        if exc.errno == errno.ENOENT:
            return True
        if exc.errno == errno.ENOTDIR:  # swapped for a file or a link meanwhile
            _unlink_quietly(parent, name)
            return True
        raise
    return True


def _unlink_quietly(parent: int, name: str) -> None:
    """Unlink `name` (never following it); already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=parent)
