"""A kernel's stderr: a pipe the event loop drains, keeping only its last bytes.

The sandbox can reach the descriptor (fd 2 of its first process), so it must not be a host
file it could grow; and a pipe nobody reads would block the kernel once full. The server
keeps the tail for error messages (why a kernel did not start, or died) and drops the rest.
"""

from __future__ import annotations

import asyncio
import os

KEEP_BYTES = 16 * 1024
READ_BYTES = 64 * 1024


class StderrTail:
    """The read end of one kernel's stderr pipe. Give `write_fd` to the spawn, then call
    `spawned()` on the event loop; `text()` is the tail, during the kernel's life and after."""

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep_bytes = keep_bytes
        self._read_fd, self.write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._tail = b""
        self._loop: asyncio.AbstractEventLoop | None = None

    def spawned(self) -> None:
        """The child holds the write end now: close ours (so its exit is our end of file)
        and drain from the running loop."""
        self._close_write_end()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._read_fd, self._drain)

    def text(self, max_bytes: int = 4096) -> str:
        """The last `max_bytes` the kernel (or bwrap) wrote, what is in the pipe included."""
        self._drain()
        return self._tail[-max_bytes:].decode("utf-8", "replace").strip()

    def close(self) -> None:
        """Stop reading; the tail stays readable."""
        self._close_write_end()
        if self._read_fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._read_fd)
            os.close(self._read_fd)
            self._read_fd = -1

    def _drain(self) -> None:
        while self._read_fd >= 0:
            try:
                chunk = os.read(self._read_fd, READ_BYTES)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                return
            self._tail = (self._tail + chunk)[-self.keep_bytes :]

    def _close_write_end(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1
