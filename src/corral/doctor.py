"""`corral doctor`: can this host run sandboxes, and how well?

Each check returns a `Check` with what was found and, on failure, the fix. Checks run real
sandboxes: a probe that only reads sysctls would miss AppArmor or a seccomp-less kernel.
"""

from __future__ import annotations

import getpass
import importlib.metadata
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corral.browser.fetch import find_chromium
from corral.config import Settings
from corral.errors import CorralError, SandboxUnavailable
from corral.sandbox.boxes import make_box
from corral.sandbox.bwrap import bwrap_version, find_bwrap
from corral.sandbox.limits import (
    BEST_EFFORT,
    CGROUP_ROOT,
    best_effort,
    choose_mechanism,
    detect_mechanism,
    enforcement,
    v2_controllers_available,
)
from corral.sandbox.policy import SandboxPolicy
from corral.sandbox.process import run_sandboxed
from corral.sandbox.profile import SessionPaths, default_policy, write_identity_files
from corral.sandbox.runtime import (
    RUNTIME_LIBRARIES,
    SERVER_ONLY,
    SYSTEM_TOOLS,
    PythonRuntime,
    create_session_env,
    current_runtime,
)
from corral.sandbox.seccomp import compiled_filter

MIN_BWRAP = (0, 10, 0)
APPARMOR_USERNS = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
MAX_USERNS = Path("/proc/sys/user/max_user_namespaces")
UNPRIV_USERNS = Path("/proc/sys/kernel/unprivileged_userns_clone")
# Run inside the sandbox: each line is "name ok" or "name failed: why".
_PROBE = """
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
print("python", sys.version.split()[0])
r = libc.unshare(0x10000000)
print("userns-blocked ok" if r != 0 else "userns-blocked failed: unshare(CLONE_NEWUSER) worked")
names = [name for _, name in socket.if_nameindex()]
print("network-blocked ok" if names == ["lo"] else f"network-blocked failed: interfaces {names}")
import ipykernel, bash_kernel
print("kernels ok")
"""
_PROBE_RUNTIME = f"""
import importlib.util, shutil
def absent(names):
    return [name for name in names if importlib.util.find_spec(name) is None]
missing = absent({RUNTIME_LIBRARIES!r})
print("runtime ok" if not missing else "runtime missing: " + ", ".join(missing))
leaked = [name for name in {SERVER_ONLY!r} if name not in absent([name])]
print("isolated ok" if not leaked else "isolated failed: importable " + ", ".join(leaked))
print("tools", ",".join(tool for tool in {SYSTEM_TOOLS!r} if shutil.which(tool)))
"""


Strength = Literal["ok", "weak", "missing"]


@dataclass(frozen=True)
class Check:
    """One finding. `strength` is set for each limit: `ok` (the kernel enforces it),
    `weak` (best effort: a watchdog) or `missing` (not enforced here)."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    strength: Strength | None = None


def status_markup(check: Check) -> str:
    """The check's status as rich markup: green ok, yellow weak, red missing or FAILED."""
    if not check.ok:
        return "[red]FAILED[/red]"
    if check.strength == "weak":
        return "[yellow]weak[/yellow]"
    if check.strength == "missing":
        return "[red]missing[/red]"
    return "[green]ok[/green]"


def run_checks(settings: Settings) -> list[Check]:
    """Every check, in order; a failed prerequisite skips what depends on it."""
    checks: list[Check] = []
    bwrap_check, bwrap = _check_bwrap(settings)
    checks.append(bwrap_check)
    checks.append(_check_seccomp())
    runtime_check, runtime = _check_runtime(settings)
    checks.append(runtime_check)
    if bwrap is not None:
        userns = _check_userns(bwrap)
        checks.append(userns)
        if userns.ok:
            checks.append(_check_overlay(bwrap))
        if userns.ok and checks[1].ok and runtime is not None:
            checks.extend(_check_sandbox(bwrap, settings, runtime))
    checks += _check_limits(settings)
    checks.append(_check_browser(settings, runtime))
    return checks


def _check_browser(settings: Settings, runtime: PythonRuntime | None) -> Check:
    """Which Chromium the browser fetch will run, and whether Playwright's driver is here."""
    chromium = find_chromium(settings.browser_chromium)
    if chromium is None:
        return Check(
            "browser",
            False,
            "no Chromium found",
            "apt install chromium (or CORRAL_BROWSER_CHROMIUM)",
        )
    if runtime is None:
        return Check("browser", False, "the kernel runtime is not installed", "make serve")
    site = str(runtime.site_packages)
    found = [d.version for d in importlib.metadata.distributions(name="playwright", path=[site])]
    if not found:
        return Check("browser", False, "Playwright is not in the kernel runtime", "make serve")
    return Check("browser", True, f"{chromium}, driven by Playwright {found[0]}")


def _check_limits(settings: Settings) -> list[Check]:
    """The mechanism (tried for real: a session box made and removed), then each limit.
    Where some are weak, the mechanism's line carries (once) the one change that would
    make them hard limits on this host."""
    try:
        mechanism = choose_mechanism(settings.limit_mechanism)
        box = make_box(mechanism, f"doctor-{os.getpid()}", settings.limits)
        box.create()
        box.remove()
    except CorralError as exc:
        return [Check("limits", False, str(exc), "set CORRAL_LIMIT_MECHANISM=rlimit")]
    weak = best_effort(mechanism.name)
    # The mechanism is weak when its own limits are; the workspace's watchdog is the same
    # on every host, so no change here would help it and its line says so itself.
    fix = stronger_limits_fix(mechanism.name) if BEST_EFFORT[mechanism.name] else None
    checks = [
        Check(
            "limits",
            True,
            f"{mechanism.name}: {mechanism.detail}",
            fix or mechanism.advice,
            "weak" if fix else "ok",
        )
    ]
    for name, how in enforcement(mechanism.name).items():
        strength: Strength = "weak" if name in weak else "ok"
        checks.append(Check(f"limit {name}", True, how, None, strength))
    return checks


def stronger_limits_fix(current: str, cgroup_root: Path = CGROUP_ROOT) -> str:
    """The one change that would make memory, cpu and tasks hard limits on this host,
    checked to be possible here: never a remedy this host cannot run."""
    detected = detect_mechanism(cgroup_root)
    if detected.name != current:
        return (
            f"unset CORRAL_LIMIT_MECHANISM: {detected.name} ({detected.detail}) is available "
            "here and enforces memory, cpu and tasks in the kernel"
        )
    if os.geteuid() == 0:
        return "mount the memory, pids and cpu cgroup controllers (cgroup v2) under /sys/fs/cgroup"
    if not v2_controllers_available(cgroup_root):
        return (
            "this host's cgroup v2 hierarchy lacks the memory, pids and cpu controllers "
            "(they are bound to cgroup v1 here, which only root may use): ask an "
            "administrator to boot with systemd.unified_cgroup_hierarchy=1, or run corral as root"
        )
    user = getpass.getuser()
    if user_manager_runs():
        return (
            "start corral in a delegated cgroup: "
            "systemd-run --user --scope -p Delegate=yes corral serve"
        )
    if Path("/run/systemd/system").is_dir() and shutil.which("loginctl"):
        return (
            f"no systemd user manager runs for {user} (no XDG_RUNTIME_DIR, or systemctl --user "
            f"fails, as under su, runuser or ssh without pam_systemd): ask an administrator "
            f"for 'loginctl enable-linger {user}', log in again, then start corral with "
            "'systemd-run --user --scope -p Delegate=yes corral serve' (or as a systemd user "
            "service with Delegate=yes)"
        )
    return (
        f"systemd does not manage this host (a container?): ask an administrator to "
        f"delegate a cgroup v2 directory to {user} (chown it with its cgroup.procs and "
        "cgroup.subtree_control) and start corral serve inside it"
    )


def user_manager_runs() -> bool:
    """Whether this user has a systemd user manager `systemd-run --user` can reach."""
    if not os.environ.get("XDG_RUNTIME_DIR") or shutil.which("systemctl") is None:
        return False
    try:
        probe = subprocess.run(
            ["systemctl", "--user", "show-environment"],
            capture_output=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def _check_bwrap(settings: Settings) -> tuple[Check, str | None]:
    try:
        bwrap = find_bwrap(settings.bwrap)
        version = bwrap_version(bwrap)
    except (SandboxUnavailable, OSError, subprocess.SubprocessError) as exc:
        return Check("bwrap", False, str(exc), "reinstall corral or set CORRAL_BWRAP"), None
    shown = ".".join(map(str, version))
    if version < MIN_BWRAP:
        need = ".".join(map(str, MIN_BWRAP))
        return Check(
            "bwrap",
            False,
            f"{bwrap} is {shown}",
            f"bwrap {need} or newer is needed "
            "(--size, --disable-userns); unset CORRAL_BWRAP to use the bundled one",
        ), None
    return Check("bwrap", True, f"{bwrap} (version {shown})"), bwrap


def _check_runtime(settings: Settings) -> tuple[Check, PythonRuntime | None]:
    try:
        runtime = current_runtime(settings.kernel_runtime)
    except SandboxUnavailable as exc:
        return Check("kernel runtime", False, str(exc), "make serve"), None
    shown = f"{runtime.site_packages} (shown read-only inside)"
    return Check("kernel runtime", True, shown), runtime


def _check_seccomp() -> Check:
    try:
        program = compiled_filter()
    except SandboxUnavailable as exc:
        return Check("seccomp", False, str(exc), "apt install libseccomp2")
    return Check("seccomp", True, f"filter compiled ({len(program) // 8} BPF instructions)")


def _check_userns(bwrap: str) -> Check:
    probe = subprocess.run(
        [bwrap, "--unshare-user", "--unshare-net", "--ro-bind", "/", "/", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode == 0:
        return Check("user namespaces", True, "bwrap can create user and network namespaces")
    return Check("user namespaces", False, probe.stderr.strip() or "bwrap failed", _userns_fix())


def _check_overlay(bwrap: str) -> Check:
    """Whether a read-write project mount can start here: bwrap makes an overlay in a user
    namespace, a write inside lands in the upper layer, and the lower folder stays as it was."""
    with tempfile.TemporaryDirectory(prefix="corral-doctor-") as tmp:
        lower, upper, work = (Path(tmp) / name for name in ("lower", "upper", "work"))
        for folder in (lower, upper, work):
            folder.mkdir()
        overlay = ["--overlay-src", str(lower), "--overlay", str(upper), str(work), "/mnt/p"]
        write = ["/bin/sh", "-c", "echo x > /mnt/p/probe"]
        probe = subprocess.run(
            [bwrap, "--unshare-user", "--ro-bind", "/", "/", "--tmpfs", "/mnt", *overlay, *write],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        landed = (upper / "probe").exists() and not (lower / "probe").exists()
    if probe.returncode == 0 and landed:
        return Check("overlay", True, "read-write project mounts are overlays (Linux 5.11+)")
    return Check(
        "overlay",
        False,
        probe.stderr.strip()[-500:] or "a write inside did not land in the upper layer",
        "read-write project mounts need overlayfs in a user namespace (Linux 5.11 or newer, "
        "bwrap 0.11 or newer); mount projects read-only (NAME=PATH:ro) meanwhile",
    )


def _userns_fix() -> str:
    if _read_int(APPARMOR_USERNS) == 1:
        return (
            "Ubuntu's AppArmor forbids unprivileged user namespaces: allow them for bwrap with an "
            "AppArmor profile (see /etc/apparmor.d/bwrap-userns-restrict on Ubuntu 24.04), or "
            "run 'sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0'"
        )
    if _read_int(MAX_USERNS) == 0:
        return "user namespaces are disabled: run 'sudo sysctl user.max_user_namespaces=15000'"
    if _read_int(UNPRIV_USERNS) == 0:
        return "run 'sudo sysctl kernel.unprivileged_userns_clone=1'"
    return "check that the kernel supports user namespaces and that no policy forbids them"


def _check_sandbox(bwrap: str, settings: Settings, runtime: PythonRuntime) -> list[Check]:
    with tempfile.TemporaryDirectory(prefix="corral-doctor-") as tmp:
        policy = _probe_policy(Path(tmp), settings, runtime)
        try:
            probe = ["python", "-c", _PROBE + _PROBE_RUNTIME]
            done = run_sandboxed(policy, probe, bwrap=bwrap, timeout_s=60)
        except subprocess.TimeoutExpired:
            return [Check("sandbox", False, "the probe did not finish within 60 s")]
    results = dict(_parse_probe(done.stdout))
    if "python" not in results:
        why = done.stderr.strip()[-500:] or f"exit code {done.returncode}"
        return [Check("sandbox", False, f"python did not start in the sandbox: {why}")]
    return [
        _version_check(results["python"]),
        _probe_check(results, "userns-blocked", "no new user namespaces inside"),
        _probe_check(results, "network-blocked", "no network but loopback inside"),
        _probe_check(results, "kernels", "ipykernel and bash_kernel import inside"),
        _probe_check(results, "runtime", f"{len(RUNTIME_LIBRARIES)} libraries import inside"),
        _probe_check(results, "isolated", "the server's own packages do not import inside"),
        _tools_check(results.get("tools", "")),
    ]


def _tools_check(found: str) -> Check:
    """Which of the system tools a session will find; missing ones are a warning only."""
    have = [tool for tool in found.split(",") if tool]
    lacking = [tool for tool in SYSTEM_TOOLS if tool not in have]
    if not lacking:
        return Check("tools", True, f"a session finds {', '.join(have)}")
    return Check(
        "tools",
        True,
        f"a session finds {', '.join(have) or 'none of them'}; not {', '.join(lacking)}",
        "run scripts/install-system-packages as root (Debian: ffmpeg poppler-utils ripgrep "
        "fd-find p7zip-full)",
        strength="weak",
    )


def _probe_policy(tmp: Path, settings: Settings, runtime: PythonRuntime) -> SandboxPolicy:
    paths = SessionPaths(workspace=tmp / "workspace", env=tmp / "env")
    paths.workspace.mkdir()
    create_session_env(paths.env, runtime)
    write_identity_files(tmp / "etc")
    return default_policy(
        runtime,
        paths,
        tmp / "etc",
        tmp_size_bytes=settings.tmp_size_bytes,
        home_size_bytes=settings.home_size_bytes,
    )


def _version_check(inside: str) -> Check:
    host = platform.python_version()
    if inside != host:
        return Check(
            "sandbox python",
            False,
            f"Python {inside} inside, {host} outside",
            "the interpreter's libraries were not found in the sandbox; "
            "report this with the output of 'python3 -m sysconfig'",
        )
    return Check("sandbox python", True, f"Python {inside} starts inside the default profile")


def _parse_probe(stdout: str) -> list[tuple[str, str]]:
    pairs = []
    for line in stdout.splitlines():
        name, _, rest = line.partition(" ")
        pairs.append((name, rest))
    return pairs


def _probe_check(results: dict[str, str], name: str, good: str) -> Check:
    outcome = results.get(name)
    if outcome == "ok":
        return Check(name, True, good)
    return Check(name, False, outcome or "the probe stopped before this check")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
