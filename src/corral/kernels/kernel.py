"""One kernel in its session's sandbox: start it, talk to it, interrupt it, stop it.

`SandboxedKernel` owns a `SandboxedKernelManager`, its host-only socket directory and a
connected client; the sandbox (`corral.kernels.sandbox`) and its run directory belong to the
session's run. It raises `KernelStartFailed` when the kernel does not come up, with what the
kernel, bwrap or the spawner said on stderr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import shutil
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.asynchronous.client import AsyncKernelClient

from corral.errors import KernelStartFailed
from corral.kernels.provisioner import SandboxedKernelManager, SandboxProvisioner, kernel_spec
from corral.kernels.sandbox import SessionSandbox

log = logging.getLogger(__name__)

SOCKET_POLL_S = 0.005
READY_TRY_S = 1.0  # how long one kernel_info request is waited for at start
IDLE_AFTER_REPLY_S = 0.2  # then its idle status on iopub, before asking again
INTERRUPT_REPLY_S = 5.0  # how long an interrupt waits for the kernel's answer by default
# A python kernel's first result: a value shown (IPython sets up its display hook and
# formatters on first use) with no history kept, then that value forgotten, as if never shown.
PRIMING_CELLS = (
    ("1+1", {"store_history": False}),
    ("get_ipython().displayhook.flush(); del _0", {"silent": True}),
)


class SandboxedKernel:
    """A python or bash kernel inside its session's sandbox, with a client connected over
    ipc."""

    def __init__(self, language: str, sandbox: SessionSandbox) -> None:
        self.language = language
        self.sandbox = sandbox
        self.run_dir = sandbox.run_dir
        self.manager = SandboxedKernelManager(
            spec=kernel_spec(language, sandbox.python), sandbox=sandbox, language=language
        )
        self.manager.host_dir.mkdir(mode=0o700)
        self.client: AsyncKernelClient | None = None
        self.started_at = 0.0
        # Held while an interrupt waits for its answer: code is sent only once it is free.
        self._interrupting = asyncio.Lock()

    async def start(self, timeout_s: float) -> None:
        """Start the kernel and wait until it answers. Raises `KernelStartFailed`."""
        self.started_at = time.monotonic()
        try:
            await self.manager.start_kernel()
            await self._wait_for_sockets(timeout_s)
            client = self.manager.client()
            client.start_channels()
            self.client = client
            await self._wait_until_answering(client, timeout_s)
        except KernelStartFailed:
            await self.stop()
            raise
        except (RuntimeError, TimeoutError, OSError) as exc:
            reason = self.stderr_tail() or str(exc)
            await self.stop()
            raise KernelStartFailed(f"the {self.language} kernel did not start: {reason}") from exc
        except BaseException:  # cancelled (the server closing, say): leave nothing running
            await self.stop()
            raise

    async def _wait_for_sockets(self, timeout_s: float) -> None:
        """Wait until the kernel has bound all five sockets, then move them out of its reach.

        The sandbox can write its run directory, so a path there could be a link placed to
        make the server connect elsewhere. Each socket is moved (same inode, same listener)
        into the host-only directory the client connects through, and checked there: what is
        not a real socket stops the start, and nothing the sandbox does later changes what a
        reconnect finds.
        """
        names = self.manager.socket_names()
        paths = [self.run_dir / name for name in names]
        while True:
            if not await self.is_alive():
                raise KernelStartFailed(
                    f"the {self.language} kernel exited during start: {self.stderr_tail()}"
                )
            modes = [_lstat_mode(path) for path in paths]
            for path, mode in zip(paths, modes, strict=True):
                if mode is not None and not stat.S_ISSOCK(mode):
                    raise KernelStartFailed(f"{path.name} in the run directory is not a socket")
            if all(mode is not None for mode in modes):
                self._adopt_sockets(names)
                return
            if self._remaining(timeout_s) <= 0:
                raise KernelStartFailed(
                    f"the {self.language} kernel did not open its sockets within {timeout_s} s: "
                    f"{self.stderr_tail()}"
                )
            await asyncio.sleep(SOCKET_POLL_S)

    async def _wait_until_answering(self, client: AsyncKernelClient, timeout_s: float) -> None:
        """Wait until the kernel answers a kernel_info request on shell and its idle status
        after it reaches us on iopub (so iopub is subscribed too).

        jupyter_client's `wait_for_ready` then reads iopub until it has been silent for
        0.2 s: a third of every cold start. A status the kernel published before our
        subscription reached it is lost, so a try whose reply came but whose status did
        not within `IDLE_AFTER_REPLY_S` (the reply and its status leave together) asks
        again.
        """
        while True:
            remaining = self._remaining(timeout_s)
            if remaining <= 0:
                raise KernelStartFailed(
                    f"the {self.language} kernel did not answer within {timeout_s} s: "
                    f"{self.stderr_tail()}"
                )
            msg_id = client.kernel_info()
            reply = await reply_to(client.get_shell_msg, msg_id, min(remaining, READY_TRY_S))
            if reply is not None and await _idle_after_request(
                client, msg_id, min(self._remaining(timeout_s), IDLE_AFTER_REPLY_S)
            ):
                client._handle_kernel_info_reply(reply)
                return
            if not await self.is_alive():
                raise KernelStartFailed(
                    f"the {self.language} kernel exited during start: {self.stderr_tail()}"
                )

    def _adopt_sockets(self, names: list[str]) -> None:
        host_dir = self.manager.host_dir
        for name in names:
            os.rename(self.run_dir / name, host_dir / name)
            mode = _lstat_mode(host_dir / name)
            if mode is None or not stat.S_ISSOCK(mode):
                raise KernelStartFailed(f"{name} in the run directory is not a socket")

    def _remaining(self, timeout_s: float) -> float:
        return timeout_s - (time.monotonic() - self.started_at)

    async def is_alive(self) -> bool:
        """True while the kernel runs. A kernel whose sandbox has ended is gone, even in the
        moment before its own process is seen to be."""
        if not self.sandbox.alive():
            return False
        provisioner = self.manager.provisioner
        if provisioner is None or not provisioner.has_process:
            return False
        return await provisioner.poll() is None

    async def prime(self, timeout_s: float) -> None:
        """Do the work of a python kernel's first result now, for a kernel that waits for a
        session (the warm pool): its first `1+1` otherwise takes about twice as long as the
        next. The namespace, `Out`, `_` and the execution count are left as they were.
        Raises `KernelStartFailed` when a cell does not end well within `timeout_s`."""
        client = self.client
        if client is None:
            raise KernelStartFailed(f"the {self.language} kernel has no connection to prime")
        deadline = time.monotonic() + timeout_s
        for code, options in PRIMING_CELLS:
            msg_id = client.execute(code, allow_stdin=False, **options)
            reply = await reply_to(client.get_shell_msg, msg_id, deadline - time.monotonic())
            if reply is None or reply["content"].get("status") != "ok":
                raise KernelStartFailed(f"the kernel did not run its priming cell {code!r}")
        if not await _idle_after_request(client, msg_id, deadline - time.monotonic()):
            raise KernelStartFailed("the kernel did not go idle after its priming cells")

    async def interrupt(self, timeout_s: float = INTERRUPT_REPLY_S) -> bool:
        """Interrupt the running code, and wait up to `timeout_s` for the kernel to say so.

        The request goes on the control channel; the kernel raises SIGINT in itself and only
        then answers. So once this returns True the interrupt has landed (in the code it was
        meant for, or nowhere when that code had already ended) and cannot reach code sent
        later. False: no kernel to ask, or no answer in time.
        """
        async with self._interrupting:
            client = self.client
            if client is None or not await self.is_alive():
                return False
            request = client.session.msg("interrupt_request", content={})
            client.control_channel.send(request)
            try:
                answer = await reply_to(
                    client.get_control_msg, request["header"]["msg_id"], timeout_s
                )
                return answer is not None
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                return False  # not our cancellation: stop() closed the channel under us
            except zmq.ZMQError:
                return False

    async def interrupts_settled(self) -> None:
        """Return once no interrupt is on its way (answered, or given up on)."""
        async with self._interrupting:
            return

    async def stop(self) -> None:
        """Kill the kernel and what it started at once, and remove its sockets."""
        if self.client is not None:
            self.client.stop_channels()
            self.client = None
        if self.manager.has_kernel:
            await self.manager.shutdown_kernel(now=True)
        shutil.rmtree(self.manager.host_dir, ignore_errors=True)

    def stderr_tail(self) -> str:
        """What the kernel wrote to stderr last, else what its sandbox did."""
        provisioner = self.manager.provisioner
        if isinstance(provisioner, SandboxProvisioner) and (tail := provisioner.stderr_tail()):
            return tail
        return self.sandbox.stderr_tail()

    @property
    def pid(self) -> int | None:
        """The host pid of the kernel process (inside the session's sandbox)."""
        provisioner = self.manager.provisioner
        return getattr(provisioner, "pid", None)


async def reply_to(
    get_msg: Callable[..., Awaitable[dict[str, Any]]], msg_id: str, timeout_s: float
) -> dict[str, Any] | None:
    """The reply to `msg_id` read with `get_msg` (a channel's `get_*_msg`), passing over
    replies to earlier requests (ones given up on) and messages that cannot be read; None
    when none came within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            reply = await readable_message(get_msg, remaining)
        except queue.Empty:
            return None
        if reply is not None and reply.get("parent_header", {}).get("msg_id") == msg_id:
            return reply
    return None


async def _idle_after_request(client: AsyncKernelClient, msg_id: str, timeout_s: float) -> bool:
    """Read iopub until the kernel is idle after `msg_id` (True), or for `timeout_s`: what
    was sent before is read with it, so none of it waits in the channel for the next
    caller."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = await readable_message(client.get_iopub_msg, remaining)
        except queue.Empty:
            return False
        if msg is not None and _is_idle_after(msg, msg_id):
            return True
    return False


def _is_idle_after(msg: dict[str, Any], msg_id: str) -> bool:
    return bool(
        msg.get("parent_header", {}).get("msg_id") == msg_id
        and msg["msg_type"] == "status"
        and msg["content"].get("execution_state") == "idle"
    )


async def readable_message(
    get_msg: Callable[..., Awaitable[dict[str, Any]]], timeout_s: float
) -> dict[str, Any] | None:
    """The next message on a channel (`queue.Empty` past `timeout_s`), or None for one that
    could not be read: a bad signature, frames out of order, JSON that does not parse.

    The kernel runs the agent's code, which can write anything on the kernel's sockets; such
    a message is dropped and logged, and the caller goes on waiting for a good one.
    """
    try:
        return await get_msg(timeout=timeout_s)
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("dropped a message from a kernel that could not be read: %.200s", exc)
        return None


def _lstat_mode(path: Path) -> int | None:
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None
