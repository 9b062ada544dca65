"""Enforcing one session's limits: a cgroup v2 or v1 "box", or rlimits with a watchdog.

Every sandbox with a box starts behind a gate (`corral.sandbox.launch`): a shell that waits
for one line on stdin before it execs bwrap. While it waits, the launcher puts its pid under
the box's limits (`LimitBox.admit`), so nothing of the sandbox ever runs outside them.
Every process the sandbox starts inherits the cgroup and the rlimits; none can leave them
(no capability, no cgroup namespace view of the host, no writable /sys).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from corral.errors import Conflict, SandboxUnavailable
from corral.sandbox import watchdog
from corral.sandbox.limits import LimitMechanism, Limits, format_size, own_cgroup1
from corral.sandbox.watchdog import CpuThrottle

CPU_PERIOD_US = 100_000
NICE = 10
REMOVE_WAIT_S = 3.0
REMOVE_POLL_MAX_S = 0.02


class LimitRefused(Conflict):
    """The kernel refused a new limit (for example memory below what is in use)."""


@dataclass(frozen=True)
class Counters:
    """Cumulative limit events of one box: kills by the OOM killer, refused forks."""

    oom_kills: int = 0
    task_refusals: int = 0


@dataclass(frozen=True)
class Usage:
    memory_bytes: int
    tasks: int


class LimitBox:
    """The limits of one session. Subclasses enforce them; this base sets file limits."""

    mechanism = "none"

    def __init__(self, name: str, limits: Limits) -> None:
        self.name = name
        self.limits = limits
        self.pids: set[int] = set()

    def create(self) -> None:
        """Make the box and write its limits. Raises `SandboxUnavailable` when it cannot."""

    def admit(self, pid: int) -> None:
        """Put the gated process `pid` (not yet running the sandbox) under the limits."""
        self.pids.add(pid)
        set_file_limits(pid, self.limits)

    def apply(self, limits: Limits) -> set[str]:
        """Change the limits of the running sandboxes; raises `LimitRefused`.

        Returns the limits that only a restart applies in full: raising an rlimit of a
        running process needs CAP_SYS_RESOURCE, which a server in a container may lack.
        """
        self.limits = limits
        deferred: set[str] = set()
        for pid in self._tree():
            if not _set_live(pid, resource.RLIMIT_FSIZE, limits.workspace_bytes):
                deferred.add("workspace_bytes")
        return deferred

    def forget(self, pid: int) -> None:
        self.pids.discard(pid)

    def counters(self) -> Counters:
        return Counters()

    def usage(self) -> Usage:
        tree = self._tree()
        return Usage(sum(_rss(pid) for pid in tree), len(tree))

    def freeze(self) -> None:
        """Stop every process of the box until `thaw` (used while a sibling sandbox starts)."""

    def thaw(self) -> None:
        """Let the processes stopped by `freeze` run again."""

    def remove(self) -> None:
        """Remove the box once its processes are gone."""

    async def watch(self) -> None:
        """Run for the box's life where the mechanism needs a watchdog (rlimit)."""

    def processes(self) -> list[int]:
        """Every process of the box now, as cheaply as the mechanism allows (here: walked
        down from the gated roots through /proc)."""
        return [pid for root in list(self.pids) for pid in watchdog.tree_pids(root)]

    def _tree(self) -> list[int]:
        """Every live process of the admitted sandboxes, the gated roots first."""
        found: list[int] = []
        for pid in list(self.pids):
            try:
                root = psutil.Process(pid)
                found += [pid, *(child.pid for child in root.children(recursive=True))]
            except psutil.Error:
                self.pids.discard(pid)
        return found


def set_file_limits(pid: int, limits: Limits) -> None:
    """No file past the workspace limit (one file cannot fill the disk) and no core dumps."""
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limits.workspace_bytes, limits.workspace_bytes))
    resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))


def _set_live(pid: int, which: int, value: int) -> bool:
    """Set one rlimit of a running process; False when it could not be raised (EPERM)."""
    try:
        resource.prlimit(pid, which, (value, value))
    except PermissionError:
        return False
    except (OSError, ValueError):
        pass  # the process is gone
    return True


def _rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


# -- cgroup v1 ---------------------------------------------------------------------------


class CgroupV1Box(LimitBox):
    """One cgroup per controller (memory, pids, cpu) under the server's own, and one freezer
    cgroup per kernel, so a session's other kernels can be frozen while a new one starts."""

    mechanism = "cgroup1"

    def __init__(self, name: str, limits: Limits, root: Path) -> None:
        super().__init__(name, limits)
        parent = f"corral-{os.getpid()}"
        self.dirs = {
            controller: own_cgroup1(root, controller) / parent / name
            for controller in ("memory", "pids", "cpu", "freezer")
        }
        self.frozen: list[Path] = []

    def create(self) -> None:
        try:
            for path in self.dirs.values():
                path.mkdir(parents=True, exist_ok=True)
            _write(self.dirs["memory"] / "memory.swappiness", "0", optional=True)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot create cgroup {self.dirs['memory']}: {exc}") from exc
        self._write_limits(self.limits, None)

    def admit(self, pid: int) -> None:
        for controller in ("memory", "pids", "cpu"):
            _write(self.dirs[controller] / "cgroup.procs", str(pid))
        leaf = self.dirs["freezer"] / f"k{pid}"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(pid))
        super().admit(pid)

    def forget(self, pid: int) -> None:
        super().forget(pid)
        _rmdir_when_empty(self.dirs["freezer"] / f"k{pid}")

    def apply(self, limits: Limits) -> set[str]:
        old = self.limits
        self._write_limits(limits, old)
        return super().apply(limits)

    def _write_limits(self, limits: Limits, old: Limits | None) -> None:
        memory = self.dirs["memory"]
        pair = [("memory.limit_in_bytes", False), ("memory.memsw.limit_in_bytes", True)]
        # memsw must stay >= the memory limit: raise it first, lower it last. The cgroup may
        # be left from an earlier run, so its current value decides, not `old`.
        if limits.memory_bytes > _read_int(memory / "memory.limit_in_bytes"):
            pair.reverse()
        for filename, optional in pair:
            _write_limit(memory / filename, str(limits.memory_bytes), "memory", optional)
        _write_limit(self.dirs["pids"] / "pids.max", str(limits.tasks), "tasks")
        cpu = self.dirs["cpu"]
        _write_limit(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US), "cpus")
        _write_limit(cpu / "cpu.cfs_quota_us", str(_quota_us(limits.cpus)), "cpus")

    def counters(self) -> Counters:
        oom = _keyed(self.dirs["memory"] / "memory.oom_control").get("oom_kill", 0)
        refused = _keyed(self.dirs["pids"] / "pids.events").get("max", 0)
        return Counters(oom, refused)

    def processes(self) -> list[int]:
        return _pids_in(self.dirs["pids"] / "cgroup.procs")

    def usage(self) -> Usage:
        memory = _read_int(self.dirs["memory"] / "memory.usage_in_bytes")
        tasks = _read_int(self.dirs["pids"] / "pids.current")
        return Usage(memory, tasks)

    def freeze(self) -> None:
        self.frozen = _leaves(self.dirs["freezer"])
        for leaf in self.frozen:
            _write(leaf / "freezer.state", "FROZEN")
        for leaf in self.frozen:
            _wait_for(functools.partial(_frozen_v1, leaf))

    def thaw(self) -> None:
        for leaf in self.frozen:
            _write(leaf / "freezer.state", "THAWED", optional=True)
        self.frozen = []

    def remove(self) -> None:
        self.thaw()
        for path in self.dirs.values():
            for leaf in _leaves(path):
                _kill_procs(leaf / "cgroup.procs")
                _rmdir_when_empty(leaf)
            _kill_procs(path / "cgroup.procs")
            _rmdir_when_empty(path)
            with contextlib.suppress(OSError):
                path.parent.rmdir()  # the server's parent, once its last session is gone


def sweep_stale_v1(root: Path) -> int:
    """Remove the empty cgroups a server that died without cleaning up left behind.

    Sandboxes die with their server (bwrap's --die-with-parent), so a `corral-PID` tree whose
    server is gone holds no process; it is removed bottom-up. Returns how many were removed.
    """
    removed = 0
    for controller in ("memory", "pids", "cpu", "freezer"):
        for tree in own_cgroup1(root, controller).glob("corral-*"):
            pid = tree.name.removeprefix("corral-")
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                removed += _remove_tree(tree)
    return removed


def _remove_tree(path: Path) -> int:
    removed = 0
    for child in _subdirs(path):
        removed += _remove_tree(child)
    with contextlib.suppress(OSError):
        path.rmdir()
        removed += 1
    return removed


def _subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []


# -- cgroup v2 ---------------------------------------------------------------------------


class CgroupV2Box(LimitBox):
    """One cgroup under `<server's cgroup>/corral-sessions` holding the limits, with one leaf
    per kernel (cgroup v2 keeps processes in leaves), each frozen on its own."""

    mechanism = "cgroup2"

    def __init__(self, name: str, limits: Limits, subtree: Path) -> None:
        super().__init__(name, limits)
        self.subtree = subtree
        self.dir = subtree / "corral-sessions" / name
        self.frozen: list[Path] = []

    def create(self) -> None:
        try:
            prepare_v2_subtree(self.subtree)
            self.dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot create cgroup {self.dir}: {exc}") from exc
        self._write_limits(self.limits)

    def admit(self, pid: int) -> None:
        leaf = self.dir / f"k{pid}"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(pid))
        super().admit(pid)

    def forget(self, pid: int) -> None:
        super().forget(pid)
        _rmdir_when_empty(self.dir / f"k{pid}")

    def apply(self, limits: Limits) -> set[str]:
        self._write_limits(limits)
        return super().apply(limits)

    def _write_limits(self, limits: Limits) -> None:
        _write_limit(self.dir / "memory.max", str(limits.memory_bytes), "memory")
        _write_limit(self.dir / "memory.swap.max", "0", "memory", optional=True)
        _write_limit(self.dir / "pids.max", str(limits.tasks), "tasks")
        _write_limit(self.dir / "cpu.max", f"{_quota_us(limits.cpus)} {CPU_PERIOD_US}", "cpus")

    def counters(self) -> Counters:
        oom = _keyed(self.dir / "memory.events").get("oom_kill", 0)
        refused = _keyed(self.dir / "pids.events").get("max", 0)
        return Counters(oom, refused)

    def processes(self) -> list[int]:
        return [pid for leaf in _leaves(self.dir) for pid in _pids_in(leaf / "cgroup.procs")]

    def usage(self) -> Usage:
        return Usage(_read_int(self.dir / "memory.current"), _read_int(self.dir / "pids.current"))

    def freeze(self) -> None:
        self.frozen = _leaves(self.dir)
        for leaf in self.frozen:
            _write(leaf / "cgroup.freeze", "1")
        for leaf in self.frozen:
            _wait_for(functools.partial(_frozen_v2, leaf))

    def thaw(self) -> None:
        for leaf in self.frozen:
            _write(leaf / "cgroup.freeze", "0", optional=True)
        self.frozen = []

    def remove(self) -> None:
        self.thaw()
        for leaf in [*_leaves(self.dir), self.dir]:
            if not _write(leaf / "cgroup.kill", "1", optional=True):
                _kill_procs(leaf / "cgroup.procs")
        for leaf in _leaves(self.dir):
            _rmdir_when_empty(leaf)
        _rmdir_when_empty(self.dir)


def prepare_v2_subtree(own: Path) -> None:
    """Delegate memory, pids and cpu below `own`, moving this server into a leaf first.

    cgroup v2 lets a cgroup hand controllers to its children only when it holds no process
    itself, so the server moves into `own/corral-server`; sessions live in
    `own/corral-sessions`. Raises `OSError` when another process shares `own`.
    """
    sessions = own / "corral-sessions"
    if (sessions / "cgroup.subtree_control").is_file() and "memory" in _read(
        sessions / "cgroup.subtree_control"
    ):
        return
    leaf = own / "corral-server"
    leaf.mkdir(exist_ok=True)
    _write(leaf / "cgroup.procs", str(os.getpid()))
    controllers = "+memory +pids +cpu"
    _write(own / "cgroup.subtree_control", controllers)
    sessions.mkdir(exist_ok=True)
    _write(sessions / "cgroup.subtree_control", controllers)


# -- rlimits and a watchdog ----------------------------------------------------------------


class RlimitBox(LimitBox):
    """Per-process rlimits and the watchdog (`corral.sandbox.watchdog`): memory as a total
    over the session's process trees, tasks, and a CPU quota by stopping and continuing.

    RLIMIT_DATA stays as a per-process bound (one allocation past the limit fails with
    MemoryError at once instead of waiting for the watchdog's next look). RLIMIT_NPROC is
    not used: it counts every process of the user on the whole host, so it cannot bound one
    session. What the watchdog holds is best effort: a tree may overshoot by what it
    allocates or forks between two looks.
    """

    mechanism = "rlimit"

    def __init__(self, name: str, limits: Limits) -> None:
        super().__init__(name, limits)
        self.kills = 0  # trees killed for tasks
        self.memory_kills = 0
        self.frozen: list[int] = []
        self.throttle = CpuThrottle()

    def admit(self, pid: int) -> None:
        super().admit(pid)
        _set_memory_limit(pid, self.limits.memory_bytes)
        os.setpriority(os.PRIO_PROCESS, pid, NICE)

    def apply(self, limits: Limits) -> set[str]:
        deferred = super().apply(limits)
        for pid in self._tree():
            if not _set_live(pid, resource.RLIMIT_DATA, limits.memory_bytes):
                deferred.add("memory_bytes")
        return deferred

    def counters(self) -> Counters:
        return Counters(self.memory_kills, self.kills)

    def freeze(self) -> None:
        self.frozen = watchdog.signal_trees(list(self.pids), signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self.frozen:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def remove(self) -> None:
        for root in list(self.pids):
            watchdog.kill_tree(root)  # stopped by the throttle or not, nothing stays

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(watchdog.TICK_S)
            await asyncio.to_thread(self.check)

    def check(self) -> None:
        """One look at every tree: kill the largest past the memory or task limit, then
        stop or continue them all against the CPU quota."""
        trees = {root: watchdog.sample_tree(root) for root in list(self.pids)}
        for root, tree in trees.items():
            if not tree:
                self.pids.discard(root)
        trees = {root: tree for root, tree in trees.items() if tree}
        passed = watchdog.over_limit(
            trees, memory_bytes=self.limits.memory_bytes, tasks=self.limits.tasks
        )
        if passed is not None:
            limit, victim = passed
            if limit == "tasks":
                self.kills += 1
            else:
                self.memory_kills += 1
            watchdog.kill_tree(victim)
            return
        self._hold_cpu([s for tree in trees.values() for s in tree])

    def _hold_cpu(self, samples: list[watchdog.Sample]) -> None:
        """Stop every tree while the CPU budget is spent; continue them once it is paid
        back, unless `freeze` holds them."""
        stop = self.throttle.decide(samples, self.limits.cpus)
        if stop:
            watchdog.signal_trees(list(self.pids), signal.SIGSTOP)
        elif self.throttle.stopped and not self.frozen:
            watchdog.signal_trees(list(self.pids), signal.SIGCONT)
        self.throttle.stopped = stop or bool(self.frozen and self.throttle.stopped)


def _set_memory_limit(pid: int, memory_bytes: int) -> None:
    resource.prlimit(pid, resource.RLIMIT_DATA, (memory_bytes, memory_bytes))


# -- choosing ------------------------------------------------------------------------------


def make_box(mechanism: LimitMechanism, name: str, limits: Limits) -> LimitBox:
    """The box for one session under `mechanism` (see `limits.choose_mechanism`)."""
    if mechanism.name == "cgroup2" and mechanism.path is not None:
        return CgroupV2Box(name, limits, mechanism.path)
    if mechanism.name == "cgroup1" and mechanism.path is not None:
        return CgroupV1Box(name, limits, mechanism.path)
    return RlimitBox(name, limits)


def describe_hit(limit: str, limits: Limits) -> str:
    """The sentence a result carries when `limit` stopped its code."""
    return {
        "memory": f"out of memory: the session's {format_size(limits.memory_bytes)} "
        "memory limit was reached",
        "tasks": f"the session's limit of {limits.tasks} tasks (processes and threads) "
        "was reached; processes still running keep their places until the session restarts",
        "disk": f"a filesystem of the session is full: the workspace holds at most "
        f"{format_size(limits.workspace_bytes)} (no file may be larger) and "
        f"{limits.workspace_files} files, /tmp {format_size(limits.tmp_bytes)}; "
        "delete files to make room",
    }[limit]


# -- cgroup file helpers --------------------------------------------------------------------


def _quota_us(cpus: float) -> int:
    return max(1000, int(cpus * CPU_PERIOD_US))


def _write(path: Path, value: str, *, optional: bool = False) -> bool:
    """Write one cgroup file; False when `optional` and the file does not exist."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        if optional:
            return False
        raise
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
    return True


def _write_limit(path: Path, value: str, limit: str, optional: bool = False) -> None:
    try:
        _write(path, value, optional=optional)
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.EINVAL):
            raise LimitRefused(
                f"the kernel refused {limit}={value} ({exc.strerror}): "
                "the session may already use more than that"
            ) from exc
        raise SandboxUnavailable(f"cannot set {limit} in {path}: {exc}") from exc


def _read(path: Path) -> str:
    """A small cgroup file's text, or "" when it cannot be read. Raw descriptors: this runs
    twice per execution, and a text-mode open costs several times more."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, 65536).decode("ascii", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _read_int(path: Path) -> int:
    try:
        return int(_read(path).split()[0])
    except (IndexError, ValueError):
        return 0


def _keyed(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file ('oom_kill 3' lines) as a dict."""
    values: dict[str, int] = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            values[key] = int(value)
    return values


def _frozen_v1(leaf: Path) -> bool:
    return _read(leaf / "freezer.state").strip() == "FROZEN"


def _frozen_v2(leaf: Path) -> bool:
    return _keyed(leaf / "cgroup.events").get("frozen") == 1


def _leaves(path: Path) -> list[Path]:
    """The per-kernel child cgroups of a session cgroup."""
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and p.name.startswith("k"))
    except OSError:
        return []


def _pids_in(procs: Path) -> list[int]:
    """The pids a cgroup.procs file lists (none when it cannot be read)."""
    return [int(word) for word in _read(procs).split() if word.isdigit()]


def _kill_procs(procs: Path) -> None:
    for line in _read(procs).split():
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(line), signal.SIGKILL)


def _rmdir_when_empty(path: Path) -> None:
    """Remove a cgroup once its killed processes are gone: looked at again after 1 ms,
    then twice as long each time up to 20 ms (most are gone within a few ms)."""
    deadline = time.monotonic() + REMOVE_WAIT_S
    pause_s = 0.001
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return
        time.sleep(pause_s)
        pause_s = min(REMOVE_POLL_MAX_S, pause_s * 2)


def _wait_for(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SandboxUnavailable("a cgroup did not freeze in time")
        time.sleep(0.005)
