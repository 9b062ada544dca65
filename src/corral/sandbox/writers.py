"""Which sandbox processes to stop when a session writes past its disk limit.

A sandbox is a process tree: the outer bwrap on the host, bwrap's init inside (pid 1 of the
sandbox's pid namespace), the spawner it started (pid 2) and the spawner's children, the
session's kernels, whose children are the agent's processes. Processes whose parents died
are adopted by pid 1. A writer is stopped with the whole branch it belongs to (the highest
ancestor that is neither a kernel, nor the spawner, nor pid 1): a shell loop that starts a
new `dd` each time goes with its `dd`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from corral.sandbox import watchdog

SPAWNER_NS_PID = 2  # the command bwrap runs: the spawner, whose children are the kernels
INIT_NS_PID = 1
# A kernel writes a little of its own now and then (caches, compiled modules); counted as a
# writer only past this much between two looks, which a thread filling the disk passes at
# once.
KERNEL_WRITE_FLOOR = 1024 * 1024
# A process that creates files empty dirties no data pages, so the write counters miss it;
# what it cannot hide is its CPU time. Busy means at least this share of the time between
# two looks (an idle kernel uses well under 1%), and at least BUSY_FLOOR_S.
BUSY_SHARE = 0.25
BUSY_FLOOR_S = 0.02


@dataclass
class Culprits:
    """The branches to kill (their top processes, host pids), the kernels whose own threads
    wrote, and the kernels that started a branch."""

    branches: list[int] = field(default_factory=list)
    kernels: set[int] = field(default_factory=set)
    parents: set[int] = field(default_factory=set)


def ns_pid(pid: int) -> int | None:
    """The process's pid inside its innermost pid namespace; None when it is gone or not in
    a namespace of its own (the outer bwrap, on the host)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    fields = line.split()[1:]
                    return int(fields[-1]) if len(fields) > 1 else None
    except (OSError, ValueError, IndexError):
        return None
    return None


def is_kernel(pid: int) -> bool:
    """True for a kernel: a child of its sandbox's spawner."""
    parent = parent_pid(pid)
    return parent is not None and ns_pid(parent) == SPAWNER_NS_PID and ns_pid(pid) is not None


def parent_pid(pid: int) -> int | None:
    fields = watchdog.stat_fields(pid)
    try:
        return None if fields is None else int(fields[1])
    except (ValueError, IndexError):
        return None


def name_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", "rb") as comm:
            return comm.read().decode("utf-8", "replace").strip()
    except OSError:
        return "?"


Counts = dict[tuple[int, int], int]  # (pid, tid) -> bytes written; tid 0: the whole process


def disk_writes(pids: Iterable[int]) -> Counts:
    """Bytes each process has had written to a disk (the pages it dirtied, /proc/PID/io);
    a process that is gone, or whose counters cannot be read, is left out.

    A process's counters include those of the children it reaped, so a shell loop that
    starts a new `dd` each time shows as a writer: it is counted whole (tid 0). A kernel's
    would include the agent's commands it reaps, so it is counted thread by thread.
    """
    written: Counts = {}
    for pid in pids:
        if is_kernel(pid):
            for tid in _threads(pid):
                if (count := _write_bytes(f"/proc/{pid}/task/{tid}/io")) is not None:
                    written[(pid, int(tid))] = count
        elif (count := _write_bytes(f"/proc/{pid}/io")) is not None:
            written[(pid, 0)] = count
    return written


def writers_since(before: Counts, now: Counts) -> tuple[int, ...]:
    """The pids that wrote between two snapshots. A process is judged by its whole counters
    (all it ever wrote, when it is new). A kernel by its threads seen both times: a thread
    not seen before (new, or unreadable then) has a total, not a delta, so it counts from
    the next look; and only past `KERNEL_WRITE_FLOOR`, its own small writes left aside."""
    grown: dict[int, int] = {}
    kernels: set[int] = set()
    for (pid, tid), count in now.items():
        if tid == 0:
            grown[pid] = count - before.get((pid, 0), 0)
        elif (pid, tid) in before:
            kernels.add(pid)
            grown[pid] = grown.get(pid, 0) + count - before[(pid, tid)]
    return tuple(
        pid for pid, n in grown.items() if n >= (KERNEL_WRITE_FLOOR if pid in kernels else 1)
    )


def cpu_times(pids: Iterable[int]) -> dict[int, float]:
    """The CPU seconds each process has used itself (its reaped children's are not in it)."""
    times: dict[int, float] = {}
    for pid in pids:
        if (found := watchdog.sample(pid)) is not None:
            times[pid] = found.cpu_s
    return times


def busy_since(
    before: dict[int, float], now: dict[int, float], elapsed_s: float
) -> tuple[int, ...]:
    """The pids that used at least `BUSY_SHARE` of a CPU over the `elapsed_s` between two
    snapshots (a process new since the first counts all it used)."""
    floor = max(BUSY_FLOOR_S, BUSY_SHARE * elapsed_s)
    return tuple(pid for pid, cpu in now.items() if cpu - before.get(pid, 0.0) >= floor)


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _write_bytes(path: str) -> int | None:
    try:
        with open(path, "rb") as io:
            for line in io:
                if line.startswith(b"write_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def find_culprits(writers: Iterable[int]) -> Culprits:
    """Sort sandbox processes that wrote into kernels and the branches holding the rest."""
    found = Culprits()
    for pid in writers:
        if ns_pid(pid) in (None, INIT_NS_PID, SPAWNER_NS_PID):
            continue  # bwrap itself, the spawner, or gone
        if is_kernel(pid):
            found.kernels.add(pid)
        else:
            top, parent = _branch_top(pid)
            if top not in found.branches:
                found.branches.append(top)
            if parent is not None and is_kernel(parent):
                found.parents.add(parent)
    return found


def _branch_top(pid: int) -> tuple[int, int | None]:
    """The highest ancestor of `pid` below a kernel, the spawner or the sandbox's init, and
    its parent."""
    top = pid
    while (parent := parent_pid(top)) is not None:
        if ns_pid(parent) in (None, INIT_NS_PID, SPAWNER_NS_PID) or is_kernel(parent):
            return top, parent
        top = parent
    return top, None


def kill_branches(branches: Iterable[int]) -> None:
    """SIGKILL each branch, whole."""
    for top in branches:
        with contextlib.suppress(OSError):
            watchdog.kill_tree(top)
