"""A read-write project's overlay, applied to the host folder through one filter.

A session sees a read-write project as an overlay (`--overlay`): the host folder is the lower
layer, and everything the sandbox writes lands in a per-session upper layer the server owns.
`OverlaySync.sync` walks that upper layer and applies what changed since its last pass to
the host folder, each path judged by `protect.trusted.verdict` first:

- applied: a file (written beside its target and renamed over it, set-id bits dropped), a
  directory, a link (as a link: nothing here ever follows one), a deletion (the overlay's
  whiteout, a 0/0 character device), and a directory the sandbox deleted and made again
  (an opaque one: what the host has there and the upper layer does not is removed);
- dropped: the paths the host would run or trust. They stay in the session's view only, and
  each is handed to `on_dropped` the first time a pass sees it, so the audit log and the
  session hear of it as it happens, not at the end;
- inside a `.git`'s object store, an object the host already has is never replaced or
  deleted (objects are named by their content; git never rewrites one).

The host side is walked from a descriptor of the project folder, one component at a time,
never through a link (`corral.fsafe`); the upper side is read the same way. A pass is
bounded (`MAX_ENTRIES`); what it cannot apply (a name the host made a link, say) is logged
and tried again when it changes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.fsafe import (
    CREATE_FLAGS,
    UnsafePath,
    closing,
    lstat_at,
    open_child_dir,
    open_dir_at,
    open_file_at,
    remove_tree,
    walk,
)
from corral.protect.names import escape_name
from corral.protect.trusted import verdict

log = logging.getLogger(__name__)

MAX_ENTRIES = 200_000  # entries of the upper layer one pass looks at
MAX_DEPTH = 64  # folders nested deeper are not applied (one descriptor open per level)
OPAQUE_XATTRS = ("user.overlay.opaque", "trusted.overlay.opaque")
DIR_MODE = 0o755  # a host folder made on the way to a path whose own folder came later
COPY_CHUNK = 1 << 20

DroppedHook = Callable[[list[str]], None]


@dataclass(frozen=True)
class Entry:
    """One path of the upper layer as a pass found it."""

    rel: str
    kind: str  # "file", "dir", "link", "gone" (a whiteout) or "other"
    mode: int
    stamp: tuple[int | bool, ...]
    opaque: bool = False


class OverlaySync:
    """Applies one project's upper layer (`upper`) to its host folder (`host`)."""

    def __init__(
        self, host: Path, upper: Path, extra: Sequence[str], on_dropped: DroppedHook
    ) -> None:
        self.host = host
        self.upper = upper
        self.extra = tuple(extra)
        self.on_dropped = on_dropped
        self._done: dict[str, tuple[int | bool, ...]] = {}  # rel -> the stamp last handled
        self.dropped: list[str] = []  # every path dropped, in the order first seen
        self._dropped_set: set[str] = set()
        self._too_deep: set[str] = set()
        self._lock = threading.Lock()

    def sync(self) -> None:
        """One pass: apply what changed in the upper layer since the last (blocking; one
        pass at a time)."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        fresh: list[str] = []
        for entry in self._changed():
            judged = verdict(entry.rel, entry.kind, self.extra)
            if judged == "apply" and not self._apply_logged(entry):
                judged = "drop"
            if judged == "drop" and not self._reported(entry.rel) and self._news(entry):
                self.dropped.append(entry.rel)
                self._dropped_set.add(entry.rel)
                fresh.append(entry.rel)
            self._done[entry.rel] = entry.stamp
        if fresh:
            self.on_dropped(fresh)

    def _news(self, entry: Entry) -> bool:
        """False for a folder the host has as well: it is in the upper layer only because
        something in it changed, which is reported by its own name."""
        return entry.kind != "dir" or not self._host_has_dir(entry.rel)

    def _host_has_dir(self, rel: str) -> bool:
        parts = rel.split("/")
        try:
            with walk(self.host, parts[:-1]) as parent:
                info = lstat_at(parent, parts[-1])
        except (OSError, UnsafePath):
            return False
        return info is not None and stat.S_ISDIR(info.st_mode)

    def _reported(self, rel: str) -> bool:
        """True when `rel` or a folder holding it was reported dropped already (a new
        repository's hooks are one report: its `.git/hooks`)."""
        parts = rel.split("/")
        return any(
            "/".join(parts[:depth]) in self._dropped_set for depth in range(1, len(parts) + 1)
        )

    def _changed(self) -> Iterator[Entry]:
        """The entries whose stamp changed since they were last handled. After a whole
        walk, what the upper layer no longer holds is forgotten (a bounded memory)."""
        seen: set[str] = set()
        for count, entry in enumerate(self._entries(), 1):
            if count > MAX_ENTRIES:
                log.warning("%s: more than %d changed paths; the rest wait", self.host, count)
                return
            seen.add(entry.rel)
            if self._done.get(entry.rel) != entry.stamp:
                yield entry
        for rel in self._done.keys() - seen:
            del self._done[rel]

    def _entries(self) -> Iterator[Entry]:
        """Every path of the upper layer, parents before children, no link followed, at
        most `MAX_DEPTH` folders deep (one descriptor open per level)."""
        try:
            root = open_dir_at(None, self.upper)
        except (OSError, UnsafePath):
            return
        with closing(root):
            yield from self._walk(root, "", 0)

    def _walk(self, fd: int, prefix: str, depth: int) -> Iterator[Entry]:
        with os.scandir(fd) as listing:
            names = sorted(item.name for item in listing)
        for name in names:
            rel = f"{prefix}/{name}" if prefix else name
            info = lstat_at(fd, name)
            if info is None:
                continue
            if not stat.S_ISDIR(info.st_mode):
                yield _entry(rel, info)
                continue
            try:
                child = open_dir_at(fd, name)
            except (OSError, UnsafePath):
                continue  # swapped for something else meanwhile: the next pass sees it
            with closing(child):
                yield _entry(rel, info, opaque=_opaque(child))
                if depth + 1 < MAX_DEPTH:
                    yield from self._walk(child, rel, depth + 1)
                elif rel not in self._too_deep:
                    self._too_deep.add(rel)
                    log.warning("%s: %s is nested too deep to apply", self.host, rel)

    def _apply_logged(self, entry: Entry) -> bool:
        """Apply `entry`; False when the host's side makes it a trusted change after all."""
        try:
            return self._apply(entry)
        except (OSError, UnsafePath) as exc:
            log.warning("could not apply %s to %s: %s", escape_name(entry.rel), self.host, exc)
            return True

    def _apply(self, entry: Entry) -> bool:
        parts = entry.rel.split("/")
        create = None if entry.kind == "gone" else DIR_MODE
        try:
            with walk(self.host, parts[:-1], create_mode=create) as parent:
                return self._apply_in(parent, parts[-1], entry)
        except FileNotFoundError:
            if entry.kind == "gone":
                return True  # a deletion under a folder the host does not have
            raise

    def _apply_in(self, parent: int, name: str, entry: Entry) -> bool:
        try:
            return self._apply_guarded(parent, name, entry)
        except HoldsRepository:
            return False  # the host's folder holds a repository: it is not deleted

    def _apply_guarded(self, parent: int, name: str, entry: Entry) -> bool:
        host = lstat_at(parent, name)
        if name == ".git" and host is not None and not stat.S_ISDIR(host.st_mode):
            return False  # a `.git` file (a worktree's link to its repository) stays
        if _in_object_store(entry.rel.split("/")) and (entry.kind == "gone" or host):
            return True  # an object the host has stays as it is
        if entry.kind == "gone":
            _remove(parent, name)
        elif entry.kind == "dir":
            self._apply_dir(parent, name, entry)
        elif entry.kind == "file":
            self._apply_file(parent, name, entry)
        elif entry.kind == "link":
            self._apply_link(parent, name, entry)
        return True

    def _apply_dir(self, parent: int, name: str, entry: Entry) -> None:
        info = lstat_at(parent, name)
        if info is not None and not stat.S_ISDIR(info.st_mode):
            _remove(parent, name)
        mode = stat.S_IMODE(entry.mode) & 0o777
        with closing(open_child_dir(parent, name, mode=mode)) as fd:
            os.fchmod(fd, mode)
            if entry.opaque:
                self._clear_opaque(fd, entry.rel)

    def _clear_opaque(self, fd: int, rel: str) -> None:
        """The sandbox deleted this folder and made it again: what the host has in it and
        the upper layer does not was deleted too (unless it is a path the host trusts)."""
        with walk(self.upper, rel.split("/")) as upper_fd:
            kept = set(os.listdir(upper_fd))
        for name in os.listdir(fd):
            gone = f"{rel}/{name}"
            if name in kept or verdict(gone, "gone", self.extra) != "apply":
                continue
            if not _in_object_store(gone.split("/")):
                _remove(fd, name)

    def _apply_file(self, parent: int, name: str, entry: Entry) -> None:
        parts = entry.rel.split("/")
        with walk(self.upper, parts[:-1]) as upper_parent:
            source = open_file_at(upper_parent, parts[-1], tuple(parts[:-1]))
        with closing(source):
            draft = f".corral-sync-{secrets.token_hex(8)}"
            mode = stat.S_IMODE(entry.mode) & 0o777  # never a set-id or sticky bit
            target = os.open(draft, CREATE_FLAGS, mode, dir_fd=parent)
            try:
                with closing(target):
                    _copy(source, target)
                    os.fchmod(target, mode)
                _replace(parent, draft, name)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(draft, dir_fd=parent)
                raise

    def _apply_link(self, parent: int, name: str, entry: Entry) -> None:
        parts = entry.rel.split("/")
        with walk(self.upper, parts[:-1]) as upper_parent:
            target = os.readlink(parts[-1], dir_fd=upper_parent)
        draft = f".corral-sync-{secrets.token_hex(8)}"
        os.symlink(target, draft, dir_fd=parent)
        try:
            _replace(parent, draft, name)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(draft, dir_fd=parent)
            raise


def _entry(rel: str, info: os.stat_result, *, opaque: bool = False) -> Entry:
    mode = info.st_mode
    stamp = (mode, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, opaque)
    if stat.S_ISDIR(mode):
        return Entry(rel, "dir", mode, stamp, opaque)
    if stat.S_ISREG(mode):
        return Entry(rel, "file", mode, stamp)
    if stat.S_ISLNK(mode):
        return Entry(rel, "link", mode, stamp)
    if stat.S_ISCHR(mode) and info.st_rdev == 0:
        return Entry(rel, "gone", mode, stamp)
    return Entry(rel, "other", mode, stamp)


def _opaque(fd: int) -> bool:
    """True for a folder the sandbox deleted and made again (the overlay marks it)."""
    for key in OPAQUE_XATTRS:
        with contextlib.suppress(OSError):
            if os.getxattr(fd, key) == b"y":
                return True
    return False


def _holds_git(fd: int, depth: int, seen: list[int]) -> bool:
    """True when folder `fd` holds a `.git` at any depth, or is too large or deep to tell
    within `MAX_ENTRIES` entries and `MAX_DEPTH` levels (`seen[0]` counts the entries)."""
    with os.scandir(fd) as listing:
        items = [(item.name, item.is_dir(follow_symlinks=False)) for item in listing]
    seen[0] += len(items)
    if any(name == ".git" for name, _ in items) or seen[0] > MAX_ENTRIES:
        return True
    for name, is_dir in items:
        if not is_dir:
            continue
        if depth + 1 >= MAX_DEPTH:
            return True
        try:
            child = open_dir_at(fd, name)
        except (OSError, UnsafePath):
            continue
        with closing(child):
            if _holds_git(child, depth + 1, seen):
                return True
    return False


def _in_object_store(parts: list[str]) -> bool:
    return ".git" in parts and parts[parts.index(".git") + 1 : parts.index(".git") + 2] == [
        "objects"
    ]


def _copy(source: int, target: int) -> None:
    while chunk := os.read(source, COPY_CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view) :]


def _replace(parent: int, draft: str, name: str) -> None:
    """Rename `draft` over `name`; a folder in the way (the sandbox replaced a folder with
    a file) is removed first."""
    try:
        os.rename(draft, name, src_dir_fd=parent, dst_dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
            raise
        _remove(parent, name)
        os.rename(draft, name, src_dir_fd=parent, dst_dir_fd=parent)


class HoldsRepository(Exception):
    """A host folder to delete holds a `.git` (or is too large to tell): it stays."""


def _remove(parent: int, name: str) -> None:
    """Delete `name` in `parent`, a folder with all it holds; never through a link. A folder
    holding a repository anywhere inside is not deleted (`HoldsRepository`): deleting a
    `.git` is a change to a path the host trusts, however it is asked for."""
    info = lstat_at(parent, name)
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        with closing(open_dir_at(parent, name)) as fd:
            if _holds_git(fd, 0, [0]):
                raise HoldsRepository(name)
        remove_tree(parent, name)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)


def remove_layers(root: Path) -> None:
    """Remove a session's overlay folders, once its sandbox has ended. A folder nobody may
    read (overlayfs makes its own work folder mode 000; the sandbox may have made one) is
    opened up first; a link is never followed."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                continue
            os.chmod(folder, 0o700)
            with os.scandir(folder) as listing:
                stack += [Path(item.path) for item in listing if item.is_dir(follow_symlinks=False)]
        except OSError:
            continue
    shutil.rmtree(root, ignore_errors=True)
