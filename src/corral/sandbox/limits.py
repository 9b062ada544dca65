"""Which mechanism can enforce per-session limits on this host.

cgroup v2 needs a subtree the server may write (root, or a systemd scope with delegation);
cgroup v1 controllers work when root on a v1 or hybrid host; otherwise rlimits and a
watchdog are the last resort. `corral doctor` reports the answer and how to get a stronger
mechanism.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu")


@dataclass(frozen=True)
class LimitMechanism:
    name: str  # "cgroup2", "cgroup1" or "rlimit"
    detail: str
    advice: str | None


def detect_mechanism(cgroup_root: Path = CGROUP_ROOT) -> LimitMechanism:
    """The strongest mechanism this process can use; reads /sys and /proc only."""
    unified = _unified_mount(cgroup_root)
    if unified is not None:
        own = _own_cgroup2(unified)
        if own is not None and os.access(own, os.W_OK) and _has_controllers(unified):
            return LimitMechanism("cgroup2", f"writable subtree {own}", None)
    if os.geteuid() == 0 and all((cgroup_root / c).is_dir() for c in V1_CONTROLLERS):
        return LimitMechanism(
            "cgroup1",
            f"root with v1 controllers {', '.join(V1_CONTROLLERS)} under {cgroup_root}",
            "a host with the unified cgroup v2 hierarchy gives finer accounting",
        )
    return LimitMechanism(
        "rlimit",
        "per-process rlimits and a watchdog",
        "run corral under a systemd user scope with Delegate=yes "
        "(systemd-run --user --scope -p Delegate=yes corral serve) for cgroup v2 limits",
    )


def _unified_mount(cgroup_root: Path) -> Path | None:
    if (cgroup_root / "cgroup.controllers").is_file():
        return cgroup_root
    if (cgroup_root / "unified" / "cgroup.controllers").is_file():
        return cgroup_root / "unified"
    return None


def _has_controllers(unified: Path) -> bool:
    try:
        controllers = (unified / "cgroup.controllers").read_text().split()
    except OSError:
        return False
    return {"memory", "pids"} <= set(controllers)


def _own_cgroup2(unified: Path) -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return unified / line[3:].lstrip("/")
    return None
