"""Project mounts of one session: the operator's folders under /workspace/NAME, protected.

A session names some of the operator's mounts (`corral.mounts`) when it is created. When its
first kernel starts, each mount gets a real, empty mount point in the workspace (made here,
through a directory descriptor: bwrap never has to create it), and each read-write mount is
scanned for what the host trusts (`corral.protect`): per-session copies are bound over those
files. When the last kernel stops, the copies are compared and the names of the protected
files the sandbox changed or created are returned for the operator and the audit log.

A folder may be mounted read-write by one running session at a time (overlapping folders
count), so no other sandbox can swap a path while a sandbox's mounts are being set up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.errors import Conflict, InvalidInput, MountNotFound
from corral.fsafe import closing, lstat_at, open_dir_at
from corral.mounts import MountSpec, check_name, overlapping
from corral.protect import Plan, ProtectedBind, changes, escape_name, prepare, scan
from corral.sandbox.policy import WORKSPACE, Bind


class MountBusy(Conflict):
    """Another running session holds an overlapping folder read-write."""


@dataclass
class PreparedMount:
    """One mount of a running session: its spec, and for read-write ones the protection."""

    spec: MountSpec
    plan: Plan | None
    protected: list[ProtectedBind]
    copies_dir: Path

    def binds(self) -> tuple[Bind, ...]:
        """The project, then each folder that holds a protected path bound onto itself, then
        the copies. A mount point cannot be renamed or removed from inside, so the sandbox
        cannot move `.git` (or `.claude`, ...) aside and build its own beside the copies."""
        dest = f"{WORKSPACE}/{self.spec.name}"
        binds = [Bind(self.spec.path, dest, writable=self.spec.writable)]
        binds += [
            Bind(self.spec.path / folder, f"{dest}/{folder}", writable=True)
            for folder in holding_folders(p.rel for p in self.protected)
        ]
        binds += [Bind(p.source, f"{dest}/{p.rel}", writable=p.writable) for p in self.protected]
        return tuple(binds)

    def report(self) -> list[str]:
        """The protected files the sandbox changed or created; removes the copies."""
        try:
            if self.plan is None:
                return []
            return changes(self.plan, self.protected, self.spec.path)
        finally:
            shutil.rmtree(self.copies_dir, ignore_errors=True)


def holding_folders(rels: Iterable[str]) -> list[str]:
    """Every folder on the way to the protected paths, shallowest first: '.git/modules/a/config'
    gives '.git', '.git/modules', '.git/modules/a'."""
    folders = {
        "/".join(parts[:depth])
        for parts in (rel.split("/") for rel in rels)
        for depth in range(1, len(parts))
    }
    return sorted(folders, key=lambda folder: (folder.count("/"), folder))


def choose_mounts(names: Sequence[str], configured: dict[str, MountSpec]) -> list[str]:
    """The mount names a session asks for, checked against the operator's configuration.

    Raises `MountNotFound` for an unknown name, `InvalidInput` for a repeated one and
    `Conflict` for two that overlap.
    """
    chosen: list[str] = []
    for name in names:
        check_name(name)
        if name not in configured:
            known = ", ".join(sorted(configured)) or "none are configured"
            raise MountNotFound(f"unknown mount {name!r}: the operator's mounts are {known}")
        if name in chosen:
            raise InvalidInput(f"mount {name!r} is named twice")
        for other in chosen:
            if overlapping(configured[name].path, configured[other].path):
                raise Conflict(f"mounts {name!r} and {other!r} overlap; choose one")
        chosen.append(name)
    return chosen


def prepare_mounts(
    specs: Sequence[MountSpec],
    workspace: Path,
    copies_root: Path,
    extra_protected: Sequence[str],
    holder: Callable[[Path], str | None],
) -> list[PreparedMount]:
    """Mount points, exclusivity checks and protected copies for one session run.

    `holder(path)` names another running session holding an overlapping folder read-write,
    or None. Raises `MountBusy`, `InvalidInput` (a bad mount point) or `ProtectionRefused`.
    """
    prepared: list[PreparedMount] = []
    try:
        for spec in specs:
            prepared.append(_prepare_one(spec, workspace, copies_root, extra_protected, holder))
    except Exception:
        for mount in prepared:
            shutil.rmtree(mount.copies_dir, ignore_errors=True)
        raise
    return prepared


def _prepare_one(
    spec: MountSpec,
    workspace: Path,
    copies_root: Path,
    extra_protected: Sequence[str],
    holder: Callable[[Path], str | None],
) -> PreparedMount:
    if spec.writable and (other := holder(spec.path)) is not None:
        raise MountBusy(
            f"mount {spec.name!r} ({spec.path}) is in use read-write by session {other!r}; "
            "stop that session first"
        )
    if not spec.path.is_dir():
        raise InvalidInput(f"mount {spec.name!r}: {spec.path} is no longer a directory")
    make_mount_point(workspace, spec.name)
    copies_dir = copies_root / spec.name
    shutil.rmtree(copies_dir, ignore_errors=True)
    if not spec.writable:
        return PreparedMount(spec, None, [], copies_dir)
    plan = scan(spec.path, extra_protected, name=spec.name)
    try:
        protected = prepare(plan, spec.path, copies_dir)
    except Exception:
        shutil.rmtree(copies_dir, ignore_errors=True)
        raise
    return PreparedMount(spec, plan, protected, copies_dir)


def make_mount_point(workspace: Path, name: str) -> None:
    """Make sure `workspace/name` is a real directory, without following any link.

    The sandbox can write its workspace: an entry it replaced with a link or a file is
    refused (bwrap would otherwise follow it while mounting).
    """
    with closing(open_dir_at(None, workspace)) as fd:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=fd)
        info = lstat_at(fd, name)
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise InvalidInput(
            f"the workspace entry {escape_name(name)!r} is not a directory, so mount "
            f"{escape_name(name)!r} cannot be placed there; delete it from the workspace"
        )
