"""One session's data: its id, record, folders, limits, options and running kernels.

The registry (`corral.kernels.sessions`) owns the `Session` objects; the kernel factory
(`corral.kernels.factory`) starts and stops their kernels. Ids and languages are validated
here, at the edge of every call that names them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.errors import InvalidInput
from corral.kernels.kernel import SandboxedKernel
from corral.kernels.results import MAX_REFUSALS, NetRefusal
from corral.kernels.run import SessionRun
from corral.sandbox.boxes import LimitBox
from corral.sandbox.disk import DiskWatch
from corral.sandbox.limits import Limits
from corral.sandbox.profile import SessionPaths
from corral.store import SessionRecord

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
LANGUAGES = ("python", "bash")
DEFAULT_SESSION = "default"


def validate_session_id(value: object) -> str:
    """`value` if it is a valid session id; raises `InvalidInput` otherwise."""
    if not isinstance(value, str) or not SESSION_ID.fullmatch(value):
        raise InvalidInput(
            f"invalid session id {value!r}: use 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return value


def validate_language(value: object) -> str:
    if value not in LANGUAGES:
        raise InvalidInput(f"unknown language {value!r}: choose one of {', '.join(LANGUAGES)}")
    return str(value)


def check_timeout(timeout_s: float | None) -> float | None:
    """An execution's timeout as asked: None (the session's cap) or a positive number of
    seconds (a larger one than the cap is cut to it when the code runs)."""
    if timeout_s is not None and not 0 < timeout_s < math.inf:
        raise InvalidInput("timeout must be a positive number of seconds")
    return timeout_s


def new_session_id() -> str:
    return "s-" + secrets.token_hex(4)


@dataclass(frozen=True)
class SessionInfo:
    """A snapshot of one session, for listing and for the APIs."""

    id: str
    state: str
    created_at: float
    last_used_at: float
    kernels: tuple[str, ...]
    workspace: Path
    mounts: tuple[str, ...] = ()
    from_pool: bool = False  # its python kernel came ready from the warm pool
    queued: int = 0  # executions waiting for the one running to end
    open: bool = False  # started and not stopped since (an idle stop keeps it open)


class Session:
    """A session's mutable state. `lock` is its execution queue (FIFO); `run` is set while
    any kernel runs (`corral.kernels.run.SessionRun`)."""

    def __init__(
        self, record: SessionRecord, paths: SessionPaths, limits: Limits, options: dict[str, Any]
    ) -> None:
        self.record = record
        self.paths = paths
        self.limits = limits
        self.options = options  # what the operator chose: limit changes, mounts, bridge
        self.run: SessionRun | None = None  # while any kernel runs
        self.disk = DiskWatch(
            self._written_paths,
            lambda: self.limits.workspace_bytes,
            lambda: self.limits.workspace_files,
            self._sandbox_pids,
        )
        self.kernels: dict[str, SandboxedKernel] = {}
        self.lock = asyncio.Lock()
        self.starting = False
        self.failed: str | None = None
        self.lost: set[str] = set()  # languages whose kernel died since the last call
        self.current_call: tuple[asyncio.Task[Any], str] | None = None  # holds the lock
        self.from_pool = False
        self.waiting = 0  # executions queued behind `lock`
        self.notes: list[str] = []  # what happened to the session, told in the next result
        # Started and not stopped since, in this server's life: coderunner's "active". An
        # idle stop keeps it (the next call starts a kernel); `stop` and a restart end it.
        self.open = False
        # Connections the egress proxy refused during the running execution (None between
        # executions), for its result.
        self.refused: list[NetRefusal] | None = None

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait for this session's turn (first come, first served) and hold it for the block;
        `waiting` counts the calls still waiting meanwhile."""
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self.lock.release()

    def _written_paths(self) -> list[Path]:
        """Where the sandbox writes to the host's disk: the workspace, the package prefix
        and, while it runs, the sandbox's run directory (shown at /run/corral)."""
        sandbox = self.run.sandbox if self.run is not None else None
        runs = [sandbox.run_dir] if sandbox is not None else []
        return [self.paths.workspace, self.paths.env, *runs]

    def _sandbox_pids(self) -> list[int]:
        """Every process of the session's sandbox (host pids), from its limit box."""
        box = self.box
        return box.processes() if box is not None else []

    def note_refusal(self, refusal: NetRefusal) -> None:
        """Keep a refused connection for the running execution's result (once, bounded)."""
        refused = self.refused
        if refused is not None and refusal not in refused and len(refused) < MAX_REFUSALS:
            refused.append(refusal)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def box(self) -> LimitBox | None:
        return self.run.box if self.run is not None else None

    @property
    def running(self) -> bool:
        return bool(self.kernels) or self.starting

    @property
    def state(self) -> str:
        if self.starting:
            return "starting"
        if self.lock.locked():
            return "busy"
        if self.kernels:
            return "idle"
        return "failed" if self.failed else "stopped"

    def info(self) -> SessionInfo:
        return SessionInfo(
            id=self.record.id,
            state=self.state,
            created_at=self.record.created_at,
            last_used_at=self.record.last_used_at,
            kernels=tuple(sorted(self.kernels)),
            workspace=self.paths.workspace,
            mounts=tuple(self.options.get("mounts", ())),
            from_pool=self.from_pool,
            queued=self.waiting,
            open=self.open,
        )
