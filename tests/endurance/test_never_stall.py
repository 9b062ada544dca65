"""The server never stalls and forgets nothing, against a real `corral serve` process.

- Code running when the server is SIGKILLed is in the audit log after the restart, marked
  interrupted (server stopped), and a `server` entry says the last run did not stop cleanly.
- An entry the locked database refused is not lost when the server is killed before the
  database lets go.
- With the state database locked by another program, `/health` and a running session's
  executions answer while a new session waits for the lock.

Figures are printed (`pytest -s`), never asserted as timings: what is asserted is the order
of observable events (every call answered while the lock was still held, before the call
that needs the database).
"""

from __future__ import annotations

import concurrent.futures
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.endurance.calls import (
    WAIT_S,
    audit,
    call,
    create,
    execute,
    locked_database,
    read_file,
    wait_until,
)
from tests.endurance.served import Served, served

pytestmark = pytest.mark.bwrap

SLEEPERS = 4


@pytest.fixture(scope="module")
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=SLEEPERS + 4) as executor:
        yield executor


def sleeper(sid: str) -> str:
    """Code that marks the workspace, then sleeps far past the test."""
    return (
        "import pathlib, time\n"
        f"pathlib.Path('/workspace/asleep').write_text('{sid}')\n"
        "time.sleep(40)\n"
    )


def killed(server: Served) -> None:
    """SIGKILL the server, and wait (bounded) until its sandboxes went with it."""
    process = server.process
    assert process is not None
    process.kill()
    process.wait(WAIT_S)
    wait_until(lambda: not server.sandboxes(), "the killed server's sandboxes to go")


def test_code_running_when_the_server_is_killed_is_audited_as_interrupted(
    tmp_path: Path, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    with served(tmp_path) as server:
        sids = [f"sleep{n}" for n in range(SLEEPERS)]
        for sid in sids:
            create(server, sid)
        calls = [
            pool.submit(
                call, server, "POST", f"/v1/sessions/{sid}/execute", json={"code": sleeper(sid)}
            )
            for sid in sids
        ]
        for sid in sids:
            wait_until(lambda sid=sid: read_file(server, sid, "asleep"), f"{sid} to be asleep")
        running = {e["session"]: e["status"] for e in audit(server, kind="execution")}
        assert running == dict.fromkeys(sids, "running")

        killed(server)
        answers = [future.result(timeout=WAIT_S) for future in calls]
        assert all(answer.status is None for answer in answers), answers  # cut off
        server.start()

        entries = {e["session"]: e for e in audit(server, kind="execution")}
        assert sorted(entries) == sids
        for sid in sids:
            entry = entries[sid]
            assert (entry["status"], entry["code"]) == ("interrupted", sleeper(sid)), entry
            assert entry["detail"]["interrupted"] == "server stopped"
        (stop,) = audit(server, kind="server")
        assert (stop["action"], stop["actor"]) == ("stopped-uncleanly", "system")
        assert stop["detail"]["interrupted_executions"] == SLEEPERS
        print(f"\nSIGKILL with {SLEEPERS} executions running: {SLEEPERS}/{SLEEPERS} audited")

        # A clean stop after that leaves no such entry at the next start.
        server.restart()
        assert len(audit(server, kind="server")) == 1


def test_an_entry_the_locked_database_refused_outlives_a_kill(tmp_path: Path) -> None:
    with served(tmp_path) as server:
        create(server, "held")
        with locked_database(server.state_dir / "corral.db"):
            result = execute(server, "held", "print('while locked')")
            assert result["stdout"] == "while locked\n"
            killed(server)  # before the database took the entry
        server.start()
        (entry,) = audit(server, kind="execution", session="held")
        assert (entry["code"], entry["status"]) == ("print('while locked')", "ok")


LOCK_S = 15.0  # longer than the database's busy timeout (10 s)
PROBES = 20


def timed(action: Callable[[], None]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def test_a_locked_database_holds_up_neither_health_nor_a_running_session(
    tmp_path: Path, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    with served(tmp_path) as server:
        create(server, "steady")
        assert execute(server, "steady", "1 + 1")["results"] == [{"text/plain": "2"}]
        before = probe(server)
        with locked_database(server.state_dir / "corral.db"):
            locked = time.monotonic()
            creating = pool.submit(call, server, "POST", "/v1/sessions", json={"id": "locked-out"})
            # A loop blocked by the database would answer /health only once the creation
            # gave up, after the 10 s busy timeout; a free one answers while it waits.
            assert_healthy(server)
            assert not creating.done()
            during = probe(server)  # figures only: under load 20 rounds may outlast the wait
            refused = creating.result(timeout=WAIT_S)
            wait_until(lambda: time.monotonic() - locked >= LOCK_S, "the lock's end", LOCK_S + 1)
        assert refused.status == 503 and "locked" in (refused.json_message or ""), refused
        print(
            f"\nGET /health and a running session's 1+1, {PROBES} each, median and max in ms: "
            f"before {before}; while the state db was locked {LOCK_S:g} s {during}; the new "
            "session answered 503 after the busy timeout"
        )
        # Once the lock is gone, everything that ran in the meantime is in the audit log.
        wait_until(
            lambda: len(audit(server, kind="execution", session="steady")) == 2 * PROBES + 1,
            "the executions run under the lock to be written",
        )
        assert call(server, "POST", "/v1/sessions", json={"id": "locked-out"}).status == 201


def probe(server: Served) -> str:
    """`PROBES` health checks and 1+1 executions, one after another: their figures."""
    health: list[float] = []
    runs: list[float] = []
    for _ in range(PROBES):
        health.append(timed(lambda: assert_healthy(server)))
        runs.append(timed(lambda: assert_two(server)))
    return f"/health {figures(health)}, 1+1 {figures(runs)}"


def figures(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1000:.1f}/{max(seconds) * 1000:.1f}"


def assert_healthy(server: Served) -> None:
    answer = call(server, "GET", "/health")
    assert answer.status == 200, answer


def assert_two(server: Served) -> None:
    assert execute(server, "steady", "1 + 1")["results"] == [{"text/plain": "2"}]


DISCONNECTS = 100


def abandon_body(server: Served, path: str, *, declared: int = 4096) -> None:
    """Send a request's headers and a part of its body, then go away."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as conn:
        head = (
            f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Authorization: Bearer {server.token()}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {declared}\r\n\r\n"
        )
        conn.sendall(head.encode() + b"x" * 100)


def test_clients_that_go_away_mid_body_are_one_quiet_line_each(tmp_path: Path) -> None:
    with served(tmp_path) as server:
        create(server, "gone")
        upload = "/v1/sessions/gone/files/content?path=abandoned.bin"
        abandon_body(server, upload)  # the first one may log more (imports, warm-up)
        wait_until(lambda: server.log().count("went away") == 1, "the first disconnect's line")
        before = len(server.log().encode())
        for _ in range(DISCONNECTS):
            abandon_body(server, upload)
        wait_until(
            lambda: server.log().count("went away") == DISCONNECTS + 1,
            "a line for each disconnect",
        )
        health = timed(lambda: assert_healthy(server))
        grown = len(server.log().encode()) - before
        print(
            f"\n{DISCONNECTS} clients gone mid-body: {grown / DISCONNECTS:.0f} log bytes each; "
            f"GET /health then took {health * 1000:.1f} ms"
        )
        log = server.log()
        assert "Traceback" not in log and "crashed" not in log
        assert grown <= DISCONNECTS * 200, log[-2000:]
        listing = call(server, "GET", "/v1/sessions/gone/files", params={"path": "."})
        assert listing.status == 200, listing
        assert [e["name"] for e in listing.body["entries"]] == []  # the upload left nothing


# -- slow clients --------------------------------------------------------------------------

HEADER_S = 2.0  # the read bounds this server is given (small, so the test is short)
BODY_IDLE_S = 2.0
BODY_TOTAL_S = 6.0
CAP = 40
SLOW = 30  # slowloris connections: fewer than the cap


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served(
        tmp_path_factory.mktemp("slow"),
        header_timeout_s=str(HEADER_S),
        body_idle_timeout_s=str(BODY_IDLE_S),
        body_timeout_s=str(BODY_TOTAL_S),
        max_connections=str(CAP),
    ) as server:
        create(server, "slow")
        yield server


def connect(server: Served) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    conn.settimeout(HEADER_S + WAIT_S)
    return conn


def closed_by_server(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the socket's
    timeout: a server that never closes fails the test)."""
    received = b""
    try:
        while chunk := conn.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def test_connections_that_never_finish_their_headers_are_closed(bounded: Served) -> None:
    conns = [connect(bounded) for _ in range(SLOW)]
    for conn in conns:  # a request line and part of a header, then nothing more
        conn.sendall(
            f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{bounded.port}\r\nX-Slow: a".encode()
        )
    assert_healthy(bounded)  # the server answers others meanwhile
    started = time.monotonic()
    answers = [closed_by_server(conn) for conn in conns]
    closed_s = time.monotonic() - started
    for conn in conns:
        conn.close()
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), answers[:3]
    print(
        f"\n{SLOW} slowloris connections closed {closed_s:.1f} s after the last byte "
        f"(bound {HEADER_S:g} s)"
    )


def test_a_body_that_stops_is_answered_408_and_closed(bounded: Served) -> None:
    conn = connect(bounded)
    conn.sendall(
        f"POST /v1/sessions/slow/execute HTTP/1.1\r\nHost: 127.0.0.1:{bounded.port}\r\n".encode()
        + f"Authorization: Bearer {bounded.token()}\r\n".encode()
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b'5\r\n{"cod\r\n'  # a chunk, and never the last one
    )
    answer = closed_by_server(conn)
    conn.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"the request body" in answer


def test_a_body_that_trickles_past_its_total_time_is_answered_408(bounded: Served) -> None:
    conn = connect(bounded)
    conn.sendall(
        b"PUT /v1/sessions/slow/files/content?path=trickle.bin HTTP/1.1\r\n"
        + f"Host: 127.0.0.1:{bounded.port}\r\n".encode()
        + f"Authorization: Bearer {bounded.token()}\r\n".encode()
        + b"Content-Length: 1000\r\n\r\n"
    )
    deadline = time.monotonic() + BODY_TOTAL_S + WAIT_S  # bounded: the server must answer
    conn.setblocking(False)
    answer = b""
    while time.monotonic() < deadline and not answer:
        try:
            conn.send(b"x")  # one byte at a time, each within the idle bound
        except OSError:
            break
        time.sleep(BODY_IDLE_S / 4)
        try:
            answer = conn.recv(65536)
        except BlockingIOError:
            continue
        except OSError:
            break
    conn.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    listing = call(bounded, "GET", "/v1/sessions/slow/files", params={"path": "."})
    assert "trickle.bin" not in [e["name"] for e in listing.body["entries"]]


def test_past_the_connection_cap_a_request_is_refused_until_slow_ones_go(bounded: Served) -> None:
    conns = [connect(bounded) for _ in range(CAP)]
    for conn in conns:
        conn.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{bounded.port}\r\n".encode())
    assert call(bounded, "GET", "/health").status == 503
    for conn in conns:
        closed_by_server(conn)
        conn.close()
    wait_until(lambda: call(bounded, "GET", "/health").status == 200, "the cap to have room")


def health_request(server: Served) -> bytes:
    return f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode()


def read_response(conn: socket.socket) -> bytes:
    """One whole response to /health (its body is small and JSON)."""
    received = b""
    while not received.endswith(b"}"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def test_a_kept_alive_connection_idle_past_the_header_bound_is_reused(bounded: Served) -> None:
    # Idle between requests is the keep-alive's business (silent, and long): a client that
    # reuses its connection after a pause gets an answer, not a 408.
    with connect(bounded) as conn:
        conn.sendall(health_request(bounded))
        assert read_response(conn).startswith(b"HTTP/1.1 200 ")
        idle_until = time.monotonic() + HEADER_S + 1
        wait_until(lambda: time.monotonic() >= idle_until, "the pause", HEADER_S + 2)
        conn.sendall(health_request(bounded))
        assert read_response(conn).startswith(b"HTTP/1.1 200 ")


def test_slow_headers_on_a_kept_alive_connection_are_closed(bounded: Served) -> None:
    with connect(bounded) as conn:
        conn.sendall(health_request(bounded))
        assert read_response(conn).startswith(b"HTTP/1.1 200 ")
        conn.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{bounded.port}\r\nX-".encode())
        assert closed_by_server(conn).startswith(b"HTTP/1.1 408 ")
