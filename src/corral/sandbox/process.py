"""Running one command inside a sandbox to completion (doctor checks, one-off probes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence

from corral.sandbox.boxes import LimitBox
from corral.sandbox.launch import start_sandbox
from corral.sandbox.policy import SandboxPolicy


def run_sandboxed(
    policy: SandboxPolicy,
    command: Sequence[str],
    *,
    bwrap: str,
    timeout_s: float = 30.0,
    box: LimitBox | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `command` in a sandbox made from `policy` (inside `box` when given); stdout and
    stderr are captured as text.

    Raises `subprocess.TimeoutExpired` past `timeout_s` (the sandbox's process group is
    killed first) and `AdmissionFailed` when the box refuses it.
    """
    process = start_sandbox(
        policy, command, bwrap=bwrap, box=box, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    finally:
        if process.returncode is None:
            kill_group(process.pid)
            process.communicate()
    return subprocess.CompletedProcess(
        process.args,
        process.returncode,
        stdout.decode("utf-8", "replace"),
        stderr.decode("utf-8", "replace"),
    )


def kill_group(pgid: int) -> None:
    """SIGKILL a sandbox's whole process group (it leads a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
