"""Project mounts of one session: the operator's folders under /workspace/NAME.

A session names some of the operator's mounts (`corral.mounts`) when it is created. When its
sandbox starts, each mount gets a real, empty mount point in the workspace (made here,
through a directory descriptor: bwrap never has to create it). A read-only mount is a
read-only bind. A read-write mount is an overlay: the sandbox reads the host folder as it is
and writes into a per-session upper layer, which `protect.sync.OverlaySync` applies to the
host folder as it changes, dropping (and reporting, through `on_dropped`) every path the
host would run or trust (`protect.trusted`). The last pass runs when the sandbox has ended.

A folder may be mounted read-write by one running session at a time (overlapping folders
count): two overlays over one folder would each apply its own view.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.errors import Conflict, InvalidInput, MountNotFound
from corral.fsafe import closing, lstat_at, open_dir_at
from corral.mounts import MountSpec, check_name, overlapping
from corral.protect import escape_name
from corral.protect.sync import OverlaySync, remove_layers
from corral.sandbox.policy import WORKSPACE, Bind, Mount, Overlay

DroppedHook = Callable[[str, list[str]], None]  # (mount name, paths dropped)


class MountBusy(Conflict):
    """Another running session holds an overlapping folder read-write."""


@dataclass
class PreparedMount:
    """One mount of a running session: its spec, and for a read-write one its overlay's
    folders (`layers`: `upper/` and `work/`) and the sync that applies them."""

    spec: MountSpec
    layers: Path
    sync: OverlaySync | None = None

    def binds(self) -> tuple[Mount, ...]:
        dest = f"{WORKSPACE}/{self.spec.name}"
        if self.sync is None:
            return (Bind(self.spec.path, dest),)
        return (Overlay(self.spec.path, self.layers / "upper", self.layers / "work", dest),)

    def close(self) -> None:
        """The last pass of the sync, once the sandbox has ended; then the layers go."""
        if self.sync is None:
            return
        try:
            self.sync.sync()
        finally:
            remove_layers(self.layers)


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
    layers_root: Path,
    extra_protected: Sequence[str],
    holder: Callable[[Path], str | None],
    on_dropped: DroppedHook,
) -> list[PreparedMount]:
    """Mount points, exclusivity checks and overlay folders for one session run.

    `holder(path)` names another running session holding an overlapping folder read-write,
    or None. Layers a server that died left are applied first. Raises `MountBusy` or
    `InvalidInput` (a bad mount point).
    """
    prepared: list[PreparedMount] = []
    try:
        for spec in specs:
            prepared.append(
                _prepare_one(spec, workspace, layers_root, extra_protected, holder, on_dropped)
            )
    except Exception:
        for mount in prepared:
            remove_layers(mount.layers)
        raise
    return prepared


def _prepare_one(
    spec: MountSpec,
    workspace: Path,
    layers_root: Path,
    extra_protected: Sequence[str],
    holder: Callable[[Path], str | None],
    on_dropped: DroppedHook,
) -> PreparedMount:
    if spec.writable and (other := holder(spec.path)) is not None:
        raise MountBusy(
            f"mount {spec.name!r} ({spec.path}) is in use read-write by session {other!r}; "
            "stop that session first"
        )
    if not spec.path.is_dir():
        raise InvalidInput(f"mount {spec.name!r}: {spec.path} is no longer a directory")
    make_mount_point(workspace, spec.name)
    layers = layers_root / spec.name
    if not spec.writable:
        return PreparedMount(spec, layers)
    report = functools.partial(on_dropped, spec.name)
    if layers.exists():  # left by a server that died while the session ran
        left = OverlaySync(spec.path, layers / "upper", extra_protected, report)
        PreparedMount(spec, layers, left).close()
    for folder in (layers, layers / "upper", layers / "work"):
        folder.mkdir(mode=0o700, parents=True)
    sync = OverlaySync(spec.path, layers / "upper", extra_protected, report)
    return PreparedMount(spec, layers, sync)


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
