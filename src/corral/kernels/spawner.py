"""The first process of a session's sandbox (run as a script inside it, never imported by corral).

A session's kernels share one sandbox: one set of namespaces, one /tmp, one view of its
mounts. This process is what bwrap starts; it starts each kernel when the server asks, so a
kernel added later lands in the same sandbox instead of a second one.

Run as `python spawner.py FD [--egress SOCKET]`: FD is a SOCK_SEQPACKET socket whose other
end only the server holds. With `--egress`, the egress forwarder's listeners (127.0.0.1:3128
and :1080, see forwarder.py, bound beside this script) are bound before any kernel starts,
and its relay to the unix socket SOCKET runs in a thread of this process: a process of its
own would hold about 4.5 MiB more of every session's memory. Each message is one JSON object:

- the server sends `{"spawn": ARGV, "id": N}` with one descriptor attached, the kernel's
  stderr; the answer is `{"pid": PID, "id": N}` (the kernel's pid in the sandbox) or
  `{"error": TEXT, "id": N}`, N echoed so that a late answer is never taken for another's;
- when the server's end closes (the server stopped the session, or died), the process group
  of every kernel started here is killed and this one exits, and with it the sandbox.

A kernel starts in a process group of its own (its pid is the group's id), with stdin and stdout
on /dev/null and the sandbox's environment. This process reaps the kernels it started. It
trusts nothing it is sent beyond starting a command in the sandbox it already runs in, and
the server trusts nothing it answers beyond a pid it checks itself.
"""

import contextlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this script's folder: the kernels' imports must not see it

MAX_MESSAGE = 64 * 1024
MAX_FDS = 1
FORWARDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forwarder.py")
USAGE = "usage: spawner.py FD [--egress SOCKET]"


def start(argv: list[str], stderr_fd: int) -> int:
    """Start one kernel; its pid."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr_fd,
        process_group=0,  # its own group, in the sandbox's one session: not a session
        # leader, so it cannot take a terminal as its controlling one
        close_fds=True,
    )
    return process.pid


def answer(request: object, fds: list[int], started: set[int]) -> dict[str, object]:
    """The reply to one request (always closes the descriptors that came with it)."""
    try:
        argv = request.get("spawn") if isinstance(request, dict) else None
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            return {"error": "a request must be {'spawn': [command, args...]}"}
        if len(fds) != 1:
            return {"error": "a spawn request carries exactly one descriptor, for stderr"}
        try:
            pid = start(argv, fds[0])
            started.add(pid)
            return {"pid": pid}
        except OSError as exc:
            return {"error": f"{argv[0]}: {exc.strerror or exc}"}
    finally:
        for fd in fds:
            os.close(fd)


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


def serve(control: socket.socket, started: set[int]) -> None:
    """Answer requests until the server's end closes; `started` collects the kernels' pids."""
    woken_r, woken_w = os.pipe()
    os.set_blocking(woken_w, False)
    signal.set_wakeup_fd(woken_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(woken_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj == woken_r:
                os.read(woken_r, 4096)
                reap()
                continue
            message, fds, flags, _ = socket.recv_fds(control, MAX_MESSAGE, MAX_FDS)
            if not message and not fds:
                return
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                for fd in fds:
                    os.close(fd)
                reply: dict[str, object] = {"error": "the request was too long"}
            else:
                try:
                    request = json.loads(message)
                except ValueError:
                    request = None
                reply = answer(request, fds, started)
            if isinstance(request, dict):
                reply["id"] = request.get("id")
            control.send(json.dumps(reply).encode())


def start_egress(path: str) -> None:
    """Bind the forwarder's listeners and relay what they accept to `path` in a thread
    that ends with this process."""
    spec = importlib.util.spec_from_file_location("corral_forwarder", FORWARDER)
    if spec is None or spec.loader is None:
        sys.exit(f"spawner: no forwarder at {FORWARDER}")
    forwarder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(forwarder)
    relay = forwarder.Relay(path, forwarder.listen_all())
    threading.Thread(target=relay.run, name="egress-relay", daemon=True).start()


def main() -> None:
    args = sys.argv[1:]
    if len(args) not in (1, 3) or not args[0].isdigit() or args[1:2] not in ([], ["--egress"]):
        sys.exit(USAGE)
    control = socket.socket(fileno=int(args[0]))
    control.set_inheritable(False)
    if len(args) == 3:
        start_egress(args[2])
    started: set[int] = set()
    try:
        serve(control, started)
    except OSError:
        pass  # the server's end is gone
    finally:
        kill_all(started)


if __name__ == "__main__":
    main()
