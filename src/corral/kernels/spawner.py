"""The first process of a session's sandbox (run as a script inside it, never imported by corral).

A session's kernels share one sandbox: one set of namespaces, one /tmp, one view of its
mounts. This process is what bwrap starts; it starts each kernel when the server asks, so a
kernel added later lands in the same sandbox instead of a second one.

Run as `python spawner.py FD [--egress SOCKET]`: FD is a SOCK_SEQPACKET socket whose other
end only the server holds. With `--egress`, the egress forwarder's listeners (127.0.0.1:3128
and :1080, see forwarder.py, shown beside this script) are bound before any kernel starts,
and its relay to the unix socket SOCKET shares this process's one loop: a process of its
own held about 4.5 MiB more of every session's memory. Each message is one datagram:

- the server sends `N\0COMMAND\0ARG...` (N the request's number, then the argv, UTF-8)
  with one descriptor attached, the kernel's stderr; the answer is `N pid PID` (the
  kernel's pid in the sandbox) or `N error TEXT`, N echoed so that a late answer is never
  taken for another's (`? error TEXT` when the request had no number);
- when the server's end closes (the server stopped the session, or died), the process group
  of every kernel started here is killed and this one exits, and with it the sandbox.

A kernel starts in a process group of its own (its pid is the group's id), with stdin and stdout
on /dev/null and the sandbox's environment. This process reaps the kernels it started. It
trusts nothing it is sent beyond starting a command in the sandbox it already runs in, and
the server trusts nothing it answers beyond a pid it checks itself. It imports no more of
the standard library than it needs (no json, subprocess or threading): every session holds it.
"""

import contextlib
import importlib.util
import os
import selectors
import signal
import socket
import sys
from collections.abc import Callable
from types import ModuleType

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this script's folder: the kernels' imports must not see it

MAX_MESSAGE = 64 * 1024
MAX_FDS = 1
LOOK_S = 5.0  # the relay's idle connections are looked for this often
HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.basename(HERE) == "__pycache__":  # run from its compiled form
    HERE = os.path.dirname(HERE)
FORWARDER = os.path.join(HERE, "forwarder.py")  # loaded from its compiled form when fresh
USAGE = "usage: spawner.py FD [--egress SOCKET]"


class ServerGone(Exception):
    """The server's end of the control socket closed."""


def start(argv: list[str], stderr_fd: int) -> int:
    """Start one kernel; its pid. posix_spawn rather than subprocess, whose import held
    half a MiB of every sandbox: the kernel gets only the three descriptors given, as
    every descriptor of this process is close-on-exec (Python opens them so, and the one
    received for stderr comes so)."""
    return os.posix_spawnp(
        argv[0],
        argv,
        os.environ,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, stderr_fd, 2),
        ],
        # its own group, in the sandbox's one session: not a session leader, so it
        # cannot take a terminal as its controlling one
        setpgroup=0,
        # what Python ignores, as subprocess restores it: a shell started with SIGPIPE
        # ignored could never take it back, and `yes | head` would fail with EPIPE
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
    )


def answer(message: bytes, fds: list[int], started: set[int]) -> str:
    """The reply to one request, without its number (always closes the descriptors that
    came with it)."""
    try:
        argv = message.decode("utf-8", "replace").split("\0")[1:]
        if not argv or not argv[0]:
            return "error a request must be NUMBER\\0COMMAND[\\0ARG...]"
        if len(fds) != 1:
            return "error a spawn request carries exactly one descriptor, for stderr"
        try:
            pid = start(argv, fds[0])
        except OSError as exc:
            return f"error {argv[0]}: {exc.strerror or exc}"
        started.add(pid)
        return f"pid {pid}"
    finally:
        for fd in fds:
            os.close(fd)


def number_of(message: bytes) -> str:
    """The request's number as sent, or `?` when it has none."""
    number = message.split(b"\0", 1)[0]
    return number.decode() if number.isdigit() and len(number) <= 20 else "?"


def reap() -> None:
    """Collect every kernel that has ended, so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_all(started: set[int]) -> None:
    """SIGKILL the process group of every kernel started here (each leads its own)."""
    for pid in started:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


class Spawner:
    """Answers the server's requests on `control`; `started` collects the kernels' pids."""

    def __init__(self, control: socket.socket, started: set[int]) -> None:
        self.control = control
        self.started = started
        self.woken, woken_w = os.pipe()
        os.set_blocking(woken_w, False)
        signal.set_wakeup_fd(woken_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def watch(self, selector: selectors.BaseSelector) -> None:
        """Have `selector` call this spawner's handlers (a key's data is its handler)."""
        selector.register(self.control, selectors.EVENT_READ, self.on_request)
        selector.register(self.woken, selectors.EVENT_READ, self.on_signal)

    def on_signal(self) -> None:
        os.read(self.woken, 4096)
        reap()

    def on_request(self) -> None:
        """Answer one request; raises `ServerGone` once the server's end has closed."""
        try:
            message, fds, flags, _ = socket.recv_fds(
                self.control, MAX_MESSAGE, MAX_FDS, socket.MSG_CMSG_CLOEXEC
            )
        except OSError as exc:
            raise ServerGone from exc
        if not message and not fds:
            raise ServerGone
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                os.close(fd)
            reply = "error the request was too long"
        else:
            reply = answer(message, fds, self.started)
        try:
            self.control.send(f"{number_of(message)} {reply}".encode())
        except OSError as exc:
            raise ServerGone from exc


def load_forwarder() -> ModuleType:
    """forwarder.py beside this script, as a module (from its compiled form when fresh)."""
    spec = importlib.util.spec_from_file_location("corral_forwarder", FORWARDER)
    if spec is None or spec.loader is None:
        sys.exit(f"spawner: no forwarder at {FORWARDER}")
    forwarder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(forwarder)
    return forwarder


def egress_loop(path: str) -> tuple[selectors.BaseSelector, Callable[[float], None]]:
    """The forwarder's listeners bound and its relay to the unix socket `path`: the
    relay's selector, and one turn of it (which also calls the handlers of other keys)."""
    forwarder = load_forwarder()
    relay = forwarder.Relay(path, forwarder.listen_all())
    return relay.selector, relay.turn


def plain_loop() -> tuple[selectors.BaseSelector, Callable[[float], None]]:
    """A selector, and one turn of it: each ready key's handler called."""
    selector = selectors.DefaultSelector()

    def turn(timeout_s: float) -> None:
        for key, _ in selector.select(timeout_s):
            key.data()

    return selector, turn


def main() -> None:
    args = sys.argv[1:]
    if len(args) not in (1, 3) or not args[0].isdigit() or args[1:2] not in ([], ["--egress"]):
        sys.exit(USAGE)
    control = socket.socket(fileno=int(args[0]))
    control.set_inheritable(False)
    # with egress, listening before any kernel starts
    selector, turn = egress_loop(args[2]) if len(args) == 3 else plain_loop()
    started: set[int] = set()
    Spawner(control, started).watch(selector)
    try:
        while True:
            turn(LOOK_S)
    except ServerGone:
        pass
    finally:
        kill_all(started)


if __name__ == "__main__":
    main()
