"""No sandbox outlives its server: a gate whose server died never execs bwrap, and the
next server of a state kills what a dead one left (and nothing else).

Real processes only: a helper process plays the server and is killed at the moment under
test; waits are bounded by deadlines on observable states (a pid printed, a process gone).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from corral.sandbox.leftovers import sweep_leftovers

pytestmark = pytest.mark.timeout(120)

WAIT_S = 20.0
SLEEPER = "import time; time.sleep(120)"
# Plays a server: starts a gated sandbox whose box stops the gate (SIGSTOP) once admitted,
# lets it through ("go" written), prints the gate's pid and dies at once. The gate is then
# stopped with "go" waiting in its pipe: continued, it would exec bwrap with no server.
DYING_SERVER = """
import asyncio, os, signal, sys
from pathlib import Path
from corral.sandbox.host import SandboxHost
from corral.sandbox.boxes import RlimitBox
from corral.sandbox.launch import start_sandbox
from corral.sandbox.profile import SessionPaths
from corral.sandbox.runtime import create_session_env
from tests.conftest import make_settings

class StoppingBox(RlimitBox):
    def admit(self, pid):
        super().admit(pid)
        os.kill(pid, signal.SIGSTOP)

root = Path(sys.argv[1])
host = SandboxHost(make_settings(root / "state", Path(sys.argv[2])))
asyncio.run(host.prepare())
paths = SessionPaths(workspace=root / "workspace", env=root / "env")
paths.workspace.mkdir()
create_session_env(paths.env, host.runtime)
policy = host.policy(paths, tmp_size_bytes=16 << 20)
box = StoppingBox("dying", host.settings.limits)
process = start_sandbox(policy, ["sleep", "120"], bwrap=host.bwrap, box=box)
print(process.pid, flush=True)
os._exit(0)
"""


def wait_for(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def naming(path: Path) -> list[int]:
    """Live processes whose command line names a path under `path`."""
    mark = f"{path}/"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(arg.startswith(mark) for arg in proc.info["cmdline"] or ()) and alive(proc.pid):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Pids a test leaves running; killed afterwards whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def orphan(argv: list[str], started: list[int]) -> int:
    """Start `argv` as an orphan (its parent exits at once: init or a subreaper adopts it)."""
    out = subprocess.run(
        ["/bin/sh", "-c", '"$@" >/dev/null 2>&1 & echo $!', "sh", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout)
    started.append(pid)
    assert wait_for(lambda: psutil.Process(pid).ppid() != os.getpid())
    return pid


@pytest.mark.bwrap
def test_a_gate_whose_server_died_never_execs_bwrap(
    tmp_path: Path, run_root: Path, started: list[int]
) -> None:
    helper = subprocess.run(
        [sys.executable, "-c", DYING_SERVER, str(tmp_path), str(run_root)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
        check=False,
    )
    assert helper.returncode == 0, helper.stderr
    gate = int(helper.stdout)
    started.append(gate)
    if alive(gate):
        os.kill(gate, signal.SIGCONT)  # what is left of it may run now
    assert wait_for(lambda: not alive(gate)), psutil.Process(gate).cmdline()
    assert naming(tmp_path) == []


def test_a_dead_servers_sandbox_is_killed_at_the_next_start(
    tmp_path: Path, run_root: Path, started: list[int]
) -> None:
    state = tmp_path / "state"
    root = orphan([sys.executable, "-c", f"{SLEEPER}", f"{state}/sessions/s1/workspace"], started)
    kernel_like = orphan([sys.executable, "-c", SLEEPER, f"{run_root}/0a1b2c/host"], started)
    assert sorted(sweep_leftovers(state, run_root)) == sorted([root, kernel_like])
    assert wait_for(lambda: not alive(root) and not alive(kernel_like))


def test_a_leftover_is_killed_with_its_whole_tree(
    tmp_path: Path, run_root: Path, started: list[int]
) -> None:
    state = tmp_path / "state"
    spawner = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); time.sleep(120)"
    )
    root = orphan([sys.executable, "-c", spawner, f"{state}/sessions/s1/workspace"], started)
    assert wait_for(lambda: len(psutil.Process(root).children()) == 1)
    child = psutil.Process(root).children()[0].pid
    started.append(child)
    assert sweep_leftovers(state, run_root) == [root]
    assert wait_for(lambda: not alive(root) and not alive(child))


def test_sandboxes_of_a_live_server_and_of_other_states_are_left_alone(
    tmp_path: Path, run_root: Path, started: list[int]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "corral.db").touch()
    # A live server of this state: it holds a file of the state open, its child names it.
    server = (
        "import subprocess, sys, time\n"
        f"db = open({str(state / 'corral.db')!r})\n"
        f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}, {str(state)!r} + '/sessions/x'])\n"
        "time.sleep(120)\n"
    )
    live = subprocess.Popen([sys.executable, "-c", server])
    started.append(live.pid)
    assert wait_for(lambda: len(psutil.Process(live.pid).children()) == 1)
    started.append(psutil.Process(live.pid).children()[0].pid)
    # This process's own sandbox-like child, and an orphan of another state.
    own = subprocess.Popen([sys.executable, "-c", SLEEPER, f"{state}/sessions/y"])
    started.append(own.pid)
    other = orphan([sys.executable, "-c", SLEEPER, f"{tmp_path}/other/sessions/z"], started)
    before = set(naming(state)) | {other}
    assert sweep_leftovers(state, run_root) == []
    assert all(alive(pid) for pid in before)
    own.kill()
    own.wait()
    live.kill()
    live.wait()


# Plays a server with a janitor: starts a sandbox-like child naming the state, then dies
# (SIGKILL of itself) without saying goodbye; the child has no death signal of its own.
SERVER_WITH_JANITOR = """
import os, signal, subprocess, sys
from pathlib import Path
from corral.sandbox.leftovers import Janitor
state, run_root = Path(sys.argv[1]), Path(sys.argv[2])
janitor = Janitor(state, run_root)
child = subprocess.Popen(
    [sys.executable, '-c', sys.argv[3], f'{state}/sessions/s/workspace'],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
print(child.pid, janitor.process.pid, flush=True)
if sys.argv[4] == 'close':
    janitor.close()
    print('closed', flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_janitor_sweeps_after_a_server_that_died(
    tmp_path: Path, run_root: Path, started: list[int]
) -> None:
    state = tmp_path / "state"
    helper = subprocess.run(
        [sys.executable, "-c", SERVER_WITH_JANITOR, str(state), str(run_root), SLEEPER, "die"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    child, janitor = (int(word) for word in helper.stdout.split())
    started += [child, janitor]
    assert wait_for(lambda: not alive(child)), "the orphan outlived its server"
    assert wait_for(lambda: not alive(janitor))


def test_a_janitor_told_goodbye_leaves_without_sweeping(
    tmp_path: Path, run_root: Path, started: list[int]
) -> None:
    state = tmp_path / "state"
    helper = subprocess.run(
        [sys.executable, "-c", SERVER_WITH_JANITOR, str(state), str(run_root), SLEEPER, "close"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    child, janitor = (int(word) for word in helper.stdout.split()[:2])
    started.append(child)
    assert "closed" in helper.stdout
    assert not alive(janitor)  # close() waited for it
    assert alive(child)
