"""Starting a sandbox: the one place that spawns bwrap.

Every sandbox, a kernel's, a browser fetch's or a doctor probe's, starts the same way:

- the seccomp filter on an inherited descriptor whenever the policy asks for it (it is
  closed here once the child holds its copy);
- an empty host environment: what the sandbox sees is exactly the policy's variables, which
  bwrap sets after `--clearenv`;
- a new session, so the sandbox's process group can be killed as one;
- the parent-death signal (SIGKILL, set by `setpriv` before anything else runs, and kept
  across the exec of bwrap), and a check that the parent is still this server once that
  signal is armed: a server that dies at any moment of the spawn leaves no sandbox, not
  even a gate that would go on to exec bwrap;
- with a limit box, a gate (`GATE_ARGV`, a shell waiting for one line) in front of bwrap: the
  gate's pid is admitted into the box while it waits, and only then told to exec bwrap, so
  nothing of the sandbox ever runs outside its limits. A refused admission kills and reaps
  the gate (bwrap never ran) and raises `AdmissionFailed`.

It knows nothing of Jupyter or HTTP: callers pass the policy, the command and where its
output goes, and get a `subprocess.Popen`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import IO

from corral.errors import AdmissionFailed
from corral.sandbox.boxes import LimitBox
from corral.sandbox.bwrap import build_argv
from corral.sandbox.policy import SandboxPolicy
from corral.sandbox.seccomp import filter_fd

# `sh -c GATE corral-gate SERVER_PID ARGV...`: exec ARGV once the launcher writes "go",
# if the shell's parent is still the server (the death signal was armed before the shell
# started, so a parent that died earlier shows as another $PPID); exit on EOF.
GATE_SCRIPT = (
    'p=$1; shift; IFS= read -r go && [ "$go" = go ] && [ "$PPID" = "$p" ] && exec "$@"; exit 125'
)
GATE_ARGV = ("/bin/sh", "-c", GATE_SCRIPT, "corral-gate")
# The same without waiting, for a sandbox with no limit box.
PARENT_SCRIPT = 'p=$1; shift; [ "$PPID" = "$p" ] && exec "$@"; exit 125'
PARENT_ARGV = ("/bin/sh", "-c", PARENT_SCRIPT, "corral-parent")
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")

Output = int | IO[bytes] | None  # what subprocess accepts: DEVNULL, PIPE, a file


def start_sandbox(
    policy: SandboxPolicy,
    command: Sequence[str],
    *,
    bwrap: str,
    box: LimitBox | None = None,
    stdout: Output = subprocess.DEVNULL,
    stderr: Output = subprocess.DEVNULL,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Start `command` inside a sandbox made from `policy`; returns the running process.

    The process is the group leader of a new session (its pid is the group id). Its stdin is
    closed (or at end of file); `pass_fds` reach the command open, with their numbers. With
    `box`, it is inside the box before bwrap runs; raises `AdmissionFailed` when the box
    refuses it, and no process is left. It only forks and execs, so it may be called on the
    event loop.
    """
    seccomp_fd = filter_fd() if policy.seccomp else None
    try:
        argv = build_argv(policy, command, bwrap=bwrap, seccomp_fd=seccomp_fd)
        process = subprocess.Popen(
            _with_death_signal(argv, gated=box is not None),
            pass_fds=pass_fds if seccomp_fd is None else (*pass_fds, seccomp_fd),
            stdin=subprocess.DEVNULL if box is None else subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            env={},
            cwd="/",
            start_new_session=True,
        )
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    if box is not None:
        _admit(process, box)
    return process


def _with_death_signal(argv: list[str], *, gated: bool) -> list[str]:
    """`argv` behind the gate (when `gated`), with the parent-death signal armed first
    where `setpriv` exists (util-linux; without it, bwrap's own `--die-with-parent` and the
    sweep at the next start remain)."""
    if SETPRIV is None:
        return [*GATE_ARGV, str(os.getpid()), *argv] if gated else argv
    shell = GATE_ARGV if gated else PARENT_ARGV
    return [SETPRIV, "--pdeathsig", "KILL", "--", *shell, str(os.getpid()), *argv]


def _admit(process: subprocess.Popen[bytes], box: LimitBox) -> None:
    """Put the waiting gate under the box's limits, then let it exec bwrap."""
    stdin, process.stdin = process.stdin, None  # closed here: communicate() must not use it
    try:
        if stdin is None:
            raise AdmissionFailed("the sandbox gate has no stdin")
        try:
            box.admit(process.pid)
        except (OSError, ValueError) as exc:
            raise AdmissionFailed(f"cannot put the sandbox under its limits: {exc}") from exc
        try:
            stdin.write(b"go\n")
            stdin.flush()
        except BrokenPipeError as exc:
            raise AdmissionFailed("the sandbox gate exited before it was let through") from exc
    except AdmissionFailed:
        _end(process, box)
        raise
    finally:
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()


def _end(process: subprocess.Popen[bytes], box: LimitBox) -> None:
    """Kill and reap a gate that must not go on, and close the pipes to it."""
    process.kill()
    process.wait()
    box.forget(process.pid)
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
