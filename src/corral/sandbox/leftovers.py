"""Sandboxes a dead server left behind, found and killed when the next one starts.

Every sandbox dies with its server (the launcher's parent-death signal and bwrap's
`--die-with-parent`), but a server killed in the instant between a fork and the child's
`prctl` can still leave one running, re-parented to init or a subreaper. Such a sandbox is
recognised by what only this server's sandboxes have, and only that is killed:

- it belongs to this user;
- its command line binds a path under this server's state directory or run root (a
  session's workspace, a pool slot, a browser fetch's folder, a kernel's run directory);
- it is the root of its tree (its parent names neither), so each sandbox is judged once;
- its parent is not this process and holds no file of the state directory open: a live
  server of this state (or a one-off command on it) keeps its database open, while the
  init or subreaper that adopted an orphan does not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import psutil

from corral.sandbox.watchdog import kill_tree

log = logging.getLogger(__name__)


def sweep_leftovers(state_dir: Path, run_root: Path) -> list[int]:
    """Kill the sandbox trees a dead server of `state_dir` left; returns their roots."""
    marks = tuple(f"{path.absolute()}/" for path in (state_dir, run_root))
    state = marks[0]
    uid = os.getuid()
    names: dict[int, tuple[int, bool]] = {}  # pid: (parent, names our folders)
    for proc in psutil.process_iter(["ppid", "cmdline", "uids"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if proc.info["uids"].real != uid:
                continue
            cmdline = proc.info["cmdline"] or []
            names[proc.pid] = (proc.info["ppid"], _names(cmdline, marks))
    killed: list[int] = []
    for pid, (parent, ours) in names.items():
        if not ours or names.get(parent, (0, False))[1] or os.getpid() in (pid, parent):
            continue
        if _holds_open(parent, state):
            continue
        log.warning("killing sandbox %d, left by a server of %s that died", pid, state_dir)
        kill_tree(pid)
        killed.append(pid)
    return killed


def _names(cmdline: list[str], marks: tuple[str, ...]) -> bool:
    return any(arg.startswith(marks) for arg in cmdline)


def _holds_open(pid: int, prefix: str) -> bool:
    """Whether process `pid` has a file under `prefix` open. A process of another user
    (init, say) cannot be a server of this user's state; any other doubt counts as yes."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, PermissionError):
        return False  # gone, or another user's (init): not a server of this state
    except OSError:
        return True
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
    return False


# The janitor's whole program: wait for the server's end, then sweep a few times (a
# sandbox being set up when the server died is orphaned a moment later, by bwrap).
JANITOR_EXIT_S = 5.0  # how long a janitor told goodbye may take to leave

_JANITOR = """
import os, sys, time
from pathlib import Path
if sys.stdin.buffer.read() != b"closed":
    from corral.sandbox.leftovers import sweep_leftovers
    state = Path(os.environ["CORRAL_JANITOR_STATE"])
    for _ in range(4):
        sweep_leftovers(state, Path(os.environ["CORRAL_JANITOR_RUN"]))
        time.sleep(0.25)
"""


class Janitor:
    """A small process that outlives its server by a moment and sweeps after it.

    bwrap arms its own death signal in the sandbox it clones a moment after the clone, so a
    server killed in that moment leaves the inner bwrap (and what it started) orphaned. The
    janitor holds the read end of a pipe only the server holds open; end of file without
    the server's goodbye means the server died, and it sweeps (`sweep_leftovers`). Its
    command line names none of the server's folders (they travel in its environment), so
    no sweep mistakes it for a sandbox.
    """

    def __init__(self, state_dir: Path, run_root: Path) -> None:
        read, self._write = os.pipe()
        env = dict(os.environ)
        env.update(CORRAL_JANITOR_STATE=str(state_dir), CORRAL_JANITOR_RUN=str(run_root))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _JANITOR],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd="/",
                start_new_session=True,  # a signal to the server's group spares it
            )
        finally:
            os.close(read)

    def close(self) -> None:
        """The server ends cleanly: the janitor leaves without sweeping."""
        with contextlib.suppress(OSError):
            os.write(self._write, b"closed")
        with contextlib.suppress(OSError):
            os.close(self._write)
        try:
            self.process.wait(timeout=JANITOR_EXIT_S)
        except subprocess.TimeoutExpired:  # not even started yet on a very busy host
            self.process.kill()
            self.process.wait()
