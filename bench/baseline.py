"""The baseline: an unsandboxed python kernel started with plain jupyter_client over ipc.

It runs the same interpreter and the same kernel program as corral's sandboxed kernel
(corral's own unsandboxed spec, `kernel_spec(..., sandboxed=False)`), over the same
transport, with a fresh home directory per kernel on a tmpfs when there is one (the
sandbox's home is a fresh tmpfs), but without bwrap, seccomp, the egress forwarder or
corral's session bookkeeping: what is left is the floor the sandbox is measured against.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from corral.kernels.provisioner import kernel_spec

START_TIMEOUT_S = 60.0
EXEC_TIMEOUT_S = 30.0
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class BaselineRoots:
    """Where baseline kernels keep their sockets (short, for unix socket paths) and homes."""

    sockets: Path
    homes: Path


def home_parent() -> Path:
    """/dev/shm when it is a writable directory (a tmpfs on Linux), else the temp dir."""
    if SHM.is_dir() and os.access(SHM, os.W_OK | os.X_OK):
        return SHM
    return Path(tempfile.gettempdir())


def baseline_spec() -> KernelSpec:
    """The kernel spec of the baseline: this interpreter running corral's python kernel
    program directly, started by jupyter_client's default (local) provisioner."""
    return kernel_spec("python", sys.executable, sandboxed=False)


def baseline_env(home: Path) -> dict[str, str]:
    """The host environment with a fresh `home` and the kernel variables the sandbox sets."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        HOME=str(home),
        IPYTHONDIR=str(home / ".ipython"),
        MPLCONFIGDIR=str(home / "mpl"),
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        PYTHONUNBUFFERED="1",
    )
    return env


class BaselineKernel:
    """One unsandboxed kernel with its sockets and connection file in `directory`.

    Its home is `home` (created at start). Call `start()` once, then `execute()` any number
    of times; `stop()` ends it and may be called again.
    """

    def __init__(self, directory: Path, home: Path) -> None:
        self.directory = directory
        self.home = home
        self.manager = AsyncKernelManager(transport="ipc")
        self.manager._kernel_spec = baseline_spec()
        self.manager.ip = str(directory / "k")
        self.manager.connection_file = str(directory / "kernel.json")
        self.manager.cache_ports = False
        self.client: Any = None

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the kernel and return once it answers a kernel_info request.

        Raises `RuntimeError` (or `TimeoutError`) when it does not answer within `timeout_s`.
        """
        await self.manager.start_kernel(env=baseline_env(self.home))
        client = self.manager.client()
        client.start_channels()
        self.client = client
        await client.wait_for_ready(timeout=timeout_s)

    async def execute(self, code: str, timeout_s: float = EXEC_TIMEOUT_S) -> dict[str, Any]:
        """Run `code`; return the execute_reply content once iopub went idle for it.

        Reads iopub until the kernel reports idle for this request, then the shell reply,
        the same messages corral's `run_code` waits for. Raises `TimeoutError` when either
        does not arrive within `timeout_s`, `RuntimeError` when the kernel is not started.
        """
        if self.client is None:
            raise RuntimeError("the baseline kernel is not started")
        msg_id = self.client.execute(code, allow_stdin=False, stop_on_error=False)
        try:
            while True:
                msg = await self.client.get_iopub_msg(timeout=timeout_s)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
            while True:
                reply = await self.client.get_shell_msg(timeout=timeout_s)
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    return dict(reply["content"])
        except queue.Empty as exc:
            raise TimeoutError(f"the baseline kernel did not answer within {timeout_s} s") from exc

    @property
    def pid(self) -> int | None:
        """The host pid of the kernel process, once started."""
        provisioner = self.manager.provisioner
        return getattr(provisioner, "pid", None)

    async def stop(self) -> None:
        """Close the client and kill the kernel at once; safe to call more than once."""
        if self.client is not None:
            self.client.stop_channels()
            self.client = None
        if self.manager.has_kernel:
            await self.manager.shutdown_kernel(now=True)


@asynccontextmanager
async def baseline_kernel(roots: BaselineRoots) -> AsyncIterator[BaselineKernel]:
    """A not-yet-started `BaselineKernel` in new directories under `roots`.

    On exit the kernel is stopped and its directories removed, whatever happened.
    """
    directory = Path(tempfile.mkdtemp(prefix="b", dir=roots.sockets))
    home = Path(tempfile.mkdtemp(prefix="home", dir=roots.homes))
    kernel = BaselineKernel(directory, home)
    try:
        yield kernel
    finally:
        try:
            await kernel.stop()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)
