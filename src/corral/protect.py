"""Files inside a read-write project mount that the host later executes or trusts.

A sandbox that can write a project could plant a git hook, a `core.fsmonitor` line in
`.git/config`, or an editor/agent setting that runs a command, and the host would run it the
next time the developer uses the project. So, for a read-write mount:

1. `scan` walks the project once on the host, before the session starts, and lists what to
   protect: in every git directory (`.git` of the top repository and of nested or vendored
   ones, each `.git/modules/**` module, each bare-looking repository) its `config`,
   `config.worktree` and `commondir` (read-only copies), its `hooks` (a throw-away copy) and
   each `worktrees/*/commondir` and `config.worktree`; every `.git` file (a submodule or worktree
   pointer, read-only); and the protected names (`DEFAULT_PROTECTED` plus the operator's
   extras) relative to the mount root (writable copies). A protected path that goes through a
   symbolic link, or an item of the wrong type, is refused: a mount point is only ever made at
   a path the host verified to be reachable through real directories.
2. `prepare` makes per-session copies in a server-owned directory, opening every source
   component by component with `O_NOFOLLOW` (a link swapped in after the scan is refused, not
   followed), and fingerprints each copy. The caller bind-mounts each copy over its `rel`.
3. `changes`, at session end, names the protected files the sandbox changed or created: copies
   whose fingerprint moved, hooks added, removed or changed, and, from a fresh scan, protected
   items that appeared, disappeared, were replaced, or turned into a link or another type.

Nothing here follows a symbolic link. Every walk is bounded (entries, depth, one filesystem).

Names in messages and reports pass through `escape_name`: printable ASCII stays, non-ASCII
letters, marks and digits stay, a backslash becomes two, an undecodable byte and an ASCII
control character become `\\xNN`, and any other character becomes `\\uNNNN` (or
`\\UNNNNNNNN`). So a file named "a<newline>b" is reported as `a\\x0ab`; the mapping is one to
one, and a report can never move the cursor or fake a line.

Errors: `ProtectionRefused` (an `InvalidInput`) for a refused project; `InvalidInput` for a bad
extra name. Other operating-system errors propagate.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from corral.errors import InvalidInput
from corral.fsafe import Kind as FileType
from corral.fsafe import kind_of

DEFAULT_PROTECTED = (
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".mcp.json",
    ".vscode/settings.json",
    ".vscode/tasks.json",
    ".envrc",
)
MAX_DEPTH = 64  # directories nested deeper are not entered (the plan is then incomplete)
MAX_COPY_BYTES = 64 * 1024 * 1024  # a protected file larger than this is refused
MAX_HOOK_ENTRIES = 10_000  # entries in one hooks directory copied at most
FICLONE = 0x40049409  # _IOW(0x94, 9, int): share the extents of another file (reflink)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_REFLINK = frozenset({errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY})
_NO_COPY_RANGE = frozenset({errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOSYS})
_GONE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})
_CHUNK_BYTES = 1024 * 1024
_STRICTNESS = {"readonly": 0, "hooks": 1, "copy": 2}

Kind = Literal["readonly", "hooks", "copy"]

_LINK_FILE = "is a symbolic link; protected files must be regular files (review it on the host)"
_LINK_DIR = (
    "is a symbolic link; a protected path must go through real directories only "
    "(review it on the host)"
)
_LINK_HOOKS = "is a symbolic link; hooks must be a real directory (review it on the host)"


class ProtectionRefused(InvalidInput):
    """A project cannot be mounted read-write: a protected path is a link or of the wrong type."""


@dataclass(frozen=True)
class Stamp:
    """What a protected path was when scanned (from lstat; a link is described, not followed)."""

    type: FileType
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> Stamp:
        return cls(
            kind_of(info.st_mode),
            info.st_dev,
            info.st_ino,
            info.st_size,
            info.st_mtime_ns,
            info.st_ctime_ns,
        )

    def same(self, other: Stamp) -> bool:
        """Same object, untouched. A directory counts as the same while its inode is.

        The times matter for the rest because a freed inode number is soon reused: a file
        deleted and written anew may get the old number back, but not the old change time.
        """
        if (self.type, self.dev, self.ino) != (other.type, other.dev, other.ino):
            return False
        if self.type == "dir":
            return True
        return (self.size, self.mtime_ns, self.ctime_ns) == (
            other.size,
            other.mtime_ns,
            other.ctime_ns,
        )


@dataclass(frozen=True)
class Item:
    """One path to protect, `rel` to the mount root ('/'-separated, as on disk, unescaped).

    `kind`: "readonly" (a read-only copy), "hooks" (a throw-away copy of the directory) or
    "copy" (a writable copy). `exists` is False only for a git directory's missing `hooks`:
    `prepare` then creates the empty directory, so the copy has a verified mount point.
    """

    rel: str
    kind: Kind
    exists: bool = True


@dataclass(frozen=True)
class Plan:
    """The result of `scan`.

    `name` is the mount name used in messages and reports. `seen` maps every protected path
    found (git directories, their protected files, hooks, `.git` files, protected names, and in
    an end scan also links where they do not belong) to its `Stamp`. `complete` is False when
    the walk stopped at `max_entries` or left directories out (`skipped`: on another
    filesystem, deeper than `MAX_DEPTH`, or unreadable); items there are not protected.
    """

    name: str
    items: tuple[Item, ...]
    seen: Mapping[str, Stamp] = field(compare=False)
    extra: tuple[str, ...]
    complete: bool
    skipped: tuple[str, ...]
    entries: int


@dataclass(frozen=True)
class Fingerprint:
    """A copy as it was: type, size in bytes, permission bits, and sha256 of a regular file."""

    type: FileType
    size: int
    mode: int
    sha256: str


@dataclass(frozen=True)
class ProtectedBind:
    """A per-session copy (`source`) to bind over `rel` in the project, read-only or not.

    `kind` is the item's kind. `fingerprints` describe the copy right after copying: key ""
    for a file; for a hooks copy, each entry's path inside it (the directory itself excluded).
    """

    source: Path
    rel: str
    writable: bool
    kind: str
    fingerprints: Mapping[str, Fingerprint] = field(default_factory=dict, compare=False)


# -- the public steps ------------------------------------------------------------------------


def validate_protected_names(names: Sequence[str]) -> tuple[str, ...]:
    """Return the extra protected names, each checked to be a plain relative file path.

    Refused (`InvalidInput`): an empty name, an absolute one, a NUL byte, an empty, '.' or
    '..' component, or a '.git' component (git directories are protected already).
    """
    for name in names:
        if not name or "\0" in name or name.startswith("/"):
            raise InvalidInput(f"protected name '{escape_name(name)}' must be a relative path")
        for part in name.split("/"):
            if part in ("", ".", ".."):
                raise InvalidInput(
                    f"protected name '{escape_name(name)}' has an empty, '.' or '..' component"
                )
            if part == ".git":
                raise InvalidInput(
                    f"protected name '{escape_name(name)}' is inside .git, which is "
                    "protected already"
                )
    return tuple(names)


def scan(
    root: Path,
    extra: Sequence[str] = (),
    *,
    max_entries: int = 200_000,
    name: str | None = None,
) -> Plan:
    """Find everything to protect under project `root` (a real directory, no link).

    `extra` adds protected names to `DEFAULT_PROTECTED`; `name` is the mount name for messages
    (default: the folder's name). Looks at no more than `max_entries` directory entries, stays
    on `root`'s filesystem and follows no link. Raises `ProtectionRefused` when a protected
    path goes through a link or has the wrong type, `InvalidInput` for a bad extra name.
    """
    extras = validate_protected_names(extra)
    return _Scanner(name or root.name, max_entries, strict=True).run(root, extras)


def prepare(plan: Plan, root: Path, copies_dir: Path) -> list[ProtectedBind]:
    """Copy every item of `plan` into `copies_dir` (created 0700) and return the binds.

    `.git/config`-like items become read-only binds; hooks directories become writable
    throw-away copies (regular files and directories only, modes kept); protected names become
    writable copies. A hooks directory the scan found missing is created empty in the project
    first (through descriptors, no link followed) so that its bind has a real mount point.
    Raises `ProtectionRefused` when a source became a link, changed type or was replaced since
    the scan, or is too large.
    """
    _make_private_dir(copies_dir)
    root_fd = _open_root(root)
    try:
        binds: list[ProtectedBind] = []
        for index, item in enumerate(plan.items):
            target = copies_dir / f"{index:04d}-{item.kind}"
            if item.kind == "hooks":
                binds.append(_prepare_hooks(plan, root_fd, item, target))
            else:
                binds.append(_prepare_file(plan, root_fd, item, target))
        return binds
    finally:
        os.close(root_fd)


def changes(
    plan: Plan, binds: Sequence[ProtectedBind], root: Path, *, max_entries: int = 200_000
) -> list[str]:
    """The escaped names (as "MOUNT/rel") of protected files changed or created since `plan`.

    Compares each copy with its fingerprint, then scans `root` again (never raising; a link
    or an odd type is reported by name) for protected items that are new, gone, replaced, or
    of another type. Sorted, without duplicates. Past `max_entries`, the rest of the tree is
    not looked at.
    """
    changed: set[str] = set()
    for bind in binds:
        if bind.kind == "hooks":
            changed.update(_hooks_changes(bind, max_entries))
        elif _file_changed(bind):
            changed.add(bind.rel)
    end = _Scanner(plan.name, max_entries, strict=False).run(root, plan.extra)
    changed.update(end.seen.keys() - plan.seen.keys() - {b.rel for b in binds})
    changed.update(_moved(plan, root))
    return sorted({escape_name(f"{plan.name}/{rel}" if rel else plan.name) for rel in changed})


def clone_or_copy(src_fd: int, dst_path: Path, mode: int) -> bool:
    """Copy the regular file open at `src_fd` to a new file `dst_path` with permission `mode`.

    Tries a copy-on-write clone (FICLONE) first and returns True when that worked; falls back
    to copying the bytes (copy_file_range, then read/write) when the filesystem cannot clone.
    `dst_path` must not exist (`O_EXCL | O_NOFOLLOW`); on failure it is removed again.
    """
    dst_fd = os.open(dst_path, _CREATE_FLAGS, 0o600)
    try:
        try:
            fcntl.ioctl(dst_fd, FICLONE, src_fd)
            cloned = True
        except OSError as exc:
            if exc.errno not in _NO_REFLINK:
                raise
            cloned = False
            _copy_bytes(src_fd, dst_fd)
        os.fchmod(dst_fd, stat.S_IMODE(mode))
    except BaseException:
        os.close(dst_fd)
        with contextlib.suppress(OSError):
            os.unlink(dst_path)
        raise
    os.close(dst_fd)
    return cloned


def escape_name(name: str | bytes) -> str:
    """`name` made safe to show: see the module docstring for the rule. One to one."""
    text = os.fsdecode(name) if isinstance(name, bytes) else name
    return "".join(_escape_char(ch) for ch in text)


# -- scanning --------------------------------------------------------------------------------


class _Scanner:
    """One walk of a project; strict (raise at the first refusal) or not (just record)."""

    def __init__(self, name: str, max_entries: int, *, strict: bool) -> None:
        if max_entries < 1:
            raise InvalidInput(f"max_entries must be at least 1, not {max_entries}")
        self.name = name
        self.max_entries = max_entries
        self.strict = strict
        self.items: dict[str, Item] = {}
        self.seen: dict[str, Stamp] = {}
        self.skipped: list[str] = []
        self.entries = 0
        self.full = False
        self.dev = 0

    def run(self, root: Path, extras: tuple[str, ...]) -> Plan:
        try:
            fd = _open_root(root)
        except OSError as exc:
            if self.strict:
                raise _refusal(self.name, "", f"cannot be opened ({exc.strerror})") from None
            return self._plan(extras)
        try:
            self.dev = os.fstat(fd).st_dev
            top = _lstat_at(fd, ".git")
            if top is not None:  # first, so no entry budget can leave it out
                self._dot_git(fd, ".git", kind_of(top.st_mode))
            for rel in (*DEFAULT_PROTECTED, *extras):
                self._protected_name(fd, rel)
            self._directory(fd, "", depth=0)
        finally:
            os.close(fd)
        return self._plan(extras)

    def _plan(self, extras: tuple[str, ...]) -> Plan:
        complete = not self.full and not self.skipped
        return Plan(
            name=self.name,
            items=tuple(self.items.values()),
            seen=dict(self.seen),
            extra=extras,
            complete=complete,
            skipped=tuple(self.skipped),
            entries=self.entries,
        )

    # -- recording

    def _add(self, item: Item) -> None:
        """Keep one item per path, the strictest kind if two rules name the same path."""
        old = self.items.get(item.rel)
        if old is None or _STRICTNESS[item.kind] < _STRICTNESS[old.kind]:
            self.items[item.rel] = item

    def _note(self, rel: str, info: os.stat_result) -> None:
        self.seen[rel] = Stamp.of(info)

    def _refuse(self, rel: str, why: str) -> None:
        if self.strict:
            raise _refusal(self.name, rel, why)

    def _count(self) -> bool:
        """Count one directory entry; False once the budget is spent."""
        if self.entries >= self.max_entries:
            self.full = True
            return False
        self.entries += 1
        return True

    # -- the tree

    def _directory(self, fd: int, rel: str, depth: int) -> None:
        types = self._list(fd)
        if {"HEAD", "refs", "objects"} <= types.keys():
            self._git_dir(fd, rel)  # a bare repository; its content is walked like any other
        git = types.pop(".git", None)
        if git is not None and rel:  # the root's own .git was handled first
            self._dot_git(fd, _join(rel, ".git"), git)
        for name, kind in types.items():
            if kind != "dir":
                continue
            if self.full:
                return
            self._subdirectory(fd, name, _join(rel, name), depth + 1)

    def _subdirectory(self, parent: int, name: str, rel: str, depth: int) -> None:
        try:
            child = _open_dir_at(parent, name)
        except PermissionError:
            self.skipped.append(rel)
            return
        if child is None:
            return  # gone or replaced since it was listed: nothing to enter
        try:
            if os.fstat(child).st_dev != self.dev or depth > MAX_DEPTH:
                self.skipped.append(rel)
                return
            self._directory(child, rel, depth)
        except PermissionError:
            self.skipped.append(rel)
        finally:
            os.close(child)

    def _list(self, fd: int) -> dict[str, FileType]:
        types: dict[str, FileType] = {}
        with os.scandir(fd) as entries:
            for entry in entries:
                if not self._count():
                    break
                kind = _entry_type(entry)
                if kind is not None:
                    types[entry.name] = kind
        return types

    def _dot_git(self, parent: int, rel: str, kind: FileType) -> None:
        """A `.git` entry: a repository directory, or a pointer file to one."""
        if kind == "dir":
            child = _open_dir_at(parent, ".git")
            if child is None:
                return
            try:
                self._note(rel, os.fstat(child))
                self._git_dir(child, rel)
            finally:
                os.close(child)
            return
        info = _lstat_at(parent, ".git")
        if info is None:
            return
        self._note(rel, info)
        if kind == "link":
            self._refuse(rel, _LINK_DIR)
        elif kind == "file":
            self._add(Item(rel, "readonly"))
        else:
            self._refuse(rel, f"is a {_describe(info.st_mode)}; expected a directory or a file")

    # -- inside a git directory

    def _git_dir(self, fd: int, rel: str, *, hooks: bool = True) -> None:
        for name in ("config", "config.worktree", "commondir"):
            self._file(fd, name, _join(rel, name), "readonly")
        if hooks:
            self._hooks(fd, _join(rel, "hooks"))
        modules = self._real_dir(fd, "modules", _join(rel, "modules"))
        if modules is not None:
            with _closing(modules):
                self._modules(modules, _join(rel, "modules"), depth=1)
        worktrees = self._real_dir(fd, "worktrees", _join(rel, "worktrees"))
        if worktrees is not None:
            with _closing(worktrees):
                self._worktrees(worktrees, _join(rel, "worktrees"))

    def _file(self, parent: int, name: str, rel: str, kind: Kind) -> None:
        info = _lstat_at(parent, name)
        if info is None:
            return
        self._note(rel, info)
        if stat.S_ISLNK(info.st_mode):
            self._refuse(rel, _LINK_FILE)
        elif not stat.S_ISREG(info.st_mode):
            self._refuse(
                rel,
                f"is a {_describe(info.st_mode)}; protected files must be regular files "
                "(review it on the host)",
            )
        else:
            self._add(Item(rel, kind))

    def _hooks(self, parent: int, rel: str) -> None:
        info = _lstat_at(parent, "hooks")
        if info is None:
            self._add(Item(rel, "hooks", exists=False))
            return
        self._note(rel, info)
        if stat.S_ISLNK(info.st_mode):
            self._refuse(rel, _LINK_HOOKS)
        elif not stat.S_ISDIR(info.st_mode):
            self._refuse(
                rel,
                f"is a {_describe(info.st_mode)}; hooks must be a real directory "
                "(review it on the host)",
            )
        else:
            self._add(Item(rel, "hooks"))

    def _real_dir(self, parent: int, name: str, rel: str) -> int | None:
        """A descriptor of directory `name`, None if absent or not a directory; a link refused."""
        info = _lstat_at(parent, name)
        if info is None:
            return None
        if stat.S_ISLNK(info.st_mode):
            self._note(rel, info)
            self._refuse(rel, _LINK_DIR)
            return None
        if not stat.S_ISDIR(info.st_mode):
            return None
        return _open_dir_at(parent, name)

    def _modules(self, fd: int, rel: str, depth: int) -> None:
        """`.git/modules/**`: module git directories, maybe under intermediate directories."""
        for name, kind in self._list(fd).items():
            child_rel = _join(rel, name)
            if kind == "link":
                self._real_dir(fd, name, child_rel)  # records and refuses the link
                continue
            if kind != "dir" or depth > MAX_DEPTH:
                continue
            child = _open_dir_at(fd, name)
            if child is None:
                continue
            with _closing(child):
                if _lstat_at(child, "HEAD") is not None or _lstat_at(child, "config") is not None:
                    self._note(child_rel, os.fstat(child))
                    self._git_dir(child, child_rel)
                else:
                    self._modules(child, child_rel, depth + 1)

    def _worktrees(self, fd: int, rel: str) -> None:
        """`.git/worktrees/*`: each linked worktree's own git directory (hooks are shared)."""
        for name, kind in self._list(fd).items():
            child_rel = _join(rel, name)
            child = self._real_dir(fd, name, child_rel) if kind in ("dir", "link") else None
            if child is None:
                continue
            with _closing(child):
                self._note(child_rel, os.fstat(child))
                self._git_dir(child, child_rel, hooks=False)

    # -- protected names

    def _protected_name(self, root: int, rel: str) -> None:
        """A protected name below the root: every directory on the way must be real."""
        parts = rel.split("/")
        opened: list[int] = []
        fd = root
        try:
            for index, part in enumerate(parts):
                here = "/".join(parts[: index + 1])
                last = index == len(parts) - 1
                info = _lstat_at(fd, part)
                if info is None:
                    return
                if last:
                    self._file(fd, part, here, "copy")
                    return
                if stat.S_ISLNK(info.st_mode):
                    self._note(here, info)
                    self._refuse(here, _LINK_DIR)
                    return
                child = _open_dir_at(fd, part) if stat.S_ISDIR(info.st_mode) else None
                if child is None:
                    return  # a file where a directory would be: the name cannot exist
                opened.append(child)
                fd = child
        finally:
            for child in opened:
                os.close(child)


# -- preparing copies ------------------------------------------------------------------------


def _prepare_file(plan: Plan, root_fd: int, item: Item, target: Path) -> ProtectedBind:
    parts = item.rel.split("/")
    with _closing(_open_parent(plan, root_fd, item.rel)) as parent:
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise _changed(plan, item.rel, exc, parent, parts[-1]) from None
    with _closing(fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refusal(plan.name, item.rel, f"is now a {_describe(info.st_mode)}")
        _check_same(plan, item.rel, info)
        if info.st_size > MAX_COPY_BYTES:
            raise _refusal(plan.name, item.rel, f"is larger than {MAX_COPY_BYTES} bytes")
        clone_or_copy(fd, target, info.st_mode)
    with _closing(os.open(target, _READ_FLAGS)) as copy_fd:
        fingerprint = _fingerprint_fd(copy_fd, None)
    return ProtectedBind(
        source=target,
        rel=item.rel,
        writable=item.kind != "readonly",
        kind=item.kind,
        fingerprints={"": fingerprint},
    )


def _prepare_hooks(plan: Plan, root_fd: int, item: Item, target: Path) -> ProtectedBind:
    with _closing(_open_parent(plan, root_fd, item.rel)) as parent:
        if not item.exists:
            with contextlib.suppress(FileExistsError):
                os.mkdir("hooks", 0o755, dir_fd=parent)
        try:
            fd = os.open("hooks", _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise _changed(plan, item.rel, exc, parent, "hooks") from None
    with _closing(fd):
        info = os.fstat(fd)
        if item.exists:
            _check_same(plan, item.rel, info)
        os.mkdir(target, 0o700)
        budget = [MAX_HOOK_ENTRIES]
        _copy_tree(plan, fd, target, item.rel, budget, depth=0)
        os.chmod(target, stat.S_IMODE(info.st_mode))
    fingerprints: dict[str, Fingerprint] = {}
    with _closing(os.open(target, _DIR_FLAGS)) as copy_fd:
        _tree_fingerprints(copy_fd, "", fingerprints, [MAX_HOOK_ENTRIES + 1], None, depth=0)
    return ProtectedBind(target, item.rel, writable=True, kind="hooks", fingerprints=fingerprints)


def _copy_tree(plan: Plan, src: int, dst: Path, rel: str, budget: list[int], depth: int) -> None:
    """Copy the regular files and directories of `src` into the new directory `dst`."""
    if depth > MAX_DEPTH:
        raise _refusal(plan.name, rel, f"is nested deeper than {MAX_DEPTH} directories")
    with os.scandir(src) as it:
        entries = [(e.name, _entry_type(e)) for e in it]
    budget[0] -= len(entries)
    if budget[0] < 0:
        raise _refusal(plan.name, rel, f"holds more than {MAX_HOOK_ENTRIES} entries to copy")
    for name, kind in entries:
        if kind == "dir":
            child = _open_dir_at(src, name)
            if child is None:
                continue
            with _closing(child):
                mode = stat.S_IMODE(os.fstat(child).st_mode)
                os.mkdir(dst / name, 0o700)
                _copy_tree(plan, child, dst / name, _join(rel, name), budget, depth + 1)
                os.chmod(dst / name, mode)
        elif kind == "file":
            _copy_one(plan, src, name, dst / name, _join(rel, name))


def _copy_one(plan: Plan, parent: int, name: str, dst: Path, rel: str) -> None:
    """Copy one regular file of a hooks directory; anything else there is skipped."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in _GONE:
            return
        raise
    with _closing(fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return
        if info.st_size > MAX_COPY_BYTES:
            raise _refusal(plan.name, rel, f"is larger than {MAX_COPY_BYTES} bytes")
        clone_or_copy(fd, dst, info.st_mode)


def _open_parent(plan: Plan, root_fd: int, rel: str) -> int:
    """A descriptor of the directory holding `rel`, walked from the root with no link."""
    fd = os.dup(root_fd)
    parts = rel.split("/")
    try:
        for index, part in enumerate(parts[:-1]):
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                here = "/".join(parts[: index + 1])
                raise _changed(plan, here, exc, fd, part) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_same(plan: Plan, rel: str, info: os.stat_result) -> None:
    """Refuse a source that is not the object the scan saw."""
    before = plan.seen.get(rel)
    if before is not None and not before.same(Stamp.of(info)):
        raise _refusal(plan.name, rel, "was replaced since the scan; start the session again")


def _changed(plan: Plan, rel: str, exc: OSError, parent: int, name: str) -> ProtectionRefused:
    """The refusal for a path that could not be opened as the scan saw it."""
    info = _lstat_at(parent, name)
    if exc.errno in _GONE and info is not None and stat.S_ISLNK(info.st_mode):
        return _refusal(plan.name, rel, "became a symbolic link since the scan (review it)")
    if exc.errno in _GONE:
        return _refusal(plan.name, rel, "changed since the scan; start the session again")
    return _refusal(plan.name, rel, f"cannot be opened ({exc.strerror})")


def _make_private_dir(path: Path) -> None:
    """Create `path` 0700 (its parents too), or accept it if it is already our own directory."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise InvalidInput(f"{escape_name(str(path))} is not a directory of ours") from None
    os.chmod(path, 0o700)


# -- copying bytes ---------------------------------------------------------------------------


def _copy_bytes(src: int, dst: int) -> None:
    """Copy all of `src` into `dst` from offset 0, in the kernel when it can."""
    offset = 0
    try:
        while count := os.copy_file_range(src, dst, _CHUNK_BYTES, offset, offset):
            offset += count
    except OSError as exc:
        if exc.errno not in _NO_COPY_RANGE:
            raise
    # Some filesystems answer 0 before the end; the plain loop finishes from where it stopped.
    while data := os.pread(src, _CHUNK_BYTES, offset):
        view = memoryview(data)
        while view:
            view = view[os.pwrite(dst, view, offset + len(data) - len(view)) :]
        offset += len(data)


# -- comparing at the end --------------------------------------------------------------------


def _file_changed(bind: ProtectedBind) -> bool:
    before = bind.fingerprints.get("")
    return before is None or _fingerprint_path(bind.source, before) != before


def _hooks_changes(bind: ProtectedBind, max_entries: int) -> set[str]:
    """Paths (relative to the mount root) added, removed or changed in a hooks copy."""
    now: dict[str, Fingerprint] = {}
    try:
        copy_fd = os.open(bind.source, _DIR_FLAGS)
    except OSError:
        return {bind.rel}
    with _closing(copy_fd):
        budget = [max_entries]
        _tree_fingerprints(copy_fd, "", now, budget, bind.fingerprints, depth=0)
    if budget[0] < 0:
        return {bind.rel}
    names = {
        sub
        for sub in bind.fingerprints.keys() | now.keys()
        if bind.fingerprints.get(sub) != now.get(sub)
    }
    return {_join(bind.rel, sub) for sub in names}


def _moved(plan: Plan, root: Path) -> set[str]:
    """Protected paths of the plan that are now gone, replaced or of another type."""
    try:
        root_fd = _open_root(root)
    except OSError:
        return set(plan.seen)
    with _closing(root_fd):
        return {
            rel
            for rel, before in plan.seen.items()
            if not _same_as(_stamp_at(root_fd, rel), before)
        }


def _same_as(now: Stamp | None, before: Stamp) -> bool:
    return now is not None and before.same(now)


def _stamp_at(root_fd: int, rel: str) -> Stamp | None:
    """The stamp of `rel`, reached through real directories only; None if that fails."""
    parts = rel.split("/")
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            child = _open_dir_at(fd, part)
            if child is None:
                return None
            os.close(fd)
            fd = child
        info = _lstat_at(fd, parts[-1])
        return None if info is None else Stamp.of(info)
    finally:
        os.close(fd)


def _tree_fingerprints(
    fd: int,
    prefix: str,
    out: dict[str, Fingerprint],
    budget: list[int],
    expected: Mapping[str, Fingerprint] | None,
    depth: int,
) -> None:
    """Fingerprint every entry under directory `fd`, no link followed, within `budget`.

    With `expected`, a file whose type, size or mode already differ is not hashed (its
    fingerprint differs anyway), so a huge file planted in a copy costs nothing to read.
    """
    with os.scandir(fd) as it:
        names = [e.name for e in it]
    for name in sorted(names):
        budget[0] -= 1
        if budget[0] < 0:
            return
        rel = _join(prefix, name)
        info = _lstat_at(fd, name)
        if info is None:
            continue
        if stat.S_ISREG(info.st_mode):
            hint = None if expected is None else expected.get(rel)
            out[rel] = _fingerprint_at(fd, name, hint)
            continue
        out[rel] = Fingerprint(kind_of(info.st_mode), 0, stat.S_IMODE(info.st_mode), "")
        if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
            child = _open_dir_at(fd, name)
            if child is not None:
                with _closing(child):
                    _tree_fingerprints(child, rel, out, budget, expected, depth + 1)


def _fingerprint_path(path: Path, hint: Fingerprint | None = None) -> Fingerprint | None:
    """The fingerprint of the copy at `path` (in our own directory), or None if it is gone."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Fingerprint("link", 0, 0, "")
        return None
    with _closing(fd):
        return _fingerprint_fd(fd, hint)


def _fingerprint_at(parent: int, name: str, hint: Fingerprint | None) -> Fingerprint:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=parent)
    except OSError:
        return Fingerprint("other", 0, 0, "")  # replaced while we looked: it changed
    with _closing(fd):
        return _fingerprint_fd(fd, hint)


def _fingerprint_fd(fd: int, hint: Fingerprint | None) -> Fingerprint:
    info = os.fstat(fd)
    kind = kind_of(info.st_mode)
    mode = stat.S_IMODE(info.st_mode)
    if kind != "file":
        return Fingerprint(kind, 0, mode, "")
    if hint is not None and (hint.type, hint.size, hint.mode) != (kind, info.st_size, mode):
        return Fingerprint(kind, info.st_size, mode, "")
    digest = hashlib.sha256()
    offset = 0
    while data := os.pread(fd, _CHUNK_BYTES, offset):
        digest.update(data)
        offset += len(data)
    return Fingerprint(kind, offset, mode, digest.hexdigest())


# -- small helpers ---------------------------------------------------------------------------


def _open_root(root: Path) -> int:
    return os.open(root, _DIR_FLAGS)


def _open_dir_at(parent: int, name: str) -> int | None:
    """A descriptor of real directory `name` in `parent`; None if it is gone or not one."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise


def _lstat_at(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _entry_type(entry: os.DirEntry[str]) -> FileType | None:
    """The type of a listed entry without following it; None if it vanished meanwhile."""
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        return None
    return "other"


def _describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "regular file"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _refusal(name: str, rel: str, why: str) -> ProtectionRefused:
    where = escape_name(rel) if rel else "the project folder"
    return ProtectionRefused(f"refusing to mount '{escape_name(name)}': {where} {why}")


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if ch == "\\":
        return "\\\\"
    if 0x20 <= code < 0x7F:
        return ch
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as os.fsdecode carries it
        return f"\\x{code - 0xDC00:02x}"
    if ch.isprintable() and unicodedata.category(ch)[0] in "LMN":
        return ch
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
