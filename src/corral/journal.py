"""An append-only file of JSON records, one per line, for what must outlive a crash of the
server before the database has it (the audit writer's write-ahead journal).

A record goes down in one `write` to a file opened with O_APPEND, so once `append` returns
it is in the kernel: a crash of the server (SIGKILL, an OOM kill) cannot lose it. `sync`
makes what was appended survive a crash of the machine too (fdatasync), and the writer calls
it after each batch rather than on every record. A line cut short by a crash of the machine
is the last one; reading leaves it out and says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from corral.errors import StateUnavailable

log = logging.getLogger(__name__)

_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class Journal:
    """The journal at `path` (0600, never a link); safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd_lock = threading.Lock()  # held while the descriptor is synced or replaced
        self._fd = self._open()

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record; raises `StateUnavailable` when the file takes none of it (a
        full disk), so that the caller can refuse what it was about to do."""
        line = (json.dumps(dict(record), separators=(",", ":"), allow_nan=False) + "\n").encode()
        with self._lock:
            try:
                _write_all(self._fd, line)
            except OSError as exc:
                with contextlib.suppress(OSError):  # end a part written: the next line is whole
                    os.write(self._fd, b"\n")
                raise StateUnavailable(
                    f"the audit journal {self.path} cannot be written: {exc.strerror}; "
                    "free space in the state directory"
                ) from exc

    def sync(self) -> None:
        """Make what was appended so far survive a crash of the machine.

        It holds `_fd_lock` only, which keeps the descriptor open (`replace` and `close`
        take it too), not the lock appends take: an append (on the server's event loop)
        never waits for the disk."""
        with self._fd_lock, contextlib.suppress(OSError):
            os.fdatasync(self._fd)

    @property
    def size(self) -> int:
        with self._lock:
            return os.fstat(self._fd).st_size

    def records(self) -> list[dict[str, Any]]:
        """Every whole record, oldest first."""
        with self._lock:
            data = self.path.read_bytes()
        records: list[dict[str, Any]] = []
        lines = data.split(b"\n")
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                records.append(record)
            else:
                log.warning(
                    "%s: line %d of %d is not a whole record; left out",
                    self.path,
                    number,
                    len(lines),
                )
        return records

    def replace(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Make the journal hold `records` only: written beside it, synced, renamed over it,
        so that a crash leaves either the old journal or the new one."""
        fresh = self.path.with_name(self.path.name + ".new")
        with self._fd_lock, self._lock:
            fresh.unlink(missing_ok=True)
            fd = os.open(fresh, _FLAGS | os.O_EXCL, 0o600)
            try:
                for record in records:
                    line = json.dumps(dict(record), separators=(",", ":"), allow_nan=False)
                    _write_all(fd, (line + "\n").encode())
                os.fdatasync(fd)
            except BaseException:
                os.close(fd)
                fresh.unlink(missing_ok=True)
                raise
            os.replace(fresh, self.path)
            _sync_directory(self.path.parent)
            os.close(self._fd)
            self._fd = fd

    def close(self) -> None:
        with self._fd_lock, self._lock:
            with contextlib.suppress(OSError):
                os.fdatasync(self._fd)
            os.close(self._fd)

    def _open(self) -> int:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, _FLAGS, 0o600)
        os.fchmod(fd, 0o600)
        return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sync_directory(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
