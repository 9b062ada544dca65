"""Faults a running corral must live through, each against the real thing.

A kernel SIGKILLed mid-execution, the egress proxy restarted, the state database locked by
another program, the state disk full, the server SIGTERMed during executions. In each case
the affected call gets a clear answer, nothing else is lost, and sessions carry on (after a
restart: they resume). The servers are `corral serve` processes (see served.py) with real
sandboxes and kernels; the egress test drives the service in-process, because nothing outside
the server can restart its proxy. Network is loopback only. Every wait is bounded in count and
time; figures are printed (`pytest -s`), never asserted as timings.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.server
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from corral.kernels.results import ExecutionResult
from corral.service import Service
from tests.endurance.calls import (
    WAIT_S,
    Answer,
    audit,
    call,
    create,
    execute,
    locked_database,
    put_file,
    read_file,
    sessions,
    wait_until,
)
from tests.endurance.served import Served, alive, served
from tests.loopback import HOST, serve
from tests.mounting import mounted_tmpfs

pytestmark = pytest.mark.bwrap

# -- helpers -------------------------------------------------------------------------------


def named(processes: list[psutil.Process], name: str) -> list[psutil.Process]:
    """The processes called `name`, in order; those that ended meanwhile are left out."""
    found = []
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            if proc.name() == name:
                found.append(proc)
    return found


def ticking(name: str, count: int, *, marker: str, then: str = "") -> str:
    """Code that writes /workspace/MARKER, then prints `name i` `count` times, 0.1 s apart."""
    return (
        "import pathlib, time\n"
        f"pathlib.Path('/workspace/{marker}').write_text('started')\n"
        f"for i in range({count}):\n"
        f"    print('{name}', i, flush=True)\n"
        "    time.sleep(0.1)\n"
        f"{then}"
    )


def output_arrived(server: Served, session_id: str) -> bool:
    """The server holds output of the session's running execution (its kept events)."""
    answer = call(server, "GET", "/v1/executions", params={"session_id": session_id})
    assert answer.status == 200, answer
    return any(e["state"] == "running" and e["events"] > 0 for e in answer.body["executions"])


def ticks(name: str, count: int) -> str:
    return "".join(f"{name} {i}\n" for i in range(count))


@pytest.fixture(scope="module")
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """Threads for calls that must be in flight while a test breaks something."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as executor:
        yield executor


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One `corral serve` for the tests that break a kernel or the database, not the server."""
    with served(tmp_path_factory.mktemp("faults")) as running:
        yield running


# -- a kernel SIGKILLed mid-execution ------------------------------------------------------

VICTIM_NAME = "corral-victim"  # the kernel renames itself so the host can find its process


def test_kernel_sigkilled_mid_execution_fails_that_call_only_and_the_next_call_resumes(
    server: Served, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    create(server, "victim")
    create(server, "bystander")
    assert put_file(server, "victim", "keep.txt", b"kept").status == 201
    execute(server, "victim", "x = 41")
    count = 40
    bystander = pool.submit(
        execute, server, "bystander", ticking("tick", count, marker="ticking", then="'done'\n")
    )
    victim_code = (
        "import ctypes\n"
        f"ctypes.CDLL(None).prctl(15, b'{VICTIM_NAME}', 0, 0, 0)\n"  # PR_SET_NAME
        + ticking("victim", 600, marker="running")
    )
    victim = pool.submit(
        call, server, "POST", "/v1/sessions/victim/execute", json={"code": victim_code}
    )
    wait_until(lambda: output_arrived(server, "victim"), "the victim's first line to arrive")
    wait_until(lambda: read_file(server, "bystander", "ticking"), "the bystander's code to start")
    [kernel] = named(server.descendants(), VICTIM_NAME)
    outer = named(kernel.parents(), "bwrap")[-1]  # the sandbox, from its outermost bwrap
    tree = [outer, *outer.children(recursive=True)]

    kernel.kill()
    killed = time.monotonic()
    answer = victim.result(timeout=WAIT_S)
    answered_s = time.monotonic() - killed
    calm = bystander.result(timeout=WAIT_S)

    assert answer.status == 200, answer
    died = answer.body
    assert died["status"] == "died"
    assert "kernel died" in died["message"]
    assert died["stdout"].startswith("victim 0\n")  # what it printed is kept
    assert calm["status"] == "ok" and not calm["kernel_restarted"]
    assert calm["stdout"] == ticks("tick", count)
    assert calm["results"] == [{"text/plain": "'done'"}]
    wait_until(lambda: not any(alive(p) for p in tree), "the killed kernel's sandbox to end")

    after = execute(server, "victim", "print(open('/workspace/keep.txt').read(), 'x' in dir())")
    assert after["status"] == "ok"
    assert after["stdout"] == "kept False\n"  # the files stay, the variables are gone
    assert after["kernel_restarted"]
    statuses = [e["status"] for e in audit(server, kind="execution", session="victim")]
    assert statuses == ["ok", "died", "ok"]  # newest first
    print(
        f"\nkernel SIGKILL: died result {answered_s:.2f} s after the kill; "
        f"{len(tree)} processes of its sandbox gone; bystander printed {count}/{count} ticks"
    )


# -- the state database locked by another program ------------------------------------------


def test_state_db_locked_for_seconds_makes_calls_wait_then_all_succeed(
    server: Served, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    create(server, "steady")
    create(server, "writer")
    count = 50
    steady = pool.submit(execute, server, "steady", ticking("step", count, marker="on"))
    wait_until(lambda: read_file(server, "steady", "on"), "the long execution to start")
    with locked_database(server.state_dir / "corral.db"):
        locked = time.monotonic()
        calls = {
            "execute": pool.submit(execute, server, "writer", "print(6 * 7)"),
            "create": pool.submit(call, server, "POST", "/v1/sessions", json={"id": "born-locked"}),
            "upload": pool.submit(put_file, server, "writer", "during.txt", b"written"),
            "list": pool.submit(call, server, "GET", "/v1/sessions"),
        }
        time.sleep(3)
        # A new session must be stored, so its creation is still waiting for the lock.
        assert not calls["create"].done()
    released = time.monotonic()
    answers = {name: future.result(timeout=WAIT_S) for name, future in calls.items()}
    waited_s = time.monotonic() - released

    assert answers["execute"]["status"] == "ok" and answers["execute"]["stdout"] == "42\n"
    assert answers["create"].status == 201, answers["create"]
    assert answers["upload"].status == 201, answers["upload"]
    assert answers["list"].status == 200, answers["list"]
    result = steady.result(timeout=WAIT_S)
    assert result["status"] == "ok" and result["stdout"] == ticks("step", count)
    assert read_file(server, "writer", "during.txt") == b"written"
    assert sessions(server)["born-locked"]["state"] == "idle"
    assert execute(server, "born-locked", "1 + 1")["results"] == [{"text/plain": "2"}]
    assert [e["status"] for e in audit(server, kind="execution", session="writer")] == ["ok"]
    assert [e["action"] for e in audit(server, kind="session", session="born-locked")] == [
        "created"
    ]
    print(
        f"\nstate db locked {released - locked:.1f} s: calls done {waited_s:.2f} s after the "
        f"release; 0 failed; long execution printed {count}/{count} lines"
    )


def test_state_db_locked_past_the_busy_timeout_answers_503_and_keeps_no_half_session(
    server: Served,
) -> None:
    with locked_database(server.state_dir / "corral.db"):
        refused = call(server, "POST", "/v1/sessions", json={"id": "born-blocked"})
    print(f"\nstate db locked past the busy timeout: create answered {refused.status}")
    assert refused.status == 503, refused
    assert "locked" in (refused.json_message or "")
    retried = call(server, "POST", "/v1/sessions", json={"id": "born-blocked"})
    assert retried.status == 201, retried


# -- the state disk full -------------------------------------------------------------------

DISK_MIB = 64


@dataclass
class SmallDisk:
    root: Path
    server: Served

    @contextlib.contextmanager
    def filled(self) -> Iterator[None]:
        """Fill the disk to the last byte; free it on exit."""
        filler = self.root / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for chunk in (1 << 20, 1 << 12, 1):
                with contextlib.suppress(OSError):
                    for _ in range(DISK_MIB << 20):  # bounded: never more than the disk
                        os.write(fd, b"\0" * chunk)
            room = os.statvfs(self.root)
            assert room.f_bavail * room.f_frsize < 1 << 20
            yield
        finally:
            os.close(fd)
            filler.unlink()


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallDisk]:
    """A server whose state directory (database, workspaces) is on a 64 MiB tmpfs."""
    root = tmp_path_factory.mktemp("disk")
    disk = root / "disk"
    disk.mkdir()
    with (
        mounted_tmpfs(disk, f"size={DISK_MIB}m,mode=0700"),
        served(root, state_dir=disk / "state") as running,
    ):
        yield SmallDisk(disk, running)


def test_full_state_disk_keeps_results_and_refuses_writes_with_a_clear_error(
    small_disk: SmallDisk,
) -> None:
    server = small_disk.server
    create(server, "roomy")
    execute(server, "roomy", "x = 1")
    assert put_file(server, "roomy", "keep.txt", b"kept").status == 201
    with small_disk.filled():
        sum_result = execute(server, "roomy", "print(x + 1)")
        write_result = execute(server, "roomy", "open('/workspace/big', 'wb').write(b'x' * 10**6)")
        upload = put_file(server, "roomy", "new.txt", b"y" * 100_000)
        health = call(server, "GET", "/health")

    assert sum_result["status"] == "ok" and sum_result["stdout"] == "2\n"
    assert write_result["status"] == "error" and write_result["limit"] == "disk"
    assert "No space left" in write_result["error"]["evalue"]
    assert write_result["message"]
    assert upload.status == 507, upload
    assert "no space" in (upload.json_message or "")
    assert health.status == 200, health
    # Space again: everything works, and nothing recorded while full was lost.
    assert put_file(server, "roomy", "new.txt", b"y" * 100_000).status == 201
    after = execute(server, "roomy", "print(open('/workspace/keep.txt').read(), x)")
    assert after["stdout"] == "kept 1\n"
    create(server, "spacious")
    statuses = [e["status"] for e in audit(server, kind="execution", session="roomy")]
    assert statuses == ["ok", "error", "ok", "ok"]  # newest first
    print(
        f"\nstate disk full ({DISK_MIB} MiB tmpfs): upload answered {upload.status}; "
        f"{len(statuses)}/4 executions audited"
    )


def test_full_state_disk_answers_new_sessions_with_503_and_running_ones_keep_working(
    small_disk: SmallDisk,
) -> None:
    server = small_disk.server
    create(server, "cramped")
    with small_disk.filled():
        refused = call(server, "POST", "/v1/sessions", json={"id": "crowded"})
        shell = call(
            server,
            "POST",
            "/v1/sessions/cramped/execute",
            json={"code": "echo hi", "language": "bash"},
        )
    print(f"\nstate disk full: create answered {refused.status}, a new bash kernel {shell.status}")
    assert refused.status == 503 and "full" in (refused.json_message or ""), refused
    assert shell.status == 200 and shell.body["stdout"] == "hi\n", shell
    assert call(server, "POST", "/v1/sessions", json={"id": "crowded"}).status == 201


# -- the server SIGTERMed during executions -------------------------------------------------


@dataclass
class Shutdown:
    """What one SIGTERM during executions did, for the tests below to judge."""

    server: Served
    exit_s: float
    running: dict[str, Answer]  # session -> the answer of its long execution
    queued: Answer  # a call queued behind s1's long execution
    left: list[psutil.Process]
    sandboxes_before: int


LONG_TICKS = 600  # 60 s of printing: far longer than the server may take to stop


@pytest.fixture(scope="module")
def shutdown(
    tmp_path_factory: pytest.TempPathFactory, pool: concurrent.futures.ThreadPoolExecutor
) -> Iterator[Shutdown]:
    """A server SIGTERMed while two sessions run code and a third call waits in a queue,
    then started again on the same state."""
    with served(tmp_path_factory.mktemp("sigterm")) as server:
        for sid in ("s1", "s2"):
            create(server, sid)
            assert put_file(server, sid, "keep.txt", f"kept by {sid}".encode()).status == 201
            execute(server, sid, f"open('/workspace/made.txt', 'w').write('made in {sid}')")
        running = {
            sid: pool.submit(
                call,
                server,
                "POST",
                f"/v1/sessions/{sid}/execute",
                json={"code": ticking(sid, LONG_TICKS, marker="started")},
            )
            for sid in ("s1", "s2")
        }
        for sid in running:
            wait_until(lambda sid=sid: read_file(server, sid, "started"), f"{sid}'s code to start")
        queued = pool.submit(
            call,
            server,
            "POST",
            "/v1/sessions/s1/execute",
            json={"code": "open('/workspace/queued.txt', 'w').write('ran')"},
        )
        wait_until(lambda: sessions(server)["s1"]["state"] == "busy", "s1 to be busy")
        time.sleep(0.5)  # the queued call reaches the server and waits for s1
        before = server.descendants()
        exit_s = server.terminate(timeout_s=60)
        answers = {sid: future.result(timeout=WAIT_S) for sid, future in running.items()}
        waiting = queued.result(timeout=WAIT_S)
        # Stopped before the server exited; what the kill reaches may take a moment to go.
        _, going = psutil.wait_procs(before, timeout=15)
        left = [p for p in going if alive(p)] + server.sandboxes()
        server.start()
        yield Shutdown(server, exit_s, answers, waiting, left, len(before))


def test_sigterm_during_executions_stops_every_sandbox_and_sessions_resume_after_restart(
    shutdown: Shutdown,
) -> None:
    server = shutdown.server
    print(
        f"\nSIGTERM with 2 executions running and 1 queued: exited in {shutdown.exit_s:.1f} s; "
        f"{shutdown.sandboxes_before} sandbox processes before, {len(shutdown.left)} left; "
        f"answers: {[a.status or a.error for a in shutdown.running.values()]}, "
        f"queued: {shutdown.queued.status or shutdown.queued.error}"
    )
    assert shutdown.sandboxes_before > 0
    assert shutdown.left == []
    listed = sessions(server)
    assert {listed[sid]["state"] for sid in ("s1", "s2")} == {"stopped"}
    for sid in ("s1", "s2"):
        assert read_file(server, sid, "keep.txt") == f"kept by {sid}".encode()
        result = execute(server, sid, "print(open('/workspace/made.txt').read())")
        assert result["status"] == "ok" and result["stdout"] == f"made in {sid}\n"
        assert sessions(server)[sid]["state"] == "idle"
    # The queued code was never sent, so it never ran, before the stop or after the restart.
    assert read_file(server, "s1", "queued.txt") is None


def test_sigterm_answers_running_and_queued_calls_clearly(shutdown: Shutdown) -> None:
    for answer in [*shutdown.running.values(), shutdown.queued]:
        if answer.error is not None:
            continue  # the connection closed: a clear transport error for the client
        assert answer.status != 500, answer
        result_or_error = isinstance(answer.body, dict) and (
            "status" in answer.body or answer.json_message
        )
        assert result_or_error, answer


def test_sigterm_keeps_the_audit_entry_of_code_that_was_running(shutdown: Shutdown) -> None:
    for sid in ("s1", "s2"):
        codes = [e["code"] for e in audit(shutdown.server, kind="execution", session=sid)]
        assert any(code and "started" in code for code in codes), codes


# -- the egress proxy restarted ------------------------------------------------------------

HELLO = "hello through a restarted proxy\n"
SLOW_LINES = 200  # 20 s of a slow download at most


class _Site(http.server.BaseHTTPRequestHandler):
    """/hello.txt at once, /slow one line every 0.1 s; `slow_started` is set on /slow."""

    slow_started = threading.Event()

    def do_GET(self) -> None:
        slow = self.path == "/slow"
        body = HELLO.encode() if not slow else b"line\n" * SLOW_LINES
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not slow:
            self.wfile.write(body)
            return
        self.slow_started.set()
        with contextlib.suppress(OSError):
            for _ in range(SLOW_LINES):
                self.wfile.write(b"line\n")
                self.wfile.flush()
                time.sleep(0.1)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test checks what the sandbox got."""


@pytest.fixture(scope="module")
def site() -> Iterator[int]:
    with serve(_Site) as port:
        yield port


def curl(url: str) -> str:
    return f"curl -sS --max-time 40 -o /dev/null -w 'HTTP %{{http_code}}\\n' '{url}'; echo rc=$?"


def fetch_py(url: str) -> str:
    fetch = f"urllib.request.urlopen({url!r}, timeout=20)"
    return f"import urllib.request\nprint({fetch}.read().decode(), end='')"


async def fetched(service: Service, port: int) -> tuple[ExecutionResult, ExecutionResult]:
    """/hello.txt fetched by the python kernel (urllib) and the bash kernel (curl)."""
    url = f"http://{HOST}:{port}/hello.txt"
    py = await service.executions.run(fetch_py(url), session_id="net", timeout_s=60)
    sh = await service.executions.run(
        f"curl -sS --max-time 20 '{url}'", session_id="net", language="bash", timeout_s=60
    )
    return py, sh


def kernel_pids(service: Service) -> dict[str, int | None]:
    return {lang: k.pid for lang, k in service.sessions.session("net").kernels.items()}


async def test_egress_proxy_restart_cuts_open_connections_and_running_sandboxes_get_out_again(
    service: Service, site: int
) -> None:
    await service.create_session("net")
    await service.network.set("net", "allowlist", [f"{HOST}:{site}"])
    py, sh = await fetched(service, site)
    assert (py.stdout, sh.stdout) == (HELLO, HELLO), (py.text(), sh.text())
    pids = kernel_pids(service)
    _Site.slow_started.clear()
    slow = asyncio.create_task(
        service.executions.run(
            curl(f"http://{HOST}:{site}/slow"), session_id="net", language="bash"
        )
    )
    assert await asyncio.to_thread(_Site.slow_started.wait, WAIT_S)
    await asyncio.sleep(0.3)  # a few lines are through the tunnel

    cut = await service.egress.proxy.restart()
    restarted = time.monotonic()
    cut_off = await asyncio.wait_for(slow, WAIT_S)
    answered_s = time.monotonic() - restarted

    assert cut == 1
    code = re.search(r"^rc=(\d+)$", cut_off.stdout, re.M)
    assert code is not None and int(code.group(1)) != 0, cut_off.text()
    assert "curl: (" in cut_off.stderr + cut_off.stdout  # curl says why the transfer ended
    py, sh = await fetched(service, site)
    assert (py.stdout, sh.stdout) == (HELLO, HELLO), (py.text(), sh.text())
    assert kernel_pids(service) == pids  # the same sandboxes: nothing was restarted
    print(
        f"\negress proxy restart: {cut} tunnel cut, its curl ended {answered_s:.2f} s later "
        f"(rc {code.group(1)}); both kernels fetched again without a restart"
    )


async def test_egress_socket_removed_from_the_run_root_is_listened_on_again(
    service: Service, site: int
) -> None:
    await service.create_session("net")
    await service.network.set("net", "allowlist", [f"{HOST}:{site}"])
    socket_path = await service.egress.socket_for("net")
    socket_path.unlink()  # a clean-up of the run root, say
    # The bash kernel's start asks for the socket again, and the proxy listens anew; the
    # python kernel, running all along, finds the new socket too.
    url = f"http://{HOST}:{site}/hello.txt"
    sh = await service.executions.run(
        f"curl -sS --max-time 20 '{url}'", session_id="net", language="bash"
    )
    py = await service.executions.run(fetch_py(url), session_id="net")
    assert (py.stdout, sh.stdout) == (HELLO, HELLO), (py.text(), sh.text())
    assert socket_path.is_socket()
