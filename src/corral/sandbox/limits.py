"""Per-session limits as data, and which mechanism can enforce them on this host.

cgroup v2 needs a subtree the server may write (root, or a systemd scope with delegation);
cgroup v1 controllers work when root on a v1 or hybrid host; otherwise rlimits and a
watchdog are the last resort. `corral doctor` reports the answer for each limit and how to
get a stronger mechanism. The enforcement itself lives in `corral.sandbox.boxes`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from corral.errors import InvalidInput

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
MECHANISMS = ("cgroup2", "cgroup1", "rlimit")

KIB = 1024
# A size as text: ASCII digits and blanks only, so that the REST document can say it exactly.
SIZE_TEXT = r"[ \t]*([0-9]+(?:\.[0-9]+)?)[ \t]*([kKmMgGtT]?)([iI]?[bB]?)[ \t]*"
_SIZE = re.compile(SIZE_TEXT)
_UNITS = {"": 1, "k": KIB, "m": KIB**2, "g": KIB**3, "t": KIB**4}


@dataclass(frozen=True)
class Limits:
    """How far one session may go. Memory includes its tmpfs; swap is always off."""

    memory_bytes: int
    cpus: float
    tasks: int
    workspace_bytes: int
    tmp_bytes: int
    exec_timeout_s: float
    idle_timeout_s: float
    output_bytes: int
    # Files and directories in the workspace, package prefix and run directories.
    workspace_files: int = 200_000

    def changed(self, changes: dict[str, Any]) -> Limits:
        """A copy with `changes` applied; raises `InvalidInput` for an unknown or bad value."""
        known = {spec.name: spec for spec in fields(self)}
        parsed: dict[str, Any] = {}
        for name, raw in changes.items():
            if name not in known:
                raise InvalidInput(f"unknown limit {name!r}: choose among {', '.join(known)}")
            parsed[name] = _parse_limit(name, raw)
        return replace(self, **parsed)


# Limits that change a running sandbox at once; the others apply from the next kernel start.
LIVE_LIMITS = frozenset(
    {"memory_bytes", "cpus", "tasks", "workspace_bytes", "exec_timeout_s", "idle_timeout_s"}
    | {"output_bytes", "workspace_files"}
)
MIN_MEMORY_BYTES = 128 * KIB**2  # a kernel needs about 75 MiB resident to start
MIN_TASKS = 8
MIN_WORKSPACE_FILES = 100  # a package prefix and a run directory hold about 20
# Upper bounds every mechanism can hold (setrlimit takes a C long; pids.max stops at the
# kernel's PID_MAX_LIMIT): far past any host, and a refusal rather than an overflow.
MAX_SIZE_BYTES = 2**53  # 8192 TiB, also the largest integer a JSON client keeps exactly
MAX_TASKS = 4_194_304
MAX_WORKSPACE_FILES = 2**32
_MAXIMA = {"tasks": MAX_TASKS, "workspace_files": MAX_WORKSPACE_FILES}


def _parse_limit(name: str, raw: Any) -> int | float:
    if name.endswith("_bytes"):
        value: int | float = parse_size(raw) if isinstance(raw, str) else _number(name, raw)
        value = int(value)
    elif name in ("tasks", "workspace_files"):
        value = int(_number(name, raw))
    else:
        value = float(_number(name, raw))
    if value <= 0:
        raise InvalidInput(f"limit {name} must be positive, not {raw!r}")
    if name == "memory_bytes" and value < MIN_MEMORY_BYTES:
        raise InvalidInput(f"limit memory_bytes must be at least {format_size(MIN_MEMORY_BYTES)}")
    if name == "tasks" and value < MIN_TASKS:
        raise InvalidInput(f"limit tasks must be at least {MIN_TASKS}")
    if name == "workspace_files" and value < MIN_WORKSPACE_FILES:
        raise InvalidInput(f"limit workspace_files must be at least {MIN_WORKSPACE_FILES}")
    if name.endswith("_bytes") and value > MAX_SIZE_BYTES:
        raise InvalidInput(f"limit {name} must be at most {format_size(MAX_SIZE_BYTES)}")
    if value > _MAXIMA.get(name, math.inf):
        raise InvalidInput(f"limit {name} must be at most {_MAXIMA[name]}")
    return value


def _number(name: str, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise InvalidInput(f"limit {name} must be a number, not {raw!r}")
    try:
        value = float(raw)
    except ValueError as exc:
        raise InvalidInput(f"limit {name} must be a number, not {raw!r}") from exc
    if not math.isfinite(value):
        raise InvalidInput(f"limit {name} must be a finite number, not {raw!r}")
    return value


def parse_size(text: str) -> int:
    """Bytes from '2G', '512MiB', '1.5g' or '1000'; units are powers of 1024."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise InvalidInput(f"{text!r} is not a size: write e.g. 512M, 2G or 1073741824")
    number, unit, _ = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(size: int) -> str:
    """'2 GiB', '512 MiB' or '1000 B': the largest unit that keeps one decimal honest."""
    for unit, factor in (("TiB", KIB**4), ("GiB", KIB**3), ("MiB", KIB**2), ("KiB", KIB)):
        if size >= factor:
            value = size / factor
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class LimitMechanism:
    name: str  # "cgroup2", "cgroup1" or "rlimit"
    detail: str
    advice: str | None
    path: Path | None = None  # cgroup2: the writable subtree; cgroup1: the cgroup root


def detect_mechanism(cgroup_root: Path = CGROUP_ROOT) -> LimitMechanism:
    """The strongest mechanism this process can use; reads /sys and /proc only."""
    unified = _unified_mount(cgroup_root)
    if unified is not None:
        own = own_cgroup2(unified)
        if own is not None and os.access(own, os.W_OK) and _has_v2_controllers(unified):
            return LimitMechanism("cgroup2", f"writable subtree {own}", None, own)
    if os.geteuid() == 0 and all((cgroup_root / c).is_dir() for c in V1_CONTROLLERS):
        return LimitMechanism(
            "cgroup1",
            f"root with v1 controllers {', '.join(V1_CONTROLLERS)} under {cgroup_root}",
            "a host with the unified cgroup v2 hierarchy gives finer accounting",
            cgroup_root,
        )
    return LimitMechanism(
        "rlimit",
        "per-process rlimits and a watchdog",
        "memory, cpu and tasks are held by a watchdog (best effort); a delegated cgroup "
        "makes them hard limits (`corral doctor` says how on this host)",
    )


def choose_mechanism(forced: str, cgroup_root: Path = CGROUP_ROOT) -> LimitMechanism:
    """The detected mechanism, or the rlimit fallback when the operator forces it."""
    detected = detect_mechanism(cgroup_root)
    if forced in ("", "auto"):
        return detected
    if forced == detected.name:  # still the operator's choice: doctor says so
        return replace(detected, detail=f"{detected.detail} (forced)")
    if forced == "rlimit":
        return LimitMechanism("rlimit", "per-process rlimits and a watchdog (forced)", None)
    if forced not in MECHANISMS:
        raise InvalidInput(f"unknown limit mechanism {forced!r}: use auto, {', '.join(MECHANISMS)}")
    raise InvalidInput(f"limit mechanism {forced} is not available here ({detected.detail})")


# How each limit is enforced by each mechanism, for `corral doctor` and the README.
ENFORCEMENT: dict[str, dict[str, str]] = {
    "cgroup2": {
        "memory": "memory.max (tmpfs pages included), memory.swap.max=0; OOM kills counted",
        "cpu": "cpu.max quota",
        "tasks": "pids.max",
    },
    "cgroup1": {
        "memory": "memory.limit_in_bytes and memsw (tmpfs pages included, no swap)",
        "cpu": "cpu.cfs_quota_us",
        "tasks": "pids.max",
    },
    "rlimit": {
        "memory": "a watchdog on the total resident memory (RSS, then PSS) of the session's "
        "process trees, killing the largest past the limit, every 50 ms; RLIMIT_DATA per "
        "process (tmpfs bounded by its own size only)",
        "cpu": "a watchdog that stops (SIGSTOP) and continues the session's process trees "
        "against the quota, every 50 ms; nice 10",
        "tasks": "a watchdog that kills a sandbox whose process tree grows past the limit",
    },
}
# Limits a mechanism holds only by looking (a watchdog between two looks lets a tree
# overshoot): `corral doctor` marks them weak, the limits report lists them.
BEST_EFFORT: dict[str, tuple[str, ...]] = {
    "cgroup2": (),
    "cgroup1": (),
    "rlimit": ("memory", "cpu", "tasks"),
}
# Held by the server's looking on every mechanism: no kernel bound on a directory tree
# without a quota-enabled filesystem (see sandbox/disk.py).
HOST_SIDE_BEST_EFFORT = ("workspace",)
HOST_SIDE = {
    "workspace": "RLIMIT_FSIZE per file and a patrol on the bytes and files of the "
    "workspace, package prefix and run directory, busy or idle (looked at within 10 ms of a "
    "possible crossing; writers are stopped about one tick of writing past it)",
    "tmpfs": "size= on the /tmp, /dev/shm and home tmpfs",
    "time": "the server interrupts, then restarts the kernel after a grace period",
    "output": "the server cuts output past the cap",
    "idle": "the server's idle reaper stops the kernels",
}


def enforcement(mechanism: str) -> dict[str, str]:
    """Each limit and what enforces it under `mechanism`."""
    return {**ENFORCEMENT[mechanism], **HOST_SIDE}


def best_effort(mechanism: str) -> tuple[str, ...]:
    """The limits held only on a best-effort basis (by a watchdog) under `mechanism`: its
    own (`BEST_EFFORT`, which a stronger mechanism would make hard) and the workspace."""
    return BEST_EFFORT[mechanism] + HOST_SIDE_BEST_EFFORT


def v2_controllers_available(cgroup_root: Path = CGROUP_ROOT) -> bool:
    """Whether the unified hierarchy offers memory, pids and cpu (not on a hybrid v1
    host, where those controllers are bound to v1 hierarchies)."""
    unified = _unified_mount(cgroup_root)
    return unified is not None and _has_v2_controllers(unified)


def _unified_mount(cgroup_root: Path) -> Path | None:
    if (cgroup_root / "cgroup.controllers").is_file():
        return cgroup_root
    if (cgroup_root / "unified" / "cgroup.controllers").is_file():
        return cgroup_root / "unified"
    return None


def _has_v2_controllers(unified: Path) -> bool:
    try:
        controllers = (unified / "cgroup.controllers").read_text().split()
    except OSError:
        return False
    return set(V2_CONTROLLERS) <= set(controllers)


def own_cgroup2(unified: Path) -> Path | None:
    """The unified-hierarchy cgroup this process is in, as a path under `unified`."""
    for line in _proc_cgroup_lines():
        if line.startswith("0::"):
            return unified / line[3:].lstrip("/")
    return None


def own_cgroup1(cgroup_root: Path, controller: str) -> Path:
    """This process's cgroup in the v1 hierarchy of `controller` (its root when unknown)."""
    for line in _proc_cgroup_lines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return cgroup_root / controller / path.lstrip("/")
    return cgroup_root / controller


def _proc_cgroup_lines() -> list[str]:
    try:
        return Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
