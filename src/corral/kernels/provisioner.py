"""The jupyter_client seam: a provisioner that starts a kernel inside a bwrap sandbox.

`SandboxedKernelManager` is an `AsyncKernelManager` that carries the sandbox policy and uses
ipc transport in a private run directory; its kernel spec names the `corral-sandbox`
provisioner (registered as an entry point), which starts the kernel command through the one
sandbox launcher (`corral.sandbox.launch`). The kernel reads a copy of the connection file
whose socket paths are the sandbox's view of the same directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from corral.errors import AdmissionFailed, KernelStartFailed
from corral.kernels.stderr_tail import StderrTail
from corral.sandbox.boxes import LimitBox
from corral.sandbox.launch import start_sandbox
from corral.sandbox.policy import SANDBOX_RUN_DIR, SandboxPolicy
from corral.sandbox.profile import (
    BASH_KERNEL,
    PYTHON_KERNEL,
    SANDBOX_BASH_KERNEL,
    SANDBOX_PYTHON_KERNEL,
)

PROVISIONER_NAME = "corral-sandbox"
SOCKET_PREFIX = "k"
HOST_CONNECTION_FILE = "kernel.json"
SANDBOX_CONNECTION_FILE = "sandbox.json"


def kernel_spec(
    language: str, python: str, *, sandboxed: bool = True, launcher: list[str] | None = None
) -> KernelSpec:
    """The spec of a python or bash kernel run by `python` (a sandbox path when sandboxed).

    `launcher` is a command prefix that execs the kernel (the egress forwarder).
    """
    if language == "python":
        entry = [SANDBOX_PYTHON_KERNEL if sandboxed else str(PYTHON_KERNEL)]
    else:
        entry = [SANDBOX_BASH_KERNEL if sandboxed else str(BASH_KERNEL)]
    spec = KernelSpec(
        argv=[*(launcher or []), python, *entry, "-f", "{connection_file}"],
        display_name=f"corral {language}",
        language=language,
        interrupt_mode="message",
    )
    if sandboxed:
        spec.metadata = {"kernel_provisioner": {"provisioner_name": PROVISIONER_NAME}}
    return spec


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager for one kernel in one sandbox, talking over ipc in `run_dir`."""

    def __init__(
        self,
        *,
        spec: KernelSpec,
        policy: SandboxPolicy,
        bwrap: str,
        run_dir: Path,
        box: LimitBox | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(transport="ipc", **kwargs)
        self._kernel_spec = spec
        self.sandbox_policy = policy
        self.box = box
        self.bwrap_path = bwrap
        self.run_dir = run_dir
        # The server's side: the kernel's sockets are moved here once bound, and the client
        # connects (and reconnects) only here, where the sandbox cannot put a link.
        self.host_dir = host_side(run_dir)
        self.ip = str(self.host_dir / SOCKET_PREFIX)
        self.connection_file = str(self.host_dir / HOST_CONNECTION_FILE)
        self.cache_ports = False

    def socket_names(self) -> list[str]:
        """The file names of the kernel's five sockets (valid once ports are assigned)."""
        ports = (self.shell_port, self.iopub_port, self.stdin_port, self.hb_port, self.control_port)
        return [f"{SOCKET_PREFIX}-{port}" for port in ports]


def host_side(run_dir: Path) -> Path:
    """The directory beside a kernel's run directory that only the server sees."""
    return run_dir.with_name(run_dir.name + "-host")


class SandboxProvisioner(LocalProvisioner):
    """Starts the kernel command inside the sandbox described by the manager's policy."""

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
            self.process = start_sandbox(
                manager.sandbox_policy,
                cmd,
                bwrap=manager.bwrap_path,
                box=manager.box,
                stderr=self.stderr_log.write_fd,
            )
        except AdmissionFailed as exc:
            raise KernelStartFailed(f"the kernel did not start: {exc}") from exc
        finally:
            self.stderr_log.spawned()
        self.pid = self.process.pid
        self.pgid = self.process.pid
        self.cwd = "/"
        return self.connection_info

    def stderr_tail(self, max_bytes: int = 4096) -> str:
        """The last bytes bwrap or the kernel wrote to stderr, for error messages."""
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
    """Copy the connection file with socket paths as the sandbox sees the run directory."""
    info = json.loads(Path(manager.connection_file).read_text())
    info["ip"] = f"{SANDBOX_RUN_DIR}/{SOCKET_PREFIX}"
    target = manager.run_dir / SANDBOX_CONNECTION_FILE
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(info, out)
    return f"{SANDBOX_RUN_DIR}/{SANDBOX_CONNECTION_FILE}"
