"""The in-sandbox forwarder: 127.0.0.1:3128 (HTTP proxy) and :1080 (SOCKS5) to the host proxy.

`Relay` moves every connection accepted on both ports to the unix socket SOCKET (one byte
saying which port, then the bytes as they come). It parses nothing and decides nothing: all
policy lives on the host. A session's sandbox runs it in its spawner's loop
(`spawner.py --egress SOCKET`: the spawner's keys on `Relay.selector` hold handlers, which
`turn` calls). Other sandboxes (the browser's) run this file as
`python forwarder.py SOCKET -- COMMAND...`: it binds both ports first, forks a child that
relays, and execs COMMAND in the parent, so the command stays the sandbox's main process
and the relay dies with it.

The relay is one `selectors` loop, standard library only: asyncio alone would hold about
5 MiB more of every session's memory, for a loop that only moves bytes.
Each direction of a connection reads while less than `HIGH_WATER` waits to be written (a
full socket pauses the side that feeds it), passes the end of what one side sends on to the other
(a half-close; a side that resets its connection has ended too, and what it sent before
still reaches the other side), and the pair ends when both ends have passed, when a write
fails, or after an hour with nothing moving (the host proxy holds the real idle limit).
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import time

HTTP_PORT, SOCKS_PORT = 3128, 1080
KINDS = {HTTP_PORT: b"H", SOCKS_PORT: b"S"}
CHUNK = 256 * 1024
READS_PER_TURN = 16  # a busy connection yields to the others after this many reads
HIGH_WATER = 512 * 1024  # a direction stops reading while this much waits for its sink
IDLE_TIMEOUT_S = 3600.0  # the host proxy enforces the real idle limit
LOOK_S = 5.0  # idle connections are looked for this often
CONNECT_S = 5.0  # the host proxy's socket takes a connection at once unless its queue is full
ACCEPT_PAUSE_S = 1.0  # a listener that cannot accept (no descriptor left) rests this long


def listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


def listen_all() -> dict[bytes, socket.socket]:
    """Both listeners, by the kind byte their connections are sent with."""
    return {KINDS[port]: listen(port) for port in KINDS}


class Pipe:
    """One direction of a connection: what `source` sends, written to `sink`."""

    def __init__(self, source: socket.socket, sink: socket.socket, first: bytes = b"") -> None:
        self.source = source
        self.sink = sink
        self.waiting = bytearray(first)  # read, not yet written
        self.ended = False  # the source sent all it will
        self.passed = False  # and its end was passed on to the sink

    @property
    def reading(self) -> bool:
        """The source is read while less than `HIGH_WATER` waits for the sink."""
        return not self.ended and len(self.waiting) < HIGH_WATER

    def read(self) -> None:
        """Read what the source has and write what the sink takes, until the source has
        nothing more, `HIGH_WATER` waits, or `READS_PER_TURN` reads; raises `OSError`."""
        for _ in range(READS_PER_TURN):
            try:
                data = self.source.recv(CHUNK)
            except BlockingIOError:  # nothing more: the next turn looks again
                return
            except ConnectionError:  # reset: an end, once what it sent before is written
                data = b""
            if not data:
                self.ended = True
                self.pass_end()
                return
            if self.waiting:
                self.waiting += data
                self.write()
            else:
                self.write_new(data)
            if not self.reading:
                return

    def write_new(self, data: bytes) -> None:
        """Write `data` when nothing waits before it; what the sink does not take waits."""
        try:
            sent = self.sink.send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            self.waiting += memoryview(data)[sent:]

    def write(self) -> None:
        try:
            sent = self.sink.send(self.waiting)
        except BlockingIOError:
            return
        del self.waiting[:sent]
        self.pass_end()

    def pass_end(self) -> None:
        if self.ended and not self.waiting and not self.passed:
            self.passed = True
            self.sink.shutdown(socket.SHUT_WR)


class Link:
    """A client's connection and its connection to the host proxy."""

    def __init__(self, client: socket.socket, upstream: socket.socket, kind: bytes) -> None:
        self.client = client
        self.upstream = upstream
        self.up = Pipe(client, upstream, first=kind)
        self.down = Pipe(upstream, client)
        self.last_active = time.monotonic()

    @property
    def done(self) -> bool:
        return self.up.passed and self.down.passed

    def wanted(self, sock: socket.socket) -> int:
        """The events `sock` is watched for now."""
        out, into = (self.up, self.down) if sock is self.client else (self.down, self.up)
        return (selectors.EVENT_READ if out.reading else 0) | (
            selectors.EVENT_WRITE if into.waiting else 0
        )

    def on(self, sock: socket.socket, events: int) -> None:
        """`sock` is ready for `events`; raises `OSError` when the connection broke."""
        self.last_active = time.monotonic()
        out, into = (self.up, self.down) if sock is self.client else (self.down, self.up)
        if events & selectors.EVENT_WRITE and into.waiting:
            into.write()
        if events & selectors.EVENT_READ and out.reading:
            out.read()


class Relay:
    """Every connection accepted on the listeners, relayed to the unix socket `path`."""

    def __init__(self, path: str, listeners: dict[bytes, socket.socket]) -> None:
        self.path = path
        self.selector = selectors.DefaultSelector()
        self.links: set[Link] = set()
        self.kinds = {listener: kind for kind, listener in listeners.items()}
        self.resting: dict[socket.socket, float] = {}  # listeners that rest, until when
        self.looked = time.monotonic()  # for idle connections, last
        for listener, kind in self.kinds.items():
            self.selector.register(listener, selectors.EVENT_READ, kind)

    def run(self) -> None:
        """Relay until the process ends."""
        while True:
            self.turn(LOOK_S)

    def turn(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for sockets that are ready, and serve them."""
        rest = [at - time.monotonic() for at in self.resting.values()]
        for key, events in self.selector.select(max(0.0, min([timeout_s, *rest]))):
            if isinstance(key.data, bytes):
                self.accept(key.fileobj, key.data)  # type: ignore[arg-type]
            elif isinstance(key.data, Link):
                self.serve(key.data, key.fileobj, events)  # type: ignore[arg-type]
            else:  # a key of the process the relay runs in (the spawner's): its handler
                key.data()
        self.wake_rested()
        if time.monotonic() - self.looked >= LOOK_S:
            self.looked = time.monotonic()
            self.end_idle()

    def accept(self, listener: socket.socket, kind: bytes) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError:  # no descriptor left, say: it rests instead of spinning
                self.selector.unregister(listener)
                self.resting[listener] = time.monotonic() + ACCEPT_PAUSE_S
                return
            client.setblocking(False)
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.settimeout(CONNECT_S)
                upstream.connect(self.path)
                upstream.setblocking(False)
            except OSError:  # the proxy is gone: the client sees its connection closed
                upstream.close()
                client.close()
                continue
            link = Link(client, upstream, kind)
            self.links.add(link)
            for sock in (client, upstream):
                self.watch(link, sock)

    def serve(self, link: Link, sock: socket.socket, events: int) -> None:
        if link not in self.links:  # ended by an earlier event of the same turn
            return
        try:
            link.on(sock, events)
        except OSError:
            self.end(link)
            return
        if link.done:
            self.end(link)
            return
        for each in (link.client, link.upstream):
            self.watch(link, each)

    def watch(self, link: Link, sock: socket.socket) -> None:
        wanted = link.wanted(sock)
        key = self.selector.get_map().get(sock)
        if key is not None and key.events == wanted:
            return
        if wanted and key is not None:
            self.selector.modify(sock, wanted, link)
        elif wanted:
            self.selector.register(sock, wanted, link)
        elif key is not None:
            self.selector.unregister(sock)

    def end(self, link: Link) -> None:
        self.links.discard(link)
        for sock in (link.client, link.upstream):
            if sock in self.selector.get_map():
                self.selector.unregister(sock)
            sock.close()

    def wake_rested(self) -> None:
        now = time.monotonic()
        for listener, at in list(self.resting.items()):
            if at <= now:
                del self.resting[listener]
                self.selector.register(listener, selectors.EVENT_READ, self.kinds[listener])

    def end_idle(self) -> None:
        now = time.monotonic()
        for link in [link for link in self.links if now - link.last_active >= IDLE_TIMEOUT_S]:
            self.end(link)


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: forwarder.py SOCKET -- COMMAND...")
    path, command = argv[1], argv[3:]
    sockets = listen_all()
    if os.fork() == 0:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        Relay(path, sockets).run()
        os._exit(0)
    for sock in sockets.values():
        sock.close()
    os.execv(command[0], command)  # noqa: S606 - exec the kernel in place, by design


if __name__ == "__main__":
    main(sys.argv)
