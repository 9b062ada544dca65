"""The in-sandbox end of the agent bridge: a local SSH_AUTH_SOCK relayed to the host bridge.

Run inside the sandbox as `python bridge_shim.py HOST_SOCKET TOKEN_FILE LISTEN_PATH -- KERNEL...`
(it forks the relay and execs the kernel), or without a command to serve in the foreground.
It reads the session's token once, listens on LISTEN_PATH
(mode 0600; the path appears only once it accepts connections), and for every client opens a
connection to HOST_SOCKET, sends the handshake line, then passes bytes both ways, one thread
per direction. It parses nothing of the agent protocol and decides nothing: the host checks
the token and the service, and holds the keys.

Stdlib only, and nothing of corral is imported, so the same file serves as `corral.bridge_shim`
on the host (where `corral.bridge` takes the handshake format from it) and as a plain script
bound into the sandbox.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import sys
import threading
import time

MAGIC = b"corral-bridge"
VERSION = b"1"
MAX_HANDSHAKE_BYTES = 256
SSH_AGENT = "ssh-agent"

CHUNK_BYTES = 65536
LISTEN_BACKLOG = 64
ACCEPT_BACKOFF_S = 0.05
# Failures of one accept that say nothing about the listener itself: wait a little, go on.
_ACCEPT_TRANSIENT = frozenset(
    {errno.ECONNABORTED, errno.EINTR, errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
)


def handshake(token: str, service: str) -> bytes:
    """The line a bridge client sends before anything else: `corral-bridge 1 TOKEN SERVICE\\n`.

    Raises ValueError for an empty word, a word with a space or a character that is not
    printable ASCII, or a line past MAX_HANDSHAKE_BYTES.
    """
    for word in (token, service):
        if not word or not word.isascii() or not word.isprintable() or " " in word:
            raise ValueError("a bridge token or service must be printable ASCII without spaces")
    line = b" ".join((MAGIC, VERSION, token.encode("ascii"), service.encode("ascii"))) + b"\n"
    if len(line) > MAX_HANDSHAKE_BYTES:
        raise ValueError(f"a bridge handshake is at most {MAX_HANDSHAKE_BYTES} bytes")
    return line


def listen(path: str) -> socket.socket:
    """A listening unix socket at `path`, mode 0600.

    It is bound under a staging name and renamed into place, so a client that sees the path
    can connect at once. A stale socket is replaced; anything else at `path` raises
    FileExistsError.
    """
    staging = f"{path}.{os.getpid()}"
    for name in (staging, path):
        _remove_stale_socket(name)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(staging)
        os.chmod(staging, 0o600)
        sock.listen(LISTEN_BACKLOG)
        os.rename(staging, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise
    return sock


def _remove_stale_socket(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"{path} exists and is not a socket")
    os.unlink(path)


def serve(host_socket: str, token: str, listen_path: str) -> None:
    """Relay every connection to `listen_path` through the host bridge. Never returns.

    Raises ValueError for a malformed token (before listening) and OSError when listening
    fails or the listener breaks.
    """
    line = handshake(token, SSH_AGENT)
    with listen(listen_path) as listener:
        _accept_forever(listener, host_socket, line)


def _accept_forever(listener: socket.socket, host_socket: str, line: bytes) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError as exc:
            if exc.errno not in _ACCEPT_TRANSIENT:
                raise
            time.sleep(ACCEPT_BACKOFF_S)
            continue
        worker = threading.Thread(target=_relay, args=(client, host_socket, line), daemon=True)
        worker.start()


def launch(host_socket: str, token: str, listen_path: str, command: list[str]) -> None:
    """Listen, fork a child that relays, and exec `command` in this process (the kernel).

    The socket exists before the command starts, so the kernel's first `ssh` finds it; the
    relay child dies with the sandbox.
    """
    line = handshake(token, SSH_AGENT)
    listener = listen(listen_path)
    if os.fork() == 0:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            _accept_forever(listener, host_socket, line)
        finally:
            os._exit(0)
    listener.close()
    os.execv(command[0], command)  # noqa: S606 - exec the next launcher in place, by design


def _relay(client: socket.socket, host_socket: str, line: bytes) -> None:
    """One client's whole connection; a host that cannot be reached just closes it."""
    with client:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with upstream:
            try:
                upstream.connect(host_socket)
                upstream.sendall(line)
            except OSError:
                return
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy `source` to `sink` until its end, then pass the end on (a half close).

    On an error both sockets are shut down, which also ends the pump going the other way.
    """
    try:
        while data := source.recv(CHUNK_BYTES):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def main(argv: list[str]) -> None:
    """`HOST_SOCKET TOKEN_FILE LISTEN_PATH`, serving; with `-- COMMAND...`, then exec it."""
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    if len(argv) != 4:
        sys.exit("usage: bridge_shim.py HOST_SOCKET TOKEN_FILE LISTEN_PATH [-- COMMAND...]")
    host_socket, token_file, listen_path = argv[1:]
    with open(token_file, encoding="ascii") as file:
        token = file.read().strip()
    if command:
        launch(host_socket, token, listen_path, command)
    serve(host_socket, token, listen_path)


if __name__ == "__main__":
    main(sys.argv)
