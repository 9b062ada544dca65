"""What a session holds while any of its kernels runs, beyond the kernels themselves.

A `SessionRun` opens with the session's first kernel and closes with its last: the limit box
and its watchdog, the agent bridge when the operator enabled it, its project mounts and the
task applying their overlays to the host folders, and the one sandbox its kernels run in,
started with the binds, variables and launcher prefix the run gives (`RunExtras`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral import bridge_shim
from corral.bridge import AgentBridge, new_token
from corral.errors import InvalidInput
from corral.kernels.projects import PreparedMount
from corral.kernels.sandbox import SessionSandbox
from corral.protect.sync import OverlaySync
from corral.sandbox.boxes import LimitBox
from corral.sandbox.policy import SANDBOX_HOME, Bind, Mount

SANDBOX_BRIDGE_DIR = "/run/corral-bridge"
SANDBOX_SHIM = "/opt/corral/bin/bridge_shim.py"
SANDBOX_AGENT_SOCK = f"{SANDBOX_HOME}/.ssh-agent.sock"
SHIM = Path(bridge_shim.__file__).resolve()

BridgeHook = Callable[[str, str], None]  # (service, outcome)
SYNC_INTERVAL_S = 0.2  # how often a read-write mount's overlay is applied to the host
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunExtras:
    """What a running session's sandbox adds to the default profile."""

    binds: tuple[Mount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    launcher: tuple[str, ...] = ()


@dataclass
class SessionRun:
    """One session's run: opened with its first kernel (`KernelFactory.open_run`), closed
    with its last."""

    box: LimitBox
    watchdog: asyncio.Task[None]
    bridge: AgentBridge | None = None
    bridge_dir: Path | None = None
    mounts: list[PreparedMount] = field(default_factory=list)
    sandbox: SessionSandbox | None = None  # started with the first kernel
    syncing: asyncio.Task[None] | None = None  # applies the overlays while the run lasts

    def start_syncing(self) -> None:
        """Apply the read-write mounts' overlays to the host as they change, until close."""
        syncs = [mount.sync for mount in self.mounts if mount.sync is not None]
        if syncs and self.syncing is None:
            self.syncing = asyncio.create_task(keep_syncing(syncs), name="corral-overlay-sync")

    def extras(self, sandbox_python: str) -> RunExtras:
        """The binds, variables and launcher prefix of this run's sandbox."""
        binds = [bind for mount in self.mounts for bind in mount.binds()]
        env: list[tuple[str, str]] = []
        launcher: list[str] = []
        if self.bridge_dir is not None:
            binds += [Bind(self.bridge_dir, SANDBOX_BRIDGE_DIR), Bind(SHIM, SANDBOX_SHIM)]
            env.append(("SSH_AUTH_SOCK", SANDBOX_AGENT_SOCK))
            launcher += [sandbox_python, SANDBOX_SHIM, f"{SANDBOX_BRIDGE_DIR}/agent.sock"]
            launcher += [f"{SANDBOX_BRIDGE_DIR}/token", SANDBOX_AGENT_SOCK, "--"]
        return RunExtras(tuple(binds), tuple(env), tuple(launcher))

    async def close(self) -> None:
        """Tear everything down; the overlays' last pass runs once the sandbox has ended."""
        if self.sandbox is not None:
            await self.sandbox.stop()
            self.sandbox = None
        for task in (self.watchdog, self.syncing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.bridge is not None:
            await self.bridge.close()
        if self.bridge_dir is not None:
            shutil.rmtree(self.bridge_dir, ignore_errors=True)
        await asyncio.to_thread(self.box.remove)
        for mount in self.mounts:
            await asyncio.to_thread(mount.close)


async def keep_syncing(syncs: list[OverlaySync]) -> None:
    """Run a pass of each sync, then wait `SYNC_INTERVAL_S` (longer when a pass was slow, so
    a huge upper layer never takes a whole core), forever; a pass that fails is logged."""
    while True:
        started = time.monotonic()
        for sync in syncs:
            try:
                await asyncio.to_thread(sync.sync)
            except Exception:
                log.exception("applying the overlay of %s failed; trying again", sync.host)
        await asyncio.sleep(max(SYNC_INTERVAL_S, 4 * (time.monotonic() - started)))


async def open_bridge(run_root: Path, on_use: BridgeHook) -> tuple[AgentBridge, Path]:
    """Start an SSH agent bridge for one session run, in a fresh directory of `run_root`.

    The directory holds the bridge's socket and the run's token and is shown read-only
    inside. Raises `InvalidInput` when this server has no SSH agent to relay to.
    """
    agent, directory, token = await asyncio.to_thread(_bridge_files, run_root)
    bridge = AgentBridge(directory / "agent.sock", token, {"ssh-agent": agent}, on_use)
    try:
        await bridge.start()
    except Exception:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return bridge, directory


def _bridge_files(run_root: Path) -> tuple[Path, Path, str]:
    """The server's agent socket, and a new directory holding a new token (mode 0600)."""
    agent = os.environ.get("SSH_AUTH_SOCK", "")
    if not agent or not Path(agent).is_socket():
        raise InvalidInput(
            "the SSH agent bridge is enabled for this session, but the server has no SSH "
            "agent: start corral serve with SSH_AUTH_SOCK pointing at a running agent"
        )
    directory = run_root / f"b-{secrets.token_hex(6)}"
    directory.mkdir(mode=0o700, parents=True)
    token = new_token()
    fd = os.open(directory / "token", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token)
    return Path(agent), directory, token
