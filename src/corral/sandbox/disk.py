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


class DiskWatch:
    """Tells an execution when the session's files grew past `limit_bytes` or their number
    past `limit_files`."""

    def __init__(
        self,
        paths: Callable[[], Sequence[Path]],
        limit_bytes: Callable[[], int],
        limit_files: Callable[[], int] = lambda: 1 << 62,
        interval_s: float = MEASURE_INTERVAL_S,
    ) -> None:
        self.paths = paths  # asked at each measurement: the kernels' run directories change
        self.limit_bytes = limit_bytes
        self.limit_files = limit_files
        self.interval_s = interval_s
        self.usage: int | None = None  # bytes, at the last measurement
        self.files: int | None = None  # files and directories, at the last measurement
        self.measured_at = 0.0
        self._previous: tuple[int, int] | None = None
        self._running: asyncio.Task[tuple[int, int]] | None = None

    async def check(self) -> str | None:
        """'disk' when the last measurement is past a limit (bytes or files) and larger
        there than the one before.

        Starts a measurement in a thread when the last one is older than the interval; never
        waits for it.
        """
        self._collect()
        if self._running is None and time.monotonic() - self.measured_at >= self.interval_s:
            # Counted from the start, and kept across executions: at most one measurement per
            # interval, however many short executions follow each other.
            self.measured_at = time.monotonic()
            self._running = asyncio.create_task(asyncio.to_thread(measure, list(self.paths())))
        if self.usage is None or self.files is None:
            return None
        now, previous = (self.usage, self.files), self._previous
        if previous is None:  # the first look sets the baseline
            return None
        limits = (self.limit_bytes(), self.limit_files())
        if not any(n > lim and n > p for n, lim, p in zip(now, limits, previous, strict=True)):
            return None
        self._previous = now  # reported once per growth
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
            if self.usage is not None and self.files is not None:
                self._previous = (self.usage, self.files)
            self.usage, self.files = task.result()
