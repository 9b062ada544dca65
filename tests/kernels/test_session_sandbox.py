"""One sandbox per session: its kernels share it, and its spawner trusts nothing it is sent.

The python and bash kernels of a session run in one bwrap sandbox (one set of namespaces,
one /tmp, one view of the mounts), started by the spawner bwrap runs; the server checks the
pid the spawner names and holds a pidfd to each kernel.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from corral.kernels.sandbox import SessionSandbox, SpawnedProcess
from corral.kernels.session import Session
from corral.sandbox import scripts
from corral.sandbox.scripts import SPAWNER
from corral.service import Service
from tests.waiting import until

EXEC_S = 60


async def run(service: Service, sid: str, code: str, language: str = "python") -> str:
    result = await service.executions.run(code, session_id=sid, language=language, timeout_s=EXEC_S)
    assert result.status == "ok", result.text()
    return result.stdout


def sandbox_of(service: Service, sid: str) -> SessionSandbox:
    session: Session = service.sessions.session(sid)
    assert session.run is not None and session.run.sandbox is not None
    return session.run.sandbox


def tree(root: int) -> set[int]:
    return {root, *(p.pid for p in psutil.Process(root).children(recursive=True))}


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


async def test_both_kernels_share_one_sandbox_its_tmp_and_its_processes(service: Service) -> None:
    await service.create_session("both")
    await run(service, "both", "open('/tmp/note', 'w').write('from python')")
    assert await run(service, "both", "cat /tmp/note", language="bash") == "from python\n"
    await run(service, "both", "sleep 321 &", language="bash")
    seen = await run(
        service,
        "both",
        "import os\n"
        "print(any(open(f'/proc/{p}/cmdline').read().split(chr(0))[:2] == ['sleep', '321']"
        " for p in os.listdir('/proc') if p.isdigit()))",
    )
    assert seen == "True\n"
    sandbox = sandbox_of(service, "both")
    assert sandbox.pid is not None
    kernels = service.sessions.session("both").kernels
    assert sorted(kernels) == ["bash", "python"]
    assert {k.pid for k in kernels.values()} <= tree(sandbox.pid)
    bwraps = [p for p in tree(sandbox.pid) if psutil.Process(p).name() == "bwrap"]
    assert len(bwraps) == 2  # the outer bwrap and its init inside: one sandbox, not two


def role(pid: int) -> str:
    """What a sandbox process is, by its command line."""
    command = psutil.Process(pid).cmdline()
    if Path(command[0]).name == "bwrap":
        return "bwrap"
    if scripts.run_path("spawner.py") in command:
        return "spawner"
    if scripts.run_path("python_kernel.py") in command:
        return "python kernel"
    return " ".join(command)


async def test_the_spawner_relays_egress_itself_so_a_sandbox_holds_no_other_process(
    service: Service,
) -> None:
    """The forwarder's ports answer the first kernel, and no process of the sandbox is there
    for them: the relay runs in the spawner's loop (a process of its own held 4.5 MiB)."""
    await service.create_session("lean")
    reached = await run(
        service,
        "lean",
        "import socket\n"
        "for port in (3128, 1080):\n"
        "    socket.create_connection(('127.0.0.1', port), 5).close()\n"
        "print('both')",
    )
    assert reached == "both\n"
    sandbox = sandbox_of(service, "lean")
    assert sandbox.pid is not None
    roles = sorted(role(pid) for pid in tree(sandbox.pid))
    assert roles == ["bwrap", "bwrap", "python kernel", "spawner"]


async def test_the_spawner_finds_the_forwarder_compiled_and_fresh(service: Service) -> None:
    """Python uses a module's compiled form when its header names the source's size and
    time; the host's is shown where Python looks, so no sandbox compiles the forwarder."""
    await service.create_session("compiled")
    check = (
        "import importlib.util, os, struct\n"
        f"source = {scripts.shown_at('forwarder.py')!r}\n"
        "header = open(importlib.util.cache_from_source(source), 'rb').read(16)\n"
        "st = os.stat(source)\n"
        "print(header[:4] == importlib.util.MAGIC_NUMBER,\n"
        "      struct.unpack('<III', header[4:]) == (0, int(st.st_mtime), st.st_size))"
    )
    assert await run(service, "compiled", check) == "True True\n"


async def test_a_kernel_dropped_takes_what_it_started_and_leaves_its_sibling(
    service: Service,
) -> None:
    await service.create_session("drop")
    await run(service, "drop", "n = 41")
    await run(service, "drop", "sleep 654 &", language="bash")
    session = service.sessions.session("drop")
    sandbox = sandbox_of(service, "drop")
    assert sandbox.pid is not None
    sleeps = [p for p in tree(sandbox.pid) if psutil.Process(p).cmdline()[:2] == ["sleep", "654"]]
    assert len(sleeps) == 1
    await service.sessions.factory.drop_kernel(session, "bash")
    await until(lambda: not alive(sleeps[0]), "not alive(sleeps[0])", 10)
    assert sandbox_of(service, "drop") is sandbox and sandbox.alive()
    assert await run(service, "drop", "print(n + 1)") == "42\n"
    assert await run(service, "drop", "echo back", language="bash") == "back\n"
    assert sandbox_of(service, "drop") is sandbox


async def test_killing_the_spawner_from_inside_ends_the_sandbox_and_the_next_call_says_so(
    service: Service,
) -> None:
    await service.create_session("spawner")
    await run(service, "spawner", "n = 1")
    first = sandbox_of(service, "spawner")
    result = await service.executions.run("kill -9 2", session_id="spawner", language="bash")
    assert result.status in ("died", "ok", "error")
    await until(lambda: not first.alive(), "not first.alive()", 10)
    after = await service.executions.run("print('fresh')", session_id="spawner", timeout_s=EXEC_S)
    assert after.status == "ok" and after.stdout == "fresh\n"
    assert after.kernel_restarted
    second = sandbox_of(service, "spawner")
    assert second is not first
    # Killed from outside while both kernels are registered: the first call after it (bash)
    # finds the sandbox gone, so the python kernel is said to be restarted at its next call.
    await run(service, "spawner", "true", language="bash")
    spawner = [
        p
        for p in tree(second.pid or 0)
        if psutil.Process(p).cmdline()[1:2] == [scripts.run_path("spawner.py")]
    ]
    assert len(spawner) == 1
    os.kill(spawner[0], signal.SIGKILL)
    await until(lambda: not second.alive(), "not second.alive()", 10)
    assert await run(service, "spawner", "echo again", language="bash") == "again\n"
    again = await service.executions.run(
        "print('n' in dir())", session_id="spawner", timeout_s=EXEC_S
    )
    assert again.stdout == "False\n" and again.kernel_restarted


async def test_stopping_a_session_ends_its_sandbox_and_all_in_it_with_no_second_signal(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's stop ends the sandbox first (every process in it at once), then its
    kernels; the sandbox's stop does nothing more when asked again (its process group's
    number may belong to someone else by then)."""
    await service.create_session("ends")
    await run(service, "ends", "sleep 765 &", language="bash")
    session = service.sessions.session("ends")
    sandbox = sandbox_of(service, "ends")
    bwrap = sandbox.pid
    assert bwrap is not None
    inside = tree(bwrap)
    kernels = [kernel.pid for kernel in session.kernels.values()]
    assert all(pid in inside for pid in kernels)
    groups: list[int] = []
    real_killpg = os.killpg
    monkeypatch.setattr(
        os, "killpg", lambda pgid, sig: (groups.append(pgid), real_killpg(pgid, sig))
    )
    await service.sessions.stop("ends")
    assert groups == [bwrap]
    await until(lambda: not any(alive(pid) for pid in inside), "nothing of the sandbox alive", 10)
    assert not session.kernels and session.run is None
    assert not sandbox.alive() and sandbox.pid is None
    await sandbox.stop()
    assert groups == [bwrap]


async def test_a_killed_kernel_is_seen_to_end_without_waiting_for_a_poll(
    service: Service,
) -> None:
    """`SpawnedProcess.ended` returns once the kernel is gone (its pidfd wakes it)."""
    await service.create_session("gone")
    await run(service, "gone", "n = 1")
    kernel = service.sessions.session("gone").kernels["python"]
    spawned = kernel.manager.provisioner.process  # type: ignore[union-attr]
    assert isinstance(spawned, SpawnedProcess) and spawned.poll() is None
    spawned.kill()
    await asyncio.wait_for(spawned.ended(), 10)
    assert spawned.poll() == -signal.SIGKILL and not alive(spawned.pid)
    await spawned.ended()  # ended already: returns at once


# -- the spawner on its own, as a process ------------------------------------------------


@pytest.fixture
def spawner() -> Iterator[tuple[socket.socket, subprocess.Popen[bytes]]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = subprocess.Popen(
        [sys.executable, str(SPAWNER), str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        start_new_session=True,
    )
    theirs.close()
    ours.settimeout(10)
    try:
        yield ours, process
    finally:
        ours.close()
        process.kill()
        process.wait()


def ask(control: socket.socket, message: bytes, fds: list[int]) -> list[str]:
    """Send `message` with `fds`; the answer's number, kind and detail."""
    socket.send_fds(control, [message], fds)
    number, kind, detail = control.recv(4096).decode().split(" ", 2)
    return [number, kind, detail]


def request(number: int, *argv: str) -> bytes:
    return "\0".join([str(number), *argv]).encode()


def test_the_spawner_refuses_what_is_not_a_spawn_request(
    spawner: tuple[socket.socket, subprocess.Popen[bytes]],
) -> None:
    """The first request is too long: the spawner answers it without having read one."""
    control, _ = spawner
    read_end, write_end = os.pipe()
    try:
        too_long = ask(control, request(1, "x" * 70_000), [write_end])
        assert too_long[:2] == ["1", "error"] and "too long" in too_long[2]
        assert ask(control, b"", [write_end])[:2] == ["?", "error"]  # nothing at all
        assert ask(control, b"no number", [write_end])[:2] == ["?", "error"]
        assert ask(control, b"3", [write_end])[:2] == ["3", "error"]  # no command
        assert ask(control, request(4, "", "x"), [write_end])[:2] == ["4", "error"]
        assert ask(control, request(5, "true"), [])[:2] == ["5", "error"]  # no descriptor
        missing = ask(control, request(6, "/nonexistent/cmd"), [write_end])
        assert missing[:2] == ["6", "error"] and "/nonexistent/cmd" in missing[2]
        number, kind, pid = ask(control, request(7, "sleep", "30"), [write_end])
        assert (number, kind) == ("7", "pid") and pid.isdigit()  # the number echoed
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_spawner_ends_what_it_started_when_the_server_end_closes(
    spawner: tuple[socket.socket, subprocess.Popen[bytes]],
) -> None:
    control, process = spawner
    read_end, write_end = os.pipe()
    try:
        script = "import os, sys; os.write(2, b'up'); import time; time.sleep(60)"
        number, kind, detail = ask(control, request(1, sys.executable, "-c", script), [write_end])
        assert (number, kind) == ("1", "pid"), detail
        pid = int(detail)
        os.close(write_end)
        write_end = -1
        assert os.read(read_end, 2) == b"up"  # its stderr is the descriptor that was sent
        assert os.getpgid(pid) == pid  # a session of its own
        control.close()
        process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(pid)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_a_kernel_starts_with_the_signals_python_ignores_as_the_default(
    spawner: tuple[socket.socket, subprocess.Popen[bytes]],
) -> None:
    """The spawner is Python, which ignores SIGPIPE and SIGXFSZ; what it starts does not."""
    control, _ = spawner
    read_end, write_end = os.pipe()
    with os.fdopen(read_end) as stderr:
        try:
            script = "grep SigIgn /proc/self/status >&2"
            number, kind, detail = ask(control, request(1, "/bin/sh", "-c", script), [write_end])
            assert (number, kind) == ("1", "pid"), detail
        finally:
            os.close(write_end)
        ignored = int(stderr.read().split()[1], 16)  # read to the end: the shell exited
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (signum - 1)), signal.Signals(signum).name


def test_a_kernel_is_watched_whatever_its_descriptor_number() -> None:
    """Found by `make bench`'s fleet: a busy server's pidfds are numbered past 1024, where
    select() refuses them."""
    import resource

    from corral.kernels.sandbox import SpawnedProcess

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1100:
        pytest.skip("this process may not open 1100 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        watched = SpawnedProcess(child.pid)
        assert watched._pidfd is not None
        high = os.dup2(watched._pidfd, 1050)
        os.close(watched._pidfd)
        watched._pidfd = high
        assert watched.poll() is None
        child.kill()
        child.wait()
        assert watched.poll() is not None
    finally:
        child.kill()
        child.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("args", [[], ["x"], ["3", "--egress"], ["3", "--relay", "/s"]])
def test_the_spawner_refuses_arguments_it_does_not_know(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(SPAWNER), *args], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1 and "usage: spawner.py FD [--egress SOCKET]" in done.stderr
