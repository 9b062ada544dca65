"""The jupyter_client seam: a provisioner that starts a kernel inside its session's sandbox.

`SandboxedKernelManager` is an `AsyncKernelManager` that carries the session's sandbox
(`corral.kernels.sandbox.SessionSandbox`) and uses ipc transport in the sandbox's run
directory; its kernel spec names the `corral-sandbox` provisioner (registered as an entry
point), which asks the sandbox's spawner to start the kernel command. The kernel reads a
copy of the connection file whose socket paths are the sandbox's view of the run directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from corral.errors import KernelStartFailed
from corral.kernels.sandbox import SessionSandbox, SpawnedProcess
from corral.kernels.stderr_tail import StderrTail
from corral.sandbox import scripts
from corral.sandbox.policy import SANDBOX_RUN_DIR
from corral.sandbox.scripts import BASH_KERNEL, PYTHON_KERNEL

PROVISIONER_NAME = "corral-sandbox"
HOST_CONNECTION_FILE = "kernel.json"
SPAWN_REPLY_S = 10.0  # how long the spawner may take to say it started a kernel


def kernel_spec(language: str, python: str, *, sandboxed: bool = True) -> KernelSpec:
    """The spec of a python or bash kernel run by `python` (a sandbox path when sandboxed)."""
    script = PYTHON_KERNEL if language == "python" else BASH_KERNEL
    entry = [scripts.run_path(script.name) if sandboxed else str(script)]
    spec = KernelSpec(
        argv=[python, *entry, "-f", "{connection_file}"],
        display_name=f"corral {language}",
        language=language,
        interrupt_mode="message",
    )
    if sandboxed:
        spec.metadata = {"kernel_provisioner": {"provisioner_name": PROVISIONER_NAME}}
    return spec


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager for one kernel in its session's sandbox, talking over ipc; its
    sockets and connection file in the run directory are named after `language`."""

    def __init__(
        self, *, spec: KernelSpec, sandbox: SessionSandbox, language: str, **kwargs: Any
    ) -> None:
        super().__init__(transport="ipc", **kwargs)
        self._kernel_spec = spec
        self.sandbox = sandbox
        self.run_dir = sandbox.run_dir
        # Fresh names each start: the run directory outlives a kernel, and running code
        # could have put anything at the names of the last one.
        self.socket_prefix = f"{language}-{secrets.token_hex(3)}"
        self.sandbox_connection_file = f"{language}.json"
        # The server's side: the kernel's sockets are moved here once bound, and the client
        # connects (and reconnects) only here, where the sandbox cannot put a link.
        self.host_dir = host_side(self.run_dir, language)
        self.ip = str(self.host_dir / self.socket_prefix)
        self.connection_file = str(self.host_dir / HOST_CONNECTION_FILE)
        self.cache_ports = False

    # jupyter_client's start and shutdown are wrapped by its `in_pending_state`, which
    # sleeps 10 ms after each so that its own tests can see the pending state: a tenth of
    # a session's delete. These keep its `ready` future, without the sleep. (jupyter_client
    # types the async manager's methods as its sync ones'.)

    async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]
        await self._pending(_unwrapped(AsyncKernelManager.start_kernel)(self, **kw))

    async def shutdown_kernel(  # type: ignore[override]
        self, now: bool = False, restart: bool = False
    ) -> None:
        """With `now` (what corral uses): kill the kernel, then clean up. jupyter_client's
        first sends an interrupt request on the control channel, which a kernel about to
        be killed never reads; the unsent message then held the context's close for its
        0.1 s linger, in one delete of three."""
        if not now:
            graceful = _unwrapped(AsyncKernelManager.shutdown_kernel)
            await self._pending(graceful(self, now=False, restart=restart))
            return
        await self._pending(self._kill_and_clean(restart))

    async def _kill_and_clean(self, restart: bool) -> None:
        self.shutting_down = True  # jupyter_client's restarter reads it
        self.stop_restarter()
        await self._async_kill_kernel(restart=restart)
        await self._async_cleanup_resources(restart=restart)

    async def _async_wait(self, pollinterval: float = 0.1) -> None:
        """Return once the killed kernel has ended. jupyter_client looks every 0.1 s,
        which a kernel whose sandbox was just ended (it dies a moment later) always paid."""
        provisioner = self.provisioner
        process = provisioner.process if isinstance(provisioner, LocalProvisioner) else None
        if isinstance(process, SpawnedProcess):
            await process.ended()
        else:
            await super()._async_wait(pollinterval)

    async def _pending(self, work: Awaitable[None]) -> None:
        """`ready` is a new future while `work` runs, then done (or failed, as `work`)."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ready = ready
        try:
            await work
        except Exception as exc:
            ready.set_exception(exc)
            ready.exception()  # told to the caller, not to the loop's unretrieved warning
            raise
        if self.owns_kernel:
            ready.set_result(None)

    def socket_names(self) -> list[str]:
        """The file names of the kernel's five sockets (valid once ports are assigned)."""
        ports = (self.shell_port, self.iopub_port, self.stdin_port, self.hb_port, self.control_port)
        return [f"{self.socket_prefix}-{port}" for port in ports]


def _unwrapped(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """The function a decorator (functools.wraps) wrapped."""
    return cast(Callable[..., Awaitable[None]], method.__wrapped__)  # type: ignore[attr-defined]


def host_side(run_dir: Path, language: str) -> Path:
    """The directory beside a sandbox's run directory that only the server sees, for the
    sockets of its `language` kernel."""
    return run_dir.with_name(f"{run_dir.name}-{language}")


class SandboxProvisioner(LocalProvisioner):
    """Starts the kernel command inside the manager's session sandbox."""

    stderr_log: StderrTail | None = None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        manager = _sandboxed_manager(self.parent)
        sandbox_file = _write_sandbox_connection_file(manager)
        kwargs["cmd"] = [
            sandbox_file if arg == manager.connection_file else arg for arg in kwargs["cmd"]
        ]
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        manager = _sandboxed_manager(self.parent)
        # Drained for the kernel's lifetime; closed in cleanup().
        if self.stderr_log is not None:
            self.stderr_log.close()
        self.stderr_log = StderrTail()
        try:
            spawned = await manager.sandbox.spawn(cmd, self.stderr_log.write_fd, SPAWN_REPLY_S)
        finally:
            self.stderr_log.spawned()
        # Not a Popen, but it has the part of one LocalProvisioner uses (see SpawnedProcess).
        self.process = spawned  # type: ignore[assignment]
        self.pid = spawned.pid
        self.pgid = None  # signals go to the process through its pidfd, never by number
        self.cwd = "/"
        return self.connection_info

    def stderr_tail(self, max_bytes: int = 4096) -> str:
        """The last bytes the kernel wrote to stderr, for error messages."""
        return "" if self.stderr_log is None else self.stderr_log.text(max_bytes)

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart)
        if self.stderr_log is not None and not restart:
            self.stderr_log.close()
            self.stderr_log = None


def _sandboxed_manager(parent: object) -> SandboxedKernelManager:
    if not isinstance(parent, SandboxedKernelManager):
        raise TypeError("the corral-sandbox provisioner needs a SandboxedKernelManager")
    return parent


def _write_sandbox_connection_file(manager: SandboxedKernelManager) -> str:
    """Copy the connection file with socket paths as the sandbox sees the run directory.

    The run directory is shared with running code, which may have put anything at the
    name (a FIFO would block an open): the copy is written under a name it cannot guess
    and renamed over it."""
    info = json.loads(Path(manager.connection_file).read_text())
    info["ip"] = f"{SANDBOX_RUN_DIR}/{manager.socket_prefix}"
    name = manager.sandbox_connection_file
    draft = manager.run_dir / f".{secrets.token_hex(8)}.{name}"
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(info, out)
    try:
        os.rename(draft, manager.run_dir / name)
    except OSError as exc:
        draft.unlink(missing_ok=True)
        raise KernelStartFailed(f"{name} in the run directory cannot be replaced: {exc}") from exc
    return f"{SANDBOX_RUN_DIR}/{name}"
