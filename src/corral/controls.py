"""The operator's per-session controls: limits and the SSH agent bridge, as reports.

`Service` applies the changes (and audits them); this module holds what it answers, typed,
and the rules that are not the service's plumbing: which changed limits apply at once.
The REST routes answer them in their models' shapes (`corral.server.schemas`), which the
CLI reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from corral.kernels.session import Session
from corral.sandbox.limits import LIVE_LIMITS, Limits, best_effort, enforcement


@dataclass(frozen=True)
class LimitsUsage:
    """What a running session's sandboxes hold now."""

    memory_bytes: int
    tasks: int
    cpu_seconds: float  # CPU time (user and system) of the processes running now


@dataclass(frozen=True)
class LimitsReport:
    """A session's limits, what enforces each one, and its usage while it runs.

    `best_effort` names the limits this host's mechanism holds only by a watchdog (they may
    be overshot between two looks): the workspace always, memory, cpu and tasks under rlimits.

    After a change, `changed_now` lists the limits the running sandboxes took at once and
    `changed_at_next_start` the others; both are None for a plain look.
    """

    session_id: str
    limits: Limits
    mechanism: str
    enforcement: dict[str, str]
    usage: LimitsUsage | None
    workspace_bytes_used: int | None
    workspace_files_used: int | None
    best_effort: tuple[str, ...] = ()
    changed_now: tuple[str, ...] | None = None
    changed_at_next_start: tuple[str, ...] | None = None


@dataclass(frozen=True)
class BridgeReport:
    """A session's SSH agent bridge switch; `active` is whether its running sandboxes have
    it, `restart_needed` whether they must restart for the switch to hold."""

    session_id: str
    ssh_agent: bool
    active: bool
    restart_needed: bool


def limits_report(session: Session, mechanism: str) -> LimitsReport:
    box = session.box
    usage = None
    if box is not None:
        current = box.usage()
        usage = LimitsUsage(
            memory_bytes=current.memory_bytes,
            tasks=current.tasks,
            cpu_seconds=cpu_seconds(box.processes()),
        )
    return LimitsReport(
        session_id=session.id,
        limits=session.limits,
        mechanism=mechanism,
        enforcement=enforcement(mechanism),
        usage=usage,
        workspace_bytes_used=session.disk.usage,
        workspace_files_used=session.disk.files,
        best_effort=best_effort(mechanism),
    )


def cpu_seconds(pids: Iterable[int]) -> float:
    """The CPU time the processes `pids` have used (one that just ended counts nothing)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def change_limits(session: Session, changes: dict[str, Any]) -> set[str]:
    """Apply `changes` to the session and its running sandboxes; returns the names that
    took effect at once. Raises `InvalidInput` for an unknown or bad value and
    `LimitRefused` when the kernel refuses (memory below what is in use): then nothing
    changed. The operator's overrides in `session.options` are updated; the caller stores
    them."""
    new = session.limits.changed(changes)
    deferred: set[str] = set()
    if session.box is not None:
        deferred = session.box.apply(new)
    running = session.box is not None
    session.limits = new
    overrides = dict(session.options.get("limits", {}))
    overrides.update({name: getattr(new, name) for name in changes})
    session.options["limits"] = overrides
    return {n for n in changes if running and n in LIVE_LIMITS and n not in deferred}


def switch_bridge(session: Session, enabled: bool) -> BridgeReport:
    """Set the session's bridge switch (the caller stores the options); it takes effect
    when its kernels next start."""
    session.options["bridge"] = enabled
    active = session.run is not None and session.run.bridge is not None
    return BridgeReport(
        session_id=session.id,
        ssh_agent=enabled,
        active=active,
        restart_needed=session.run is not None and active != enabled,
    )
