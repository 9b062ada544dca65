"""The one sandbox launcher, against real bwrap: limits before the command runs, the seccomp
filter on every path (a kernel, a probe, a browser sandbox), a refused admission that leaves
nothing running, and an environment that is exactly the policy's."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from corral.config import Settings
from corral.errors import AdmissionFailed, FetchTimedOut
from corral.sandbox.boxes import LimitBox, RlimitBox
from corral.sandbox.host import SandboxHost
from corral.sandbox.launch import start_sandbox
from corral.sandbox.policy import SandboxPolicy
from corral.sandbox.process import run_sandboxed
from corral.sandbox.profile import SessionPaths
from corral.sandbox.runtime import create_session_env
from corral.service import Service

pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(120)]

MIB = 1024 * 1024
WORKSPACE_BYTES = 7 * MIB  # an odd size, so the rlimit seen inside can only be this box's
# PTRACE_TRACEME succeeds without the filter (0) and fails with EPERM (1) under it.
PTRACE = (
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
    "print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())"
)
DENIED = "-1 1"
WAIT_S = 30.0


@pytest.fixture
async def host(settings: Settings) -> AsyncIterator[SandboxHost]:
    made = SandboxHost(replace(settings, workspace_bytes=WORKSPACE_BYTES))
    await made.prepare()
    yield made
    made.close()  # its janitor leaves


@pytest.fixture
def policy(host: SandboxHost, tmp_path: Path) -> SandboxPolicy:
    paths = SessionPaths(workspace=tmp_path / "workspace", env=tmp_path / "env")
    paths.workspace.mkdir()
    create_session_env(paths.env, host.runtime)
    return host.policy(paths, tmp_size_bytes=16 * MIB)


@pytest.fixture
async def box(host: SandboxHost) -> AsyncIterator[LimitBox]:
    made = host.make_box(f"launch-{secrets.token_hex(3)}", host.settings.limits)
    await asyncio.to_thread(made.create)
    yield made
    await asyncio.to_thread(made.remove)


def _finish(process: subprocess.Popen[bytes]) -> str:
    stdout, stderr = process.communicate(timeout=WAIT_S)
    assert process.returncode == 0, stderr.decode()
    return str(stdout.decode().strip())


async def _wait_until(check: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.05)
    return False


def test_the_command_starts_inside_its_limit_box(
    host: SandboxHost, policy: SandboxPolicy, box: LimitBox
) -> None:
    """The first thing the command does is read its file-size limit, which only the box
    sets (at admission, on the gate): it is already there."""
    probe = "import resource; print(resource.getrlimit(resource.RLIMIT_FSIZE)[0])"
    process = start_sandbox(
        policy, ["python", "-c", probe], bwrap=host.bwrap, box=box, stdout=subprocess.PIPE
    )
    assert process.pid in box.pids
    assert _finish(process) == str(WORKSPACE_BYTES)


async def test_the_box_counts_the_running_sandbox(
    host: SandboxHost, policy: SandboxPolicy, box: LimitBox, tmp_path: Path
) -> None:
    go = tmp_path / "workspace" / "go"
    waiter = (
        "import os, time\n"
        "deadline = time.monotonic() + 30\n"
        "while not os.path.exists('/workspace/go') and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )
    process = start_sandbox(policy, ["python", "-c", waiter], bwrap=host.bwrap, box=box)
    try:
        assert await _wait_until(lambda: box.usage().tasks >= 1)
    finally:
        go.touch()
        await asyncio.to_thread(process.wait, WAIT_S)


class RefusingBox(RlimitBox):
    """A box whose admission fails, as a cgroup write refused by the kernel would."""

    seen: int | None = None

    def admit(self, pid: int) -> None:
        self.seen = pid
        raise PermissionError(13, "Permission denied", "cgroup.procs")


def test_a_refused_admission_raises_and_leaves_no_process(
    host: SandboxHost, policy: SandboxPolicy, settings: Settings
) -> None:
    marker = f"corral-never-{secrets.token_hex(4)}"
    refusing = RefusingBox("refusing", settings.limits)
    with pytest.raises(AdmissionFailed, match="cannot put the sandbox under its limits"):
        start_sandbox(
            policy,
            ["python", "-c", f"# {marker}"],
            bwrap=host.bwrap,
            box=refusing,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    assert refusing.seen is not None
    with pytest.raises(ProcessLookupError):
        os.kill(refusing.seen, 0)  # killed and reaped: not even a zombie is left
    running = [p.info["cmdline"] or [] for p in psutil.process_iter(["cmdline"])]
    assert not [cmd for cmd in running if any(marker in part for part in cmd)]


def test_the_environment_is_exactly_the_policys(
    host: SandboxHost, policy: SandboxPolicy, box: LimitBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_HOST_ONLY_SECRET", "must-not-enter")
    for boxed in (box, None):
        process = start_sandbox(
            policy, ["/usr/bin/env", "-0"], bwrap=host.bwrap, box=boxed, stdout=subprocess.PIPE
        )
        stdout, _ = process.communicate(timeout=WAIT_S)
        seen = dict(item.split("=", 1) for item in stdout.decode().split("\0") if item)
        # bwrap adds PWD for the working directory it changes to; nothing else enters.
        assert seen == {**dict(policy.env), "PWD": policy.cwd}


def test_seccomp_applies_to_a_launched_sandbox(host: SandboxHost, policy: SandboxPolicy) -> None:
    process = start_sandbox(
        policy, ["python", "-c", PTRACE], bwrap=host.bwrap, stdout=subprocess.PIPE
    )
    assert _finish(process) == DENIED
    open_policy = replace(policy, seccomp=False)  # the probe itself tells the two apart
    unfiltered = start_sandbox(
        open_policy, ["python", "-c", PTRACE], bwrap=host.bwrap, stdout=subprocess.PIPE
    )
    assert _finish(unfiltered) == "0 0"


def test_seccomp_applies_to_a_probe(host: SandboxHost, policy: SandboxPolicy) -> None:
    done = run_sandboxed(policy, ["python", "-c", PTRACE], bwrap=host.bwrap, timeout_s=WAIT_S)
    assert done.stdout.strip() == DENIED, done.stderr


async def test_seccomp_applies_to_a_kernel(service: Service) -> None:
    result = await service.executions.run(PTRACE, session_id=None)
    assert result.stdout.strip() == DENIED, result


async def test_seccomp_applies_to_a_browser_sandbox(service: Service) -> None:
    """The browser's own sandbox assembly (its limits, workspace and egress identity), with
    a probe instead of Chromium."""
    python = service.host.runtime.sandbox_python  # the forwarder execs a path
    stdout, stderr = await service.browser.run_in_sandbox(
        "@browser-launch", [python, "-c", PTRACE], WAIT_S
    )
    assert stdout.decode().strip() == DENIED, stderr.decode()


async def test_a_browser_sandbox_past_its_deadline_is_killed(service: Service) -> None:
    marker = f"corral-overdue-{secrets.token_hex(4)}"
    python = service.host.runtime.sandbox_python
    sleeper = [python, "-c", f"import time; time.sleep(300)  # {marker}"]
    with pytest.raises(FetchTimedOut, match="did not finish within 1 s"):
        await service.browser.run_in_sandbox("@browser-overdue", sleeper, 1.0)

    def gone() -> bool:
        running = [p.info["cmdline"] or [] for p in psutil.process_iter(["cmdline"])]
        return not [cmd for cmd in running if any(marker in part for part in cmd)]

    assert await _wait_until(gone)


async def test_two_servers_in_one_process_never_share_a_sessions_cgroup(
    host: SandboxHost, settings: Settings
) -> None:
    """Tests run several servers in one process, each with a "default" session: removing
    one server's box must leave the other's cgroup (it removed a live session's, whose next
    kernel then failed to start: "cannot put the sandbox under its limits")."""
    other = SandboxHost(settings)
    first = host.make_box("default", settings.limits)
    second = other.make_box("default", settings.limits)
    assert first.name != second.name
    if host.mechanism.name == "rlimit":
        return  # no cgroup to share
    await asyncio.to_thread(first.create)
    await asyncio.to_thread(second.create)
    await asyncio.to_thread(second.remove)
    kept = getattr(first, "dirs", {}).get("memory") or getattr(first, "dir", None)
    assert kept is not None
    try:
        assert (kept / "cgroup.procs").exists()
    finally:
        await asyncio.to_thread(first.remove)
