"""The forwarder's relay on its own, on the host: a client on a TCP listener, relayed to a
unix socket standing for the host proxy (the sandbox's path is tested in
test_sandbox_network.py and test_sandbox_clients.py)."""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from corral.egress.forwarder import Relay

WAIT_S = 10.0


@dataclass
class Forwarding:
    port: int  # where a client connects
    proxy: socket.socket  # the stand-in host proxy, listening
    opened: list[socket.socket] = field(default_factory=list)  # closed after the test


def proxy_at(path: str) -> socket.socket:
    """The stand-in host proxy: a unix socket listening at `path`."""
    proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    proxy.bind(path)
    proxy.listen(8)
    proxy.settimeout(WAIT_S)
    return proxy


def loopback_listener() -> socket.socket:
    """What the forwarder listens on, at a free loopback port (not 3128: tests run at once)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    return listener


@pytest.fixture
def forwarding(tmp_path: Path) -> Iterator[Forwarding]:
    """A relay from a loopback port (kind b"H") to a unix socket, turning in a thread."""
    path = str(tmp_path / "egress.sock")
    proxy = proxy_at(path)
    listener = loopback_listener()
    relay = Relay(path, {b"H": listener})
    done = threading.Event()

    def turn() -> None:
        while not done.is_set():
            relay.turn(0.05)

    thread = threading.Thread(target=turn, daemon=True)
    thread.start()
    forwarding = Forwarding(listener.getsockname()[1], proxy)
    try:
        yield forwarding
    finally:
        for sock in forwarding.opened:
            sock.close()
        done.set()
        thread.join(WAIT_S)
        listener.close()
        proxy.close()
        for link in list(relay.links):
            relay.end(link)


def client_to(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    client.settimeout(WAIT_S)
    return client


def connected(forwarding: Forwarding) -> tuple[socket.socket, socket.socket]:
    """A client's connection, and the one the relay opened for it to the proxy."""
    client = client_to(forwarding.port)
    upstream, _ = forwarding.proxy.accept()
    upstream.settimeout(WAIT_S)
    forwarding.opened += [client, upstream]
    return client, upstream


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def closed_on(sock: socket.socket) -> bool:
    """The peer ended the connection: an end of data, or a reset (it closed with our bytes
    unread)."""
    try:
        return read_all(sock) == b""
    except ConnectionResetError:
        return True


def test_bytes_go_both_ways_after_the_kind_byte_and_each_end_is_passed_on(
    forwarding: Forwarding,
) -> None:
    client, upstream = connected(forwarding)
    client.sendall(b"GET / HTTP/1.1\r\n\r\n")
    client.shutdown(socket.SHUT_WR)  # the client is done sending, still reading
    assert read_all(upstream) == b"HGET / HTTP/1.1\r\n\r\n"
    upstream.sendall(b"HTTP/1.1 200 OK\r\n\r\nbody")
    upstream.shutdown(socket.SHUT_WR)
    assert read_all(client) == b"HTTP/1.1 200 OK\r\n\r\nbody"
    client.close()
    upstream.close()


def test_a_download_larger_than_any_buffer_arrives_whole_to_a_slow_reader(
    forwarding: Forwarding,
) -> None:
    client, upstream = connected(forwarding)
    payload = bytes(range(256)) * (32 * 1024)  # 8 MiB
    sender = threading.Thread(target=lambda: (upstream.sendall(payload), upstream.close()))
    sender.start()
    received = bytearray()
    while chunk := client.recv(4096):  # small reads: the relay must hold back, not drop
        received += chunk
    sender.join(WAIT_S)
    assert len(received) == len(payload) and bytes(received) == payload
    client.close()


def test_what_the_proxy_sent_before_resetting_its_connection_still_arrives(
    forwarding: Forwarding,
) -> None:
    """The proxy closes with bytes of ours unread (a refusal sent while a body still
    came): its connection is reset, and the answer it sent before must still arrive."""
    client, upstream = connected(forwarding)
    answer = b"HTTP/1.1 403 Forbidden\r\n\r\n" + b"x" * (2 * 1024 * 1024)
    sender = threading.Thread(target=lambda: (upstream.sendall(answer), upstream.close()))
    sender.start()  # it never reads the kind byte: its close resets the connection
    received = read_all(client)
    sender.join(WAIT_S)
    assert len(received) == len(answer) and received == answer


def test_a_client_whose_proxy_went_away_sees_its_connection_closed(
    forwarding: Forwarding,
) -> None:
    client, upstream = connected(forwarding)
    upstream.close()
    client.sendall(b"CONNECT example.org:443 HTTP/1.1\r\n\r\n")
    assert closed_on(client)
    client.close()


def test_a_client_is_closed_when_no_proxy_listens(tmp_path: Path) -> None:
    listener = loopback_listener()
    relay = Relay(str(tmp_path / "nobody.sock"), {b"S": listener})
    client = client_to(listener.getsockname()[1])
    relay.turn(WAIT_S)  # the waiting connection is accepted, and its proxy is not there
    assert closed_on(client) and not relay.links
    client.close()
    listener.close()


def test_an_event_of_a_connection_ended_earlier_in_the_same_turn_is_passed_over(
    tmp_path: Path,
) -> None:
    """One select can report both sockets of a connection; serving the first may end it."""
    path = str(tmp_path / "egress.sock")
    proxy = proxy_at(path)
    listener = loopback_listener()
    relay = Relay(path, {b"H": listener})
    client = client_to(listener.getsockname()[1])
    relay.turn(WAIT_S)  # the waiting connection is accepted and linked to the proxy
    (link,) = relay.links
    relay.end(link)
    relay.serve(link, link.client, selectors.EVENT_READ | selectors.EVENT_WRITE)
    assert not relay.links and link.client.fileno() == -1
    for sock in (client, listener, proxy):
        sock.close()


def test_a_key_of_the_process_the_relay_runs_in_has_its_handler_called(
    tmp_path: Path,
) -> None:
    """The spawner shares the relay's loop: its keys on the selector hold handlers."""
    listener = loopback_listener()
    relay = Relay(str(tmp_path / "egress.sock"), {b"H": listener})
    ours, theirs = socket.socketpair()
    called: list[bytes] = []
    relay.selector.register(ours, selectors.EVENT_READ, lambda: called.append(ours.recv(16)))
    theirs.sendall(b"wake")
    relay.turn(WAIT_S)
    assert called == [b"wake"] and not relay.links
    for sock in (ours, theirs, listener):
        sock.close()
