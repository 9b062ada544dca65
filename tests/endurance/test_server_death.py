"""A `corral serve` SIGKILLed while its warm pool fills leaves no sandbox behind.

The server is killed six times on the same state, each time at another moment of a pool
refill, chosen by what can be seen (a slot folder, a gate or bwrap, bwrap past its gate,
the kernel, a second slot), not by sleeping. After each kill, every process naming that
server's state directory or run root (bwrap, gates, kernels) must be gone
within a deadline (without the next start's sweep: each kill is judged before it).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.endurance.served import Served, alive, served

pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(600)]

MOMENT_TIMEOUT_S = 90.0
GONE_TIMEOUT_S = 15.0


def slots(server: Served) -> int:
    pool = server.state_dir / "sessions" / ".pool"
    try:
        return sum(1 for entry in pool.iterdir() if entry.name.startswith("@pool-"))
    except OSError:
        return 0


def counted(server: Served, matches: Callable[[list[str]], bool]) -> int:
    """How many of the server's sandbox processes have a command line that `matches`."""
    count = 0
    for proc in server.sandboxes():
        try:
            count += matches(proc.cmdline())
        except psutil.Error:
            continue
    return count


def running(server: Served, word: str) -> int:
    """How many of the server's sandbox processes have `word` in their command line."""
    return counted(server, lambda command: any(word in arg for arg in command))


def past_gate(server: Served) -> int:
    """How many of the server's sandboxes run bwrap (their gate let them through)."""
    return counted(server, lambda command: bool(command) and Path(command[0]).name == "bwrap")


MOMENTS: list[tuple[str, Callable[[Served], bool]]] = [
    ("a pool slot folder appeared", lambda s: slots(s) >= 1),
    ("a sandbox process (gate or bwrap) appeared", lambda s: bool(s.sandboxes())),
    ("a pool sandbox is past its gate", lambda s: past_gate(s) >= 1),
    ("a pool kernel runs", lambda s: running(s, "python_kernel") >= 1),
    ("a second slot folder appeared", lambda s: slots(s) >= 2),
    ("two pool kernels run", lambda s: running(s, "python_kernel") >= 2),
]


def start_without_waiting(server: Served) -> subprocess.Popen[bytes]:
    """`corral serve` started, not waited for: the pool fills while it starts up."""
    with server.log_path.open("a") as log:
        server.process = subprocess.Popen(
            [sys.executable, "-m", "corral", "serve", "--port", str(server.port)],
            env=server.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return server.process


def describe(proc: psutil.Process) -> str:
    try:
        parent = proc.ppid()
        return f"{proc.pid} (parent {parent}, {proc.status()}): {' '.join(proc.cmdline())[-300:]}"
    except psutil.Error:
        return f"{proc.pid} (gone)"


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def kill_at(server: Served, moment: str, reached: Callable[[Served], bool]) -> None:
    """Start the server, SIGKILL it once `reached` holds, and wait for it to be gone."""
    process = start_without_waiting(server)
    seen = wait_for(lambda: reached(server) or process.poll() is not None, MOMENT_TIMEOUT_S)
    assert seen and process.poll() is None, f"{moment}: not reached\n{server.log()}"
    process.kill()
    process.wait(30)


def test_a_server_killed_during_pool_refills_leaves_no_sandbox(tmp_path: Path) -> None:
    left: dict[str, list[str]] = {}
    with served(tmp_path, start=False, pool_size="2") as server:
        for moment, reached in MOMENTS:
            kill_at(server, moment, reached)
            wait_for(lambda: not server.sandboxes(), GONE_TIMEOUT_S)
            survivors = [p for p in server.sandboxes() if alive(p)]
            if survivors:
                left[moment] = [describe(p) for p in survivors]
                for proc in survivors:
                    proc.kill()  # so the next moment starts clean
    assert left == {}, left
