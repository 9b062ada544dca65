"""The scan of a read-write project: everything in it the host later executes or trusts.

`scan` walks the project once on the host, before the session starts, and lists what to
protect: in every git directory (`.git` of the top repository and of nested or vendored
ones, each `.git/modules/**` module, each bare-looking repository) its `config`,
`config.worktree` and `commondir` (read-only copies), its `hooks` (a throw-away copy) and
each `worktrees/*/commondir` and `config.worktree`; every `.git` file (a submodule or worktree
pointer, read-only); and the protected names (`DEFAULT_PROTECTED` plus the operator's
extras) relative to the mount root (writable copies). A protected path that goes through a
symbolic link, or an item of the wrong type, is refused: a mount point is only ever made at
a path the host verified to be reachable through real directories.

The walk follows no link, looks at a bounded number of entries, stays on one filesystem and
enters at most `MAX_DEPTH` directories deep. The end-of-run comparison runs the same
`Scanner` without refusing (`strict=False`) to see what appeared.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from corral.errors import InvalidInput
from corral.fsafe import Kind as FileType
from corral.fsafe import closing, describe, kind_of, lstat_at
from corral.protect.names import DEFAULT_PROTECTED, join, refusal, validate_protected_names
from corral.protect.plan import MAX_DEPTH, Item, Kind, Plan, Stamp
from corral.protect.tree import entry_type, open_real_dir, open_root

_STRICTNESS = {"readonly": 0, "hooks": 1, "copy": 2}

_LINK_FILE = "is a symbolic link; protected files must be regular files (review it on the host)"
_LINK_DIR = (
    "is a symbolic link; a protected path must go through real directories only "
    "(review it on the host)"
)
_LINK_HOOKS = "is a symbolic link; hooks must be a real directory (review it on the host)"


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
    return Scanner(name or root.name, max_entries, strict=True).run(root, extras)


class Scanner:
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
            fd = open_root(root)
        except OSError as exc:
            if self.strict:
                raise refusal(self.name, "", f"cannot be opened ({exc.strerror})") from None
            return self._plan(extras)
        try:
            self.dev = os.fstat(fd).st_dev
            top = lstat_at(fd, ".git")
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
            raise refusal(self.name, rel, why)

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
            self._dot_git(fd, join(rel, ".git"), git)
        for name, kind in types.items():
            if kind != "dir":
                continue
            if self.full:
                return
            self._subdirectory(fd, name, join(rel, name), depth + 1)

    def _subdirectory(self, parent: int, name: str, rel: str, depth: int) -> None:
        try:
            child = open_real_dir(parent, name)
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
                kind = entry_type(entry)
                if kind is not None:
                    types[entry.name] = kind
        return types

    def _dot_git(self, parent: int, rel: str, kind: FileType) -> None:
        """A `.git` entry: a repository directory, or a pointer file to one."""
        if kind == "dir":
            child = open_real_dir(parent, ".git")
            if child is None:
                return
            try:
                self._note(rel, os.fstat(child))
                self._git_dir(child, rel)
            finally:
                os.close(child)
            return
        info = lstat_at(parent, ".git")
        if info is None:
            return
        self._note(rel, info)
        if kind == "link":
            self._refuse(rel, _LINK_DIR)
        elif kind == "file":
            self._add(Item(rel, "readonly"))
        else:
            self._refuse(rel, f"is {describe(info.st_mode)}; expected a directory or a file")

    # -- inside a git directory

    def _git_dir(self, fd: int, rel: str, *, hooks: bool = True) -> None:
        for name in ("config", "config.worktree", "commondir"):
            self._file(fd, name, join(rel, name), "readonly")
        if hooks:
            self._hooks(fd, join(rel, "hooks"))
        modules = self._real_dir(fd, "modules", join(rel, "modules"))
        if modules is not None:
            with closing(modules):
                self._modules(modules, join(rel, "modules"), depth=1)
        worktrees = self._real_dir(fd, "worktrees", join(rel, "worktrees"))
        if worktrees is not None:
            with closing(worktrees):
                self._worktrees(worktrees, join(rel, "worktrees"))

    def _file(self, parent: int, name: str, rel: str, kind: Kind) -> None:
        info = lstat_at(parent, name)
        if info is None:
            return
        self._note(rel, info)
        if stat.S_ISLNK(info.st_mode):
            self._refuse(rel, _LINK_FILE)
        elif not stat.S_ISREG(info.st_mode):
            self._refuse(
                rel,
                f"is {describe(info.st_mode)}; protected files must be regular files "
                "(review it on the host)",
            )
        else:
            self._add(Item(rel, kind))

    def _hooks(self, parent: int, rel: str) -> None:
        info = lstat_at(parent, "hooks")
        if info is None:
            self._add(Item(rel, "hooks", exists=False))
            return
        self._note(rel, info)
        if stat.S_ISLNK(info.st_mode):
            self._refuse(rel, _LINK_HOOKS)
        elif not stat.S_ISDIR(info.st_mode):
            self._refuse(
                rel,
                f"is {describe(info.st_mode)}; hooks must be a real directory "
                "(review it on the host)",
            )
        else:
            self._add(Item(rel, "hooks"))

    def _real_dir(self, parent: int, name: str, rel: str) -> int | None:
        """A descriptor of directory `name`, None if absent or not a directory; a link refused."""
        info = lstat_at(parent, name)
        if info is None:
            return None
        if stat.S_ISLNK(info.st_mode):
            self._note(rel, info)
            self._refuse(rel, _LINK_DIR)
            return None
        if not stat.S_ISDIR(info.st_mode):
            return None
        return open_real_dir(parent, name)

    def _modules(self, fd: int, rel: str, depth: int) -> None:
        """`.git/modules/**`: module git directories, maybe under intermediate directories."""
        for name, kind in self._list(fd).items():
            child_rel = join(rel, name)
            if kind == "link":
                self._real_dir(fd, name, child_rel)  # records and refuses the link
                continue
            if kind != "dir" or depth > MAX_DEPTH:
                continue
            child = open_real_dir(fd, name)
            if child is None:
                continue
            with closing(child):
                if lstat_at(child, "HEAD") is not None or lstat_at(child, "config") is not None:
                    self._note(child_rel, os.fstat(child))
                    self._git_dir(child, child_rel)
                else:
                    self._modules(child, child_rel, depth + 1)

    def _worktrees(self, fd: int, rel: str) -> None:
        """`.git/worktrees/*`: each linked worktree's own git directory (hooks are shared)."""
        for name, kind in self._list(fd).items():
            child_rel = join(rel, name)
            child = self._real_dir(fd, name, child_rel) if kind in ("dir", "link") else None
            if child is None:
                continue
            with closing(child):
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
                info = lstat_at(fd, part)
                if info is None:
                    return
                if last:
                    self._file(fd, part, here, "copy")
                    return
                if stat.S_ISLNK(info.st_mode):
                    self._note(here, info)
                    self._refuse(here, _LINK_DIR)
                    return
                child = open_real_dir(fd, part) if stat.S_ISDIR(info.st_mode) else None
                if child is None:
                    return  # a file where a directory would be: the name cannot exist
                opened.append(child)
                fd = child
        finally:
            for child in opened:
                os.close(child)
