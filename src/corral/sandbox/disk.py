"""The workspace size limit: a watchdog that measures a session's disk use while code runs.

What it measures is everything the sandbox can write on the host's disk: the workspace, the
package prefix and the kernels' run directories (`Session._written_paths`).

No kernel mechanism bounds one directory tree on an ordinary filesystem without root and a
quota-enabled mount, so the server measures (in a thread, at most once per interval while an
execution runs) and stops code that keeps writing past the limit. RLIMIT_FSIZE (set by the
limit box) bounds any single file, so the overshoot is at most what is written between two
measurements. Code that runs while the workspace is over its limit but is not growing it
(an agent deleting files) is left alone.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path

MEASURE_INTERVAL_S = 0.25
BLOCK = 512


def disk_usage(paths: Sequence[Path]) -> int:
    """Bytes allocated under `paths`, never following symbolic links or leaving a filesystem."""
    total = 0
    for root in paths:
        try:
            device = os.lstat(root).st_dev
        except OSError:
            continue
        total += _tree_usage(str(root), device)
    return total


def _tree_usage(root: str, device: int) -> int:
    total = 0
    pending = [root]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * BLOCK
            if stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                pending.append(entry.path)
    return total


class DiskWatch:
    """Tells an execution when the session's files grew past `limit_bytes`."""

    def __init__(
        self,
        paths: Callable[[], Sequence[Path]],
        limit_bytes: Callable[[], int],
        interval_s: float = MEASURE_INTERVAL_S,
    ) -> None:
        self.paths = paths  # asked at each measurement: the kernels' run directories change
        self.limit_bytes = limit_bytes
        self.interval_s = interval_s
        self.usage: int | None = None
        self.measured_at = 0.0
        self._previous: int | None = None
        self._running: asyncio.Task[int] | None = None

    async def check(self) -> str | None:
        """'disk' when the last measurement is past the limit and larger than the one before.

        Starts a measurement in a thread when the last one is older than the interval; never
        waits for it.
        """
        self._collect()
        if self._running is None and time.monotonic() - self.measured_at >= self.interval_s:
            # Counted from the start, and kept across executions: at most one measurement per
            # interval, however many short executions follow each other.
            self.measured_at = time.monotonic()
            self._running = asyncio.create_task(asyncio.to_thread(disk_usage, list(self.paths())))
        usage, previous = self.usage, self._previous
        if usage is None or usage <= self.limit_bytes():
            return None
        if previous is None or usage <= previous:  # the first look sets the baseline
            return None
        self._previous = usage  # reported once per growth
        return "disk"

    def begin(self) -> None:
        """A new execution: it is judged only by what it writes, so a measurement from
        before it (even one still running) is no baseline for it."""
        self._running = None  # a measurement in flight finishes unread
        self._previous = None

    def _collect(self) -> None:
        task = self._running
        if task is None or not task.done():
            return
        self._running = None
        if task.exception() is None:
            self._previous, self.usage = self.usage, task.result()
