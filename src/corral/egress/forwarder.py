"""The in-sandbox forwarder: 127.0.0.1:3128 (HTTP proxy) and :1080 (SOCKS5) to the host proxy.

Run inside the sandbox as `python forwarder.py SOCKET -- KERNEL ARGV...`. It binds both ports
first, forks a child that relays every accepted connection to the unix socket SOCKET (one
byte saying which port, then the bytes as they come), and execs the kernel in the parent, so
the kernel stays the sandbox's main process and the relay dies with it. It parses nothing
and decides nothing: all policy lives on the host. Standard library only, plus relay.py, which
is bound beside it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

try:
    from corral.egress.relay import bridge_streams
except ImportError:  # inside the sandbox: relay.py is bound beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from relay import bridge_streams  # type: ignore[import-not-found,no-redef]

HTTP_PORT, SOCKS_PORT = 3128, 1080
KINDS = {HTTP_PORT: b"H", SOCKS_PORT: b"S"}
IDLE_TIMEOUT_S = 3600.0  # the host proxy enforces the real idle limit


def listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


async def relay(
    kind: bytes, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        up = await asyncio.open_unix_connection(path)
    except OSError:
        writer.close()
        return
    up[1].write(kind)

    await bridge_streams((reader, writer), up, idle_timeout_s=IDLE_TIMEOUT_S)


async def serve(path: str, sockets: dict[int, socket.socket]) -> None:
    servers = [
        await asyncio.start_server(_handler(KINDS[port], path), sock=sock)
        for port, sock in sockets.items()
    ]
    await asyncio.gather(*(server.serve_forever() for server in servers))


def _handler(kind: bytes, path: str):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay(kind, path, reader, writer)

    return handle


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: forwarder.py SOCKET -- COMMAND...")
    path, command = argv[1], argv[3:]
    sockets = {port: listen(port) for port in KINDS}
    if os.fork() == 0:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        asyncio.run(serve(path, sockets))
        os._exit(0)
    for sock in sockets.values():
        sock.close()
    os.execv(command[0], command)  # noqa: S606 - exec the kernel in place, by design


if __name__ == "__main__":
    main(sys.argv)
