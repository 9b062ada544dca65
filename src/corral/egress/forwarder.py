"""The in-sandbox forwarder: 127.0.0.1:3128 (HTTP proxy) and :1080 (SOCKS5) to the host proxy.

Run inside the sandbox as `python forwarder.py SOCKET -- KERNEL ARGV...`. It binds both ports
first, forks a child that relays every accepted connection to the unix socket SOCKET (one
byte saying which port, then the bytes as they come), and execs the kernel in the parent, so
the kernel stays the sandbox's main process and the relay dies with it. It parses nothing
and decides nothing: all policy lives on the host.

Only the child imports asyncio (through relay.py, bound beside this file): the kernel's start
is not made to wait for that import.
"""

from __future__ import annotations

import os
import socket
import sys

HTTP_PORT, SOCKS_PORT = 3128, 1080
KINDS = {HTTP_PORT: b"H", SOCKS_PORT: b"S"}


def listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


def run_relay(path: str, sockets: dict[bytes, socket.socket]) -> None:
    """The child's whole life: relay connections until the sandbox ends."""
    try:
        from corral.egress import relay
    except ImportError:  # inside the sandbox: relay.py is bound beside this file
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import relay  # type: ignore[import-not-found,no-redef]
    relay.run_forwarder(path, sockets)


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: forwarder.py SOCKET -- COMMAND...")
    path, command = argv[1], argv[3:]
    sockets = {KINDS[port]: listen(port) for port in KINDS}
    if os.fork() == 0:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        run_relay(path, sockets)
        os._exit(0)
    for sock in sockets.values():
        sock.close()
    os.execv(command[0], command)  # noqa: S606 - exec the kernel in place, by design


if __name__ == "__main__":
    main(sys.argv)
