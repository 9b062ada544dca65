"""One owner of a state directory: an exclusive lock, and the runtime file beside it.

Opening a service on a state directory resets what a live one holds there (every session
marked stopped, the pool folder removed, egress sockets re-listened), so exactly one process
may hold it. `StateLock.acquire` takes `flock(LOCK_EX | LOCK_NB)` on `owner.lock` in the
state directory and writes its pid into it; the kernel releases the lock when the process
ends, however it ends. A server then `publish`es `server.json` (its URL, host, port, pid,
start time) once its socket is bound, and `release` removes it. Both files are 0600 and never
opened through a link.

`find_server` is how everyone else finds the owner: a runtime file counts only while its
lock is really held; one whose lock can be taken was left by a killed server and is removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from corral.errors import SandboxError, StateOwned

LOCK_NAME = "owner.lock"
RUNTIME_NAME = "server.json"
MAX_RUNTIME_BYTES = 4096
PROBE_RETRIES = 5
PROBE_RETRY_S = 0.02
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class ServerInfo:
    """What the runtime file says about the running server."""

    url: str  # base URL, e.g. http://127.0.0.1:8222 (no trailing slash)
    host: str
    port: int
    pid: int
    started_at: float  # epoch seconds

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    @classmethod
    def for_address(cls, host: str, port: int) -> ServerInfo:
        """This process serving at `host`:`port`, from now."""
        shown = f"[{host}]" if ":" in host else host
        return cls(f"http://{shown}:{port}", host, port, os.getpid(), time.time())


class StateLock:
    """The exclusive hold on one state directory, for the lifetime of its owner."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise `StateOwned` naming the process that holds it (`SandboxError`
        when the lock file is a link or not a regular file)."""
        if self._fd is not None:
            return
        fd = _open_lock(self.state_dir)
        try:
            taken = _lock_exclusive(fd)
        except BaseException:
            os.close(fd)
            raise
        if not taken:
            holder = _holder_pid(fd)
            os.close(fd)
            raise StateOwned(self.state_dir, holder, _read_runtime(self.state_dir))
        self._fd = fd
        _remove(self.state_dir / RUNTIME_NAME)  # left by an owner that was killed
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def publish(self, info: ServerInfo) -> None:
        """Write the runtime file (atomically, 0600); only the holder may."""
        if self._fd is None:
            raise RuntimeError("publish() needs the state lock held")
        _write_atomically(self.state_dir / RUNTIME_NAME, json.dumps(asdict(info)).encode())

    def release(self) -> None:
        """Remove the runtime file, then let the lock go. Safe to call twice."""
        if self._fd is None:
            return
        _remove(self.state_dir / RUNTIME_NAME)
        fd, self._fd = self._fd, None
        os.close(fd)  # closing the only descriptor releases the flock


def find_server(state_dir: Path) -> ServerInfo | None:
    """The server that owns `state_dir`, or None when no process holds it.

    Raises `StateOwned` when a process holds the state but publishes no server (another
    service such as `corral mcp-stdio`'s own, or a server still starting). A runtime file
    whose lock is free is stale (its server was killed): it is removed and ignored.
    """
    try:
        fd = _open_lock(state_dir, create=False)
    except FileNotFoundError:
        return None
    try:
        # A shared lock only probes: it fails while an owner holds the exclusive one, and
        # while we hold it no owner can start and write a runtime file we might remove.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        info = _read_runtime(state_dir)
        holder = _holder_pid(fd)
        os.close(fd)
        if info is None or info.pid != holder:
            raise StateOwned(state_dir, holder, None) from None
        return info
    try:
        _remove(state_dir / RUNTIME_NAME)
    finally:
        os.close(fd)
    return None


def _lock_exclusive(fd: int) -> bool:
    """Take the exclusive lock; False when another process holds it. A few quick retries
    ride out `find_server`'s probe, which holds a shared lock for microseconds."""
    for attempt in range(PROBE_RETRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if attempt + 1 < PROBE_RETRIES:
                time.sleep(PROBE_RETRY_S)
            continue
        return True
    return False


def _open_lock(state_dir: Path, *, create: bool = True) -> int:
    if create:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_RDWR | _OPEN_FLAGS | (os.O_CREAT if create else 0)
    try:
        fd = os.open(state_dir / LOCK_NAME, flags, 0o600)
    except FileNotFoundError:
        raise
    except OSError as exc:
        what = "is a link" if exc.errno == errno.ELOOP else f"cannot be opened: {exc.strerror}"
        raise SandboxError(f"{state_dir / LOCK_NAME} {what}; corral refuses it") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise SandboxError(f"{state_dir / LOCK_NAME} is not a regular file; corral refuses it")
    if info.st_mode & 0o077:
        os.fchmod(fd, 0o600)
    return fd


def _holder_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip())
    return None


def _read_runtime(state_dir: Path) -> ServerInfo | None:
    """The runtime file's contents, or None when it is missing, a link or malformed."""
    try:
        fd = os.open(state_dir / RUNTIME_NAME, os.O_RDONLY | _OPEN_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.read(fd, MAX_RUNTIME_BYTES))
        info = ServerInfo(
            url=str(data["url"]),
            host=str(data["host"]),
            port=int(data["port"]),
            pid=int(data["pid"]),
            started_at=float(data["started_at"]),
        )
    except (ValueError, KeyError, TypeError, OSError):
        return None
    finally:
        os.close(fd)
    return info


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _remove(temporary)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    # rename replaces whatever is at `path` (a link included) without following it.
    os.rename(temporary, path)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
