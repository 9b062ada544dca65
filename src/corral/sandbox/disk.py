"""The workspace size limit: what a session has on the host's disk, measured and watched.

What is measured is everything the sandbox can write on the host's disk: the workspace, the
package prefix and the kernels' run directories (`Session._written_paths`), in bytes and in
files.

No kernel mechanism bounds one directory tree on an ordinary filesystem without root and a
quota-enabled mount, so the server looks. A `DiskWatch` holds one session's last look; the
`corral.kernels.disk_patrol` task decides when to look again: at least every `BUSY_S` while
code runs and `IDLE_S` otherwise, and at once (within `TICK_S`) when the free space or free
inodes of the session's filesystems fell by more than the room the session had left, the
one sign that it may have crossed its limit. Each look also reads how much every sandbox
process has written (`/proc/PID/io`), so a look past the limit names the writers. Files
created empty dirty no data pages, so when the session grew past noise and no process wrote,
the processes that were busy on a CPU meanwhile are named instead (`writers.busy_since`);
growth with neither (the host put files there) names nobody.

The overshoot is what the writers put on disk between crossing the limit and being stopped:
one tick, one look and the stop (docs/architecture.md gives the figures measured).
RLIMIT_FSIZE (set by the limit box) bounds any single file. A session over its limit that
is not growing (an agent deleting files) is left alone.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corral.sandbox import writers

TICK_S = 0.01  # how often the patrol compares the filesystems' free space with the room left
BUSY_S = 0.25  # the longest a running execution goes without a look
IDLE_S = 5.0  # and an idle session (the free-space test catches writers in between)
# A session is looked at no more often than this many times the CPU time its look took (CPU,
# not wall time: a look that waited on a disk busy with the writer cost the host nothing).
LOOK_SHARE = 4
BLOCK = 512
# Files a kernel may add between two looks on its own (sockets, caches); past it, with no
# writer named, the growth is the agent's.
FILES_NOISE = 64

Free = tuple[int, int]  # a filesystem's free bytes and free inodes


def disk_usage(paths: Sequence[Path]) -> int:
    """Bytes allocated under `paths`, never following symbolic links or leaving a filesystem."""
    return measure(paths)[0]


def measure(paths: Sequence[Path]) -> tuple[int, int]:
    """(bytes allocated, entries) under `paths`, never following symbolic links or leaving a
    filesystem."""
    total = files = 0
    for root in paths:
        try:
            device = os.lstat(root).st_dev
        except OSError:
            continue
        size, count = _tree_usage(str(root), device)
        total, files = total + size, files + count
    return total, files


def _tree_usage(root: str, device: int) -> tuple[int, int]:
    total = files = 0
    pending = [root]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        files += len(entries)
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * BLOCK
            if stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                pending.append(entry.path)
    return total, files


def free_space(paths: Mapping[int, str]) -> dict[int, Free]:
    """Free bytes and inodes of each device, read through the path given for it."""
    free: dict[int, Free] = {}
    for device, path in paths.items():
        try:
            fs = os.statvfs(path)
        except OSError:
            continue
        free[device] = (fs.f_bfree * fs.f_frsize, fs.f_ffree)
    return free


@dataclass(frozen=True)
class Hit:
    """A look that found the session past a limit and larger than at the look before."""

    usage: int
    files: int
    writers: tuple[int, ...]  # host pids that wrote since the look before (none: those busy)
    grown: tuple[int, int] = (0, 0)  # bytes and files added since the look before
    at: float = 0.0  # when the look began (monotonic)

    def grew_past_noise(self) -> bool:
        """Whether the growth is more than a kernel's own small writes (a cache file, a
        socket) could make: a sign that something writes, named or not."""
        return self.grown[0] >= writers.KERNEL_WRITE_FLOOR or self.grown[1] >= FILES_NOISE


class DiskWatch:
    """One session's disk use at its last look, and whether that look stopped its code.

    `look` runs in a thread (the patrol's); everything else on the event loop.
    """

    def __init__(
        self,
        paths: Callable[[], Sequence[Path]],
        limit_bytes: Callable[[], int],
        limit_files: Callable[[], int] = lambda: 1 << 62,
        processes: Callable[[], Sequence[int]] = lambda: (),
    ) -> None:
        self.paths = paths  # asked at each look: the kernels' run directories change
        self.limit_bytes = limit_bytes
        self.limit_files = limit_files
        self.processes = processes  # the sandbox's processes, as host pids
        self.usage: int | None = None  # bytes, at the last look
        self.files: int | None = None  # files and directories, at the last look
        self.measured_at = 0.0
        self.took_s = 0.0  # CPU time of the last look
        self.devices: dict[int, str] = {}  # a path on each filesystem the session writes to
        self._free_then: dict[int, Free] = {}
        self._written: writers.Counts = {}
        self._cpu: dict[int, float] = {}
        self._added = (0, 0)  # bytes and files the host added, in total (see `added`)
        self._stopped = False
        self._rebase = False
        self.strikes = 0  # stops since the current execution, or idle period, began
        # When the current execution began; with `_stopped`, changed under the lock, so a
        # stop and a new execution's start never interleave (the patrol's thread and the
        # event loop).
        self._began_at = float("-inf")
        self._lock = threading.Lock()

    def due(self, now: float, busy: bool, free: Mapping[int, Free]) -> bool:
        """Whether to look now: the interval passed, or the filesystems lost more than the
        session had room for since the last look."""
        since = now - self.measured_at
        if since < max(TICK_S, LOOK_SHARE * self.took_s):
            return False
        if since >= (BUSY_S if busy else IDLE_S) or self.usage is None or self.files is None:
            return True
        room = (self.limit_bytes() - self.usage, self.limit_files() - self.files)
        drop = [0, 0]
        for device, then in self._free_then.items():
            if device in free:
                drop[0] += then[0] - free[device][0]
                drop[1] += then[1] - free[device][1]
        return any(lost > max(left, 0) for lost, left in zip(drop, room, strict=True))

    def look(self) -> Hit | None:
        """Measure now; a `Hit` when past a limit and grown since the look before (the first
        look sets the baseline)."""
        started, thread_cpu = time.monotonic(), time.thread_time()
        added_before = self._added
        processes = self.processes()
        written = writers.disk_writes(processes)
        cpu = writers.cpu_times(processes)
        paths = list(self.paths())
        devices = _devices(paths)
        free = free_space(devices)  # before the walk: what it finds was written by then
        usage, files = measure(paths)
        # What the host added during the walk may be missing from it: counted on top (at
        # worst twice, which refuses an upload early rather than late).
        usage += self._added[0] - added_before[0]
        files += self._added[1] - added_before[1]
        before_bytes, before_files = self.usage, self.files
        wrote = writers.writers_since(self._written, written)
        busy = writers.busy_since(self._cpu, cpu, started - self.measured_at)
        self.usage, self.files = usage, files
        self.devices, self._free_then = devices, free
        self._written, self._cpu = written, cpu
        self.measured_at, self.took_s = started, time.thread_time() - thread_cpu
        if before_bytes is None or before_files is None or self._rebase:
            self._rebase = False
            return None
        grew_bytes = usage > self.limit_bytes() and usage > before_bytes
        grew_files = files > self.limit_files() and files > before_files
        if not (grew_bytes or grew_files):
            return None
        grown = (usage - before_bytes, files - before_files)
        hit = Hit(usage, files, wrote, grown, started)
        if not wrote and hit.grew_past_noise():
            return Hit(usage, files, busy, grown, started)  # none wrote: the busy ones
        return hit

    def room(self) -> tuple[int, int]:
        """Bytes and files the session may still add, as of the last look (a first look is
        taken here, for a session the patrol has not seen)."""
        if self.usage is None or self.files is None:
            self.look()
        return (
            self.limit_bytes() - (self.usage or 0),
            self.limit_files() - (self.files or 0),
        )

    def added(self, size: int) -> None:
        """The host wrote a file of `size` more bytes in the session (the files API; less
        for an overwrite): count it now, and have the patrol look again soon."""
        self._added = (self._added[0] + size, self._added[1] + 1)
        if self.usage is not None and self.files is not None:
            self.usage, self.files = self.usage + size, self.files + 1
        self.look_soon()

    def rebase(self) -> None:
        """Code just ended or was stopped: what it wrote up to then is no new growth, so
        the next look is a baseline."""
        self._rebase = True

    def look_soon(self) -> None:
        """The session's files changed from outside: look at its next tick."""
        self.measured_at = 0.0

    # -- what an execution reads -----------------------------------------------------------

    def begin(self) -> None:
        """A new execution: only a stop from now on concerns it."""
        with self._lock:
            self._began_at = time.monotonic()
            self._stopped = False
        self.strikes = 0

    def ended(self) -> None:
        """The execution ended: an idle period begins, and its first look is a baseline."""
        self.strikes = 0
        self.rebase()

    def stop_running_code(self, hit: Hit) -> bool:
        """The patrol stops the running code for `hit`; False, and nothing stopped, when
        that code began after the look did (what the look judged is none of its doing: the
        next look judges it)."""
        with self._lock:
            if self._began_at >= hit.at:
                return False
            self._stopped = True
            return True

    def stopped(self) -> Literal["disk"] | None:
        """'disk' once the patrol stopped the running execution's code, else None."""
        return "disk" if self._stopped else None


def _devices(paths: Sequence[Path]) -> dict[int, str]:
    devices: dict[int, str] = {}
    for path in paths:
        try:
            devices.setdefault(os.lstat(path).st_dev, str(path))
        except OSError:
            continue
    return devices
