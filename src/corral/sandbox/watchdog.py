"""The rlimit mechanism's watchdog: session limits held by looking, not by the kernel.

Without a cgroup the kernel bounds nothing over a group of processes, so the watchdog
samples every process tree of a session's sandboxes from /proc every `TICK_S` and acts:

- tasks: when the trees hold more threads than the limit, the largest tree is killed
  (SIGKILL of every process in it). Tasks are judged before memory: a fork bomb's children
  may pass both within one tick, and the result should name the cause;
- memory as a total: when the trees' resident memory passes the limit (RSS first, since it
  is cheap and never below PSS; then PSS, which shares pages fairly), the largest tree is
  killed and counted as an OOM kill, so the result names the limit `memory` as under a
  cgroup;
- CPU: a token bucket. Each tick adds `cpus` x the elapsed time to a budget (at most
  `BURST_S` worth) and takes off the CPU time the trees used; while the budget is
  negative every tree is stopped (SIGSTOP), and continued (SIGCONT) once it is paid back.
  Over any few seconds the trees get about `cpus` CPUs.

It is best effort, and says so (`corral doctor`, `best_effort` in the limits report): a
tree may overshoot by what it allocates or forks within one tick, and a stopped process is
visible to its parent as stopped (a shell reports it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

TICK_S = 0.05
BURST_S = 0.1  # how much unused quota a quiet tree may save up, in seconds at `cpus`
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Sample:
    """One process as /proc/PID/stat shows it now."""

    pid: int
    cpu_s: float  # user + system time since it started
    threads: int
    rss_bytes: int


def tree_pids(root: int) -> list[int]:
    """`root` and its descendants (parents before children), walked through each thread's
    /proc children list: a sandbox's few processes, not the host's whole process table."""
    found = [root]
    index = 0
    while index < len(found):
        found += _children(found[index])
        index += 1
    return found


def _children(pid: int) -> list[int]:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for tid in tids:
        path = f"/proc/{pid}/task/{tid}/children"
        with contextlib.suppress(OSError, ValueError), open(path, "rb") as listing:
            children += [int(word) for word in listing.read().split()]
    return children


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name, from the state (field 3) on:
    [0] is the one-letter state, [1] the parent's pid. None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces and parentheses itself.
    return text[text.rfind(b")") + 2 :].split()


def sample(pid: int) -> Sample | None:
    """The process's CPU time, threads and RSS; None when it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        ticks = int(fields[11]) + int(fields[12])
        return Sample(pid, ticks / _CLOCK_TICKS, int(fields[17]), int(fields[21]) * _PAGE)
    except (IndexError, ValueError):
        return None


def sample_tree(root: int) -> list[Sample]:
    """Every live process of the tree under `root`; empty when `root` is gone."""
    return [found for pid in tree_pids(root) if (found := sample(pid)) is not None]


def pss_bytes(pid: int) -> int:
    """The process's proportional set size (shared pages divided among their users); its
    RSS when the kernel has no smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    found = sample(pid)
    return found.rss_bytes if found is not None else 0


def over_memory(trees: dict[int, list[Sample]], limit: int) -> int | None:
    """The root of the largest tree when all of them together hold more than `limit`."""
    if sum(s.rss_bytes for tree in trees.values() for s in tree) <= limit:
        return None  # RSS is never below PSS: no need to read smaps
    held = {root: sum(pss_bytes(s.pid) for s in tree) for root, tree in trees.items()}
    if sum(held.values()) <= limit:
        return None
    return max(held, key=held.__getitem__)


def over_tasks(trees: dict[int, list[Sample]], limit: int) -> int | None:
    """The root of the tree with the most threads when all of them hold more than `limit`."""
    counts = {root: sum(s.threads for s in tree) for root, tree in trees.items()}
    if not counts or sum(counts.values()) <= limit:
        return None
    return max(counts, key=counts.__getitem__)


def over_limit(
    trees: dict[int, list[Sample]], *, memory_bytes: int, tasks: int
) -> tuple[str, int] | None:
    """The limit the trees passed and the root of the tree to kill for it, or None.

    Tasks are judged first: between two looks a fork bomb's children, each with a few pages
    of its own, may pass the memory limit as well, and the cause to name is the forking."""
    if (victim := over_tasks(trees, tasks)) is not None:
        return "tasks", victim
    if (victim := over_memory(trees, memory_bytes)) is not None:
        return "memory", victim
    return None


def kill_tree(root: int) -> None:
    """SIGKILL every process of the tree: a stopped process dies too, and memory is freed
    at once rather than when the sandbox's init notices its parent is gone."""
    for pid in tree_pids(root):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def signal_trees(roots: list[int], signum: int) -> list[int]:
    """Send `signum` to every process of the trees, looking again until no new one shows
    (with SIGSTOP, a stopped process cannot fork). Returns the processes signalled."""
    signalled: list[int] = []
    for _ in range(5):
        fresh = [pid for root in roots for pid in tree_pids(root) if pid not in signalled]
        if not fresh:
            break
        for pid in fresh:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
        signalled += fresh
    return signalled


@dataclass
class CpuThrottle:
    """The token bucket that holds a set of trees to `cpus` CPUs (see the module)."""

    budget_s: float | None = None
    stopped: bool = False
    last_at: float | None = None
    last_cpu: dict[int, float] = field(default_factory=dict)

    def decide(self, samples: list[Sample], cpus: float, now: float | None = None) -> bool:
        """Account for the CPU time used since the last call; True when the trees must be
        stopped now, False when they may run."""
        now = time.monotonic() if now is None else now
        cap = cpus * BURST_S
        elapsed = 0.0 if self.last_at is None else now - self.last_at
        used = sum(max(0.0, s.cpu_s - self.last_cpu.get(s.pid, 0.0)) for s in samples)
        self.last_cpu = {s.pid: s.cpu_s for s in samples}
        self.last_at = now
        budget = cap if self.budget_s is None else self.budget_s
        self.budget_s = min(cap, budget + cpus * elapsed - used)
        return self.budget_s < 0
