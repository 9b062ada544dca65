"""The per-session copies of what a scan found to protect, made without following a link.

`prepare` opens every source component by component from the project's descriptor (a link
swapped in after the scan is refused, not followed), checks it is the object the scan saw,
copies it into a server-owned private directory and fingerprints the copy. The caller
bind-mounts each copy over its `rel`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from corral.errors import InvalidInput
from corral.fsafe import (
    DIR_FLAGS,
    READ_FLAGS,
    LinkRefused,
    NotPrivate,
    NotRegular,
    UnsafePath,
    closing,
    describe,
    open_dir_at,
    open_file_at,
    parts_of,
    private_dir,
)
from corral.protect.clone import clone_or_copy
from corral.protect.fingerprint import fingerprint_fd, tree_fingerprints
from corral.protect.names import ProtectionRefused, escape_name, join, refusal
from corral.protect.plan import MAX_DEPTH, Fingerprint, Item, Plan, ProtectedBind, Stamp
from corral.protect.tree import GONE, entry_type, open_real_dir, open_root

MAX_COPY_BYTES = 64 * 1024 * 1024  # a protected file larger than this is refused
MAX_HOOK_ENTRIES = 10_000  # entries in one hooks directory copied at most


def prepare(plan: Plan, root: Path, copies_dir: Path) -> list[ProtectedBind]:
    """Copy every item of `plan` into `copies_dir` (created 0700) and return the binds.

    `.git/config`-like items become read-only binds; hooks directories become writable
    throw-away copies (regular files and directories only, modes kept); protected names become
    writable copies. A hooks directory the scan found missing is created empty in the project
    first (through descriptors, no link followed) so that its bind has a real mount point.
    Raises `ProtectionRefused` when a source became a link, changed type or was replaced since
    the scan, or is too large; `InvalidInput` when `copies_dir` is not a private directory.
    """
    _make_private_dir(copies_dir)
    with closing(open_root(root)) as root_fd:
        binds: list[ProtectedBind] = []
        for index, item in enumerate(plan.items):
            target = copies_dir / f"{index:04d}-{item.kind}"
            if item.kind == "hooks":
                binds.append(_prepare_hooks(plan, root_fd, item, target))
            else:
                binds.append(_prepare_file(plan, root_fd, item, target))
        return binds


def _prepare_file(plan: Plan, root_fd: int, item: Item, target: Path) -> ProtectedBind:
    name = parts_of(item.rel)[-1]
    with closing(_open_parent(plan, root_fd, item.rel)) as parent:
        try:
            fd = open_file_at(parent, name)
        except (OSError, UnsafePath) as exc:
            raise _changed(plan, item.rel, exc) from None
    with closing(fd):
        info = os.fstat(fd)
        _check_same(plan, item.rel, info)
        if info.st_size > MAX_COPY_BYTES:
            raise refusal(plan.name, item.rel, f"is larger than {MAX_COPY_BYTES} bytes")
        clone_or_copy(fd, target, info.st_mode)
    with closing(os.open(target, READ_FLAGS)) as copy_fd:
        fingerprint = fingerprint_fd(copy_fd, None)
    return ProtectedBind(
        source=target,
        rel=item.rel,
        writable=item.kind != "readonly",
        kind=item.kind,
        fingerprints={"": fingerprint},
    )


def _prepare_hooks(plan: Plan, root_fd: int, item: Item, target: Path) -> ProtectedBind:
    with closing(_open_parent(plan, root_fd, item.rel)) as parent:
        if not item.exists:
            with contextlib.suppress(FileExistsError):
                os.mkdir("hooks", 0o755, dir_fd=parent)
        try:
            fd = open_dir_at(parent, "hooks")
        except (OSError, UnsafePath) as exc:
            raise _changed(plan, item.rel, exc) from None
    with closing(fd):
        info = os.fstat(fd)
        if item.exists:
            _check_same(plan, item.rel, info)
        os.mkdir(target, 0o700)
        budget = [MAX_HOOK_ENTRIES]
        _copy_tree(plan, fd, target, item.rel, budget, depth=0)
        os.chmod(target, stat.S_IMODE(info.st_mode))
    fingerprints: dict[str, Fingerprint] = {}
    with closing(os.open(target, DIR_FLAGS)) as copy_fd:
        tree_fingerprints(copy_fd, "", fingerprints, [MAX_HOOK_ENTRIES + 1], None, depth=0)
    return ProtectedBind(target, item.rel, writable=True, kind="hooks", fingerprints=fingerprints)


def _copy_tree(plan: Plan, src: int, dst: Path, rel: str, budget: list[int], depth: int) -> None:
    """Copy the regular files and directories of `src` into the new directory `dst`."""
    if depth > MAX_DEPTH:
        raise refusal(plan.name, rel, f"is nested deeper than {MAX_DEPTH} directories")
    with os.scandir(src) as it:
        entries = [(e.name, entry_type(e)) for e in it]
    budget[0] -= len(entries)
    if budget[0] < 0:
        raise refusal(plan.name, rel, f"holds more than {MAX_HOOK_ENTRIES} entries to copy")
    for name, kind in entries:
        if kind == "dir":
            child = open_real_dir(src, name)
            if child is None:
                continue
            with closing(child):
                mode = stat.S_IMODE(os.fstat(child).st_mode)
                os.mkdir(dst / name, 0o700)
                _copy_tree(plan, child, dst / name, join(rel, name), budget, depth + 1)
                os.chmod(dst / name, mode)
        elif kind == "file":
            _copy_one(plan, src, name, dst / name, join(rel, name))


def _copy_one(plan: Plan, parent: int, name: str, dst: Path, rel: str) -> None:
    """Copy one regular file of a hooks directory; anything else there is skipped."""
    try:
        fd = open_file_at(parent, name)
    except (FileNotFoundError, NotADirectoryError, UnsafePath):
        return  # gone, or no longer a regular file: nothing to copy
    with closing(fd):
        info = os.fstat(fd)
        if info.st_size > MAX_COPY_BYTES:
            raise refusal(plan.name, rel, f"is larger than {MAX_COPY_BYTES} bytes")
        clone_or_copy(fd, dst, info.st_mode)


def _open_parent(plan: Plan, root_fd: int, rel: str) -> int:
    """A descriptor of the directory holding `rel`, walked from the root with no link."""
    parts = parts_of(rel)
    fd = os.dup(root_fd)
    try:
        for index, part in enumerate(parts[:-1]):
            try:
                child = open_dir_at(fd, part)
            except (OSError, UnsafePath) as exc:
                raise _changed(plan, "/".join(parts[: index + 1]), exc) from None
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
        raise refusal(plan.name, rel, "was replaced since the scan; start the session again")


def _changed(plan: Plan, rel: str, exc: OSError | UnsafePath) -> ProtectionRefused:
    """The refusal for a path that could not be opened as the scan saw it."""
    if isinstance(exc, LinkRefused):
        return refusal(plan.name, rel, "became a symbolic link since the scan (review it)")
    if isinstance(exc, NotRegular):
        return refusal(plan.name, rel, f"is now {describe(exc.mode)}")
    if isinstance(exc, UnsafePath) or exc.errno in GONE:
        return refusal(plan.name, rel, "changed since the scan; start the session again")
    return refusal(plan.name, rel, f"cannot be opened ({exc.strerror})")


def _make_private_dir(path: Path) -> None:
    """Create `path` 0700 (its parents too), or accept it if it is already our own directory."""
    try:
        private_dir(path)
    except NotPrivate as exc:
        raise InvalidInput(f"{escape_name(str(path))} is not a directory of ours") from exc
