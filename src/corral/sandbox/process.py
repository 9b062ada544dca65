"""Running one command inside a sandbox to completion (doctor checks, one-off probes)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from corral.sandbox.bwrap import build_argv
from corral.sandbox.policy import SandboxPolicy
from corral.sandbox.seccomp import filter_fd


def run_sandboxed(
    policy: SandboxPolicy,
    command: Sequence[str],
    *,
    bwrap: str,
    timeout_s: float = 30.0,
) -> subprocess.CompletedProcess[str]:
    """Run `command` in a sandbox made from `policy`; stdout and stderr are captured as text.

    Raises `subprocess.TimeoutExpired` past `timeout_s` (the sandbox dies with the bwrap
    process, which is killed).
    """
    seccomp_fd = filter_fd() if policy.seccomp else None
    try:
        argv = build_argv(policy, command, bwrap=bwrap, seccomp_fd=seccomp_fd)
        return subprocess.run(
            argv,
            pass_fds=() if seccomp_fd is None else (seccomp_fd,),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env={},
            timeout=timeout_s,
            check=False,
        )
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
