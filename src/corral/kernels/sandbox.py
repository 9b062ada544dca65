"""A session's one sandbox, and the kernels started inside it.

`SessionSandbox` starts bwrap once per session run with the spawner (`spawner.py`, shown at
/opt/corral/bin) as its command, behind the run's launchers (the agent bridge); with
egress, the spawner also runs the forwarder's relay. Each kernel is then started by asking
the spawner over a socket pair whose sandbox end bwrap inherits: the kernels of one session
share namespaces, /tmp, processes and the view of their mounts, and a kernel started later
is not a second sandbox.

The spawner runs inside the sandbox, so what it answers is not trusted: the pid it names is
looked up in this sandbox's own process tree on the host, and the server keeps a pidfd to
it. `SpawnedProcess` is that kernel process seen from the host, with the part of the
`subprocess.Popen` interface jupyter_client's provisioner uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from corral.errors import AdmissionFailed, KernelStartFailed
from corral.fsafe import NotPrivate, private_dir
from corral.kernels.stderr_tail import StderrTail
from corral.sandbox import scripts, watchdog
from corral.sandbox.boxes import LimitBox
from corral.sandbox.launch import start_sandbox
from corral.sandbox.policy import SandboxPolicy
from corral.sandbox.profile import SANDBOX_EGRESS_SOCKET
from corral.sandbox.writers import ns_pid

MAX_REPLY = 4096
FIND_POLL_S = 0.002
ENDED_LOOK_S = 0.01  # a killed kernel's state looked at this often besides its pidfd
FIND_TIMEOUT_S = 2.0  # a started kernel shows in /proc at once; this only bounds a lie


class SessionSandbox:
    """One session run's sandbox: bwrap, the spawner in it, and a channel to the spawner."""

    def __init__(self, policy: SandboxPolicy, run_dir: Path, *, bwrap: str, python: str) -> None:
        self.policy = policy
        self.run_dir = run_dir
        self.bwrap = bwrap
        self.python = python
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr_log: StderrTail | None = None
        self._control: socket.socket | None = None
        self._asking = asyncio.Lock()  # one request at a time
        self._requests = 0  # numbers each request; its answer echoes the number

    def start(self, launcher: list[str], box: LimitBox | None, *, egress: bool = False) -> None:
        """Start bwrap and the spawner (inside `box` before anything runs), with the egress
        forwarder's relay when `egress` (the policy binds its socket). Raises
        `KernelStartFailed` when the box refuses it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.stderr_log = StderrTail()
        try:
            theirs.set_inheritable(True)
            command = [*launcher, self.python, scripts.run_path("spawner.py"), str(theirs.fileno())]
            if egress:
                command += ["--egress", SANDBOX_EGRESS_SOCKET]
            self.process = start_sandbox(
                self.policy,
                command,
                bwrap=self.bwrap,
                box=box,
                stderr=self.stderr_log.write_fd,
                pass_fds=(theirs.fileno(),),
            )
        except AdmissionFailed as exc:
            ours.close()
            raise KernelStartFailed(f"the sandbox did not start: {exc}") from exc
        finally:
            theirs.close()
            self.stderr_log.spawned()
        ours.setblocking(False)
        self._control = ours

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        """The host pid of the outer bwrap process (the root of the sandbox's tree)."""
        return None if self.process is None else self.process.pid

    async def spawn(self, argv: list[str], stderr_fd: int, timeout_s: float) -> SpawnedProcess:
        """Start `argv` in the sandbox with `stderr_fd` as its stderr; raises
        `KernelStartFailed` when the spawner refuses, does not answer, or names no process
        of this sandbox."""
        async with self._asking:
            kind, detail = await asyncio.wait_for(self._ask(argv, stderr_fd), timeout_s)
        if kind != "pid" or not detail.isdigit():
            raise KernelStartFailed(f"the sandbox could not start {argv[-3:]}: {detail}")
        host_pid = await self._find(int(detail))
        return SpawnedProcess(host_pid)

    async def _ask(self, argv: list[str], stderr_fd: int) -> tuple[str, str]:
        """Send one spawn request; the answer's kind (`pid` or `error`) and the rest."""
        control = self._control
        if control is None or not self.alive():
            raise KernelStartFailed(f"the sandbox has ended: {self.stderr_tail()}")
        if any("\0" in arg for arg in argv):
            raise KernelStartFailed(f"an argument holds a NUL character: {argv!r}")
        loop = asyncio.get_running_loop()
        self._requests += 1
        number = str(self._requests)
        socket.send_fds(control, ["\0".join([number, *argv]).encode()], [stderr_fd])
        while True:  # an answer to an earlier request given up on is passed over
            try:
                reply = await loop.sock_recv(control, MAX_REPLY)
            except OSError as exc:
                raise KernelStartFailed(f"the sandbox has ended: {self.stderr_tail()}") from exc
            if not reply:
                raise KernelStartFailed(f"the sandbox has ended: {self.stderr_tail()}")
            echoed, _, rest = reply.decode("utf-8", "replace").partition(" ")
            if echoed in (number, "?"):
                kind, _, detail = rest.partition(" ")
                return kind, detail

    async def _find(self, inner_pid: int) -> int:
        """The host pid of the sandbox process whose pid inside is `inner_pid`."""
        deadline = time.monotonic() + FIND_TIMEOUT_S
        while self.process is not None:
            for pid in watchdog.tree_pids(self.process.pid)[1:]:
                if ns_pid(pid) == inner_pid:
                    return pid
            if time.monotonic() > deadline or not self.alive():
                break
            await asyncio.sleep(FIND_POLL_S)
        raise KernelStartFailed(f"the sandbox named pid {inner_pid}, which it does not hold")

    def stderr_tail(self, max_bytes: int = 4096) -> str:
        """What bwrap, a launcher or the spawner wrote to stderr last."""
        return "" if self.stderr_log is None else self.stderr_log.text(max_bytes)

    async def stop(self) -> None:
        """End the sandbox and everything in it, and remove its run directory. Once
        stopped it is not `alive` and has no `pid`; stopping it again does nothing more."""
        if self._control is not None:
            self._control.close()  # the spawner kills the kernels and exits
            self._control = None
        process, self.process = self.process, None  # a second stop signals no one
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
        if self.stderr_log is not None:
            self.stderr_log.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


class SpawnedProcess:
    """A kernel started by the spawner, seen from the host through a pidfd.

    `poll` and `wait` answer None while it runs, then -SIGKILL or 0: its real status goes to
    the spawner (its parent), which the server does not ask. Signals go through the pidfd,
    so a pid reused after the kernel's end is never signalled.
    """

    stdin = stdout = stderr = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._pidfd: int | None = os.pidfd_open(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """None while the kernel runs. Ended: its pidfd is readable (every thread gone), or
        the main thread is already dead while the others unwind (a kill takes a moment)."""
        if self.returncode is None and self._pidfd is not None and self._gone(self._pidfd):
            self._ended()
        return self.returncode

    def _gone(self, pidfd: int) -> bool:
        fields = watchdog.stat_fields(self.pid)
        return _readable(pidfd) or not fields or fields[0] in (b"Z", b"X")

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self._pidfd is not None:
            _readable(self._pidfd, timeout)
            if self.poll() is None:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
        return self.returncode if self.returncode is not None else 0

    async def ended(self) -> None:
        """Return once the kernel has ended: woken by its pidfd, and looked at every
        `ENDED_LOOK_S` besides (its main thread can be dead while the others unwind)."""
        loop = asyncio.get_running_loop()
        while self.poll() is None and (pidfd := self._pidfd) is not None:
            readable = asyncio.Event()
            loop.add_reader(pidfd, readable.set)
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(ENDED_LOOK_S):
                        await readable.wait()
            finally:
                loop.remove_reader(pidfd)

    def send_signal(self, signum: int) -> None:
        """`signum` to the kernel; SIGKILL to what it started too (its children and theirs),
        which would otherwise live on in the sandbox its sibling kernel still uses."""
        if self.poll() is None and self._pidfd is not None:
            if signum == signal.SIGKILL:  # stopped first, so none of them forks meanwhile
                watchdog.signal_trees([self.pid], signal.SIGSTOP)
                watchdog.kill_tree(self.pid)
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _ended(self) -> None:
        self.returncode = -signal.SIGKILL
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def make_run_dir(run_root: Path) -> Path:
    """A new private directory for one sandbox's kernel sockets: short, random, mode 0700.

    The root is created 0700 if missing, and refused when it is a link or not ours.
    """
    try:
        private_dir(run_root)
    except NotPrivate as exc:
        raise KernelStartFailed(
            f"run directory root {run_root} is not a directory of ours: it {exc.why}"
        ) from exc
    run_dir = run_root / secrets.token_hex(6)
    run_dir.mkdir(mode=0o700)
    return run_dir


def _readable(fd: int, timeout: float | None = 0) -> bool:
    """Whether `fd` is readable within `timeout` seconds (None: wait). poll, not select: a
    busy server's pidfds are numbered past select's limit of 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else timeout * 1000))
