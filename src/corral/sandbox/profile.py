"""The default sandbox profile (DESIGN section 3): what a session sees of the host.

Read-only: /usr (with the merged-/usr links), a short list of /etc files, the Python runtime.
Writable: the session's workspace, its package prefix and its run directory. Size-limited tmpfs
for /tmp, /dev/shm (each of the session's tmp size) and the home. Nothing else of the host
exists inside.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from corral.config import Settings
from corral.egress import forwarder as forwarder_module
from corral.sandbox import scripts
from corral.sandbox.policy import (
    SANDBOX_GID,
    SANDBOX_HOME,
    SANDBOX_UID,
    SANDBOX_USER,
    WORKSPACE,
    Bind,
    Mount,
    SandboxPolicy,
    Symlink,
    Tmpfs,
)
from corral.sandbox.runtime import (
    MPL_CONFIG_NAME,
    SANDBOX_ENV,
    SANDBOX_PYTHON_PREFIX,
    SANDBOX_RUNTIME_SITE,
    PythonRuntime,
)
from corral.skills import PUBLIC_DIR, SANDBOX_SKILLS, user_dir

# /etc entries programs need to link, verify TLS, tell the time and find fonts; nothing that
# names the host's users, network or services.
SYSTEM_ETC: tuple[str, ...] = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "alternatives",
    "fonts",
    "mime.types",
    "bash.bashrc",
)
TOP_LEVEL_LINKS: tuple[str, ...] = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class SessionPaths:
    """The host directories one session owns."""

    workspace: Path
    env: Path


def default_policy(
    runtime: PythonRuntime,
    paths: SessionPaths,
    identity_dir: Path,
    *,
    tmp_size_bytes: int,
    home_size_bytes: int,
    egress_socket: Path | None = None,
    forward_env: tuple[tuple[str, str], ...] = (),
    extra_binds: tuple[Mount, ...] = (),
    host_root: Path = Path("/"),
) -> SandboxPolicy:
    """The policy for one session's kernels. Reads only which host paths exist.

    With `egress_socket` (named `EGRESS_SOCKET_NAME`, alone in its directory), the forwarder
    and that directory are shown inside and the proxy variables point at the forwarder;
    without it the sandbox has no way out at all.
    `forward_env` holds the host variables the operator chose to pass in (validated names);
    `extra_binds` come last (project mounts, the agent bridge).
    """
    system, links = _system_mounts(host_root)
    system += _identity_binds(identity_dir)
    system += (
        Bind(runtime.base_prefix, SANDBOX_PYTHON_PREFIX),
        Bind(runtime.site_packages, SANDBOX_RUNTIME_SITE),
    )
    files, dirs = _proc_masks(host_root)
    return SandboxPolicy(
        proc_masked_files=files,
        proc_masked_dirs=dirs,
        empty_dir=identity_dir / "empty",
        system=system,
        symlinks=(*links, Symlink(WORKSPACE, CODERUNNER_UPLOADS)),
        tmpfs=(
            Tmpfs("/tmp", tmp_size_bytes, 0o1777),
            # bwrap's /dev is an unsized tmpfs (half the host's memory): shm gets its own.
            Tmpfs("/dev/shm", tmp_size_bytes, 0o1777),
            Tmpfs(SANDBOX_HOME, home_size_bytes, 0o700),
        ),
        binds=(
            Bind(paths.workspace, WORKSPACE, writable=True),
            Bind(paths.env, SANDBOX_ENV, writable=True),
            *scripts.binds(("python_kernel.py", "bash_entry.py", "spawner.py")),
            *_egress_binds(egress_socket),
            *extra_binds,
        ),
        env=forward_env + sandbox_env(runtime) + (PROXY_ENV if egress_socket is not None else ()),
    )


def _egress_binds(egress_socket: Path | None) -> tuple[Bind, ...]:
    """The socket's directory (only this sandbox's socket is in it), the forwarder, its relay.

    The directory rather than the socket: a bind pins the inode it was given, so a socket
    the proxy re-creates at the same path (a restart) would stay unreachable from a sandbox
    that had the old one bound.
    """
    if egress_socket is None:
        return ()
    if egress_socket.name != EGRESS_SOCKET_NAME:
        raise ValueError(f"the egress socket must be named {EGRESS_SOCKET_NAME}: {egress_socket}")
    return (
        Bind(egress_socket.parent, SANDBOX_EGRESS_DIR),
        *scripts.binds(("forwarder.py",)),
    )


def egress_launcher(runtime: PythonRuntime) -> list[str]:
    """The command prefix that starts the forwarder before the kernel (see forwarder.py)."""
    return [runtime.sandbox_python, scripts.run_path("forwarder.py"), SANDBOX_EGRESS_SOCKET, "--"]


# coderunner keeps its files in /app/uploads; its prompts and scripts name that path.
CODERUNNER_UPLOADS = "/app/uploads"
EGRESS_SOCKET_NAME = "egress.sock"
SANDBOX_EGRESS_DIR = "/run/corral-egress"
SANDBOX_EGRESS_SOCKET = f"{SANDBOX_EGRESS_DIR}/{EGRESS_SOCKET_NAME}"
_HTTP_PROXY = f"http://127.0.0.1:{forwarder_module.HTTP_PORT}"
_SOCKS_PROXY = f"socks5h://127.0.0.1:{forwarder_module.SOCKS_PORT}"
_NO_PROXY = "localhost,127.0.0.1,::1"
PROXY_ENV: tuple[tuple[str, str], ...] = tuple(
    (name, value)
    for upper, value in (
        ("HTTP_PROXY", _HTTP_PROXY),
        ("HTTPS_PROXY", _HTTP_PROXY),
        ("ALL_PROXY", _SOCKS_PROXY),
        ("NO_PROXY", _NO_PROXY),
    )
    for name in (upper, upper.lower())
)

BASE_ENV: tuple[tuple[str, str], ...] = (
    ("PATH", f"{SANDBOX_ENV}/bin:/usr/local/bin:/usr/bin:/bin"),
    ("HOME", SANDBOX_HOME),
    ("USER", SANDBOX_USER),
    ("LOGNAME", SANDBOX_USER),
    ("SHELL", "/bin/bash"),
    ("LANG", "C.UTF-8"),
    ("LC_ALL", "C.UTF-8"),
    ("TERM", "dumb"),
    ("TMPDIR", "/tmp"),
    ("VIRTUAL_ENV", SANDBOX_ENV),
    ("PIP_NO_CACHE_DIR", "1"),
    ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    ("MPLCONFIGDIR", f"{SANDBOX_ENV}/{MPL_CONFIG_NAME}"),
    ("PYDEVD_DISABLE_FILE_VALIDATION", "1"),
    ("PYTHONUNBUFFERED", "1"),
)


def sandbox_env(runtime: PythonRuntime) -> tuple[tuple[str, str], ...]:
    """The whole environment of a sandboxed process; no host variable is copied in.

    An interpreter built with an absolute RUNPATH (pyenv, for one) would find its libpython
    at the host path, which does not exist inside; the library path points it at the
    relocated prefix so it never falls back to a different system libpython.
    """
    relocated = runtime.base_prefix != Path("/usr")
    library_path = (("LD_LIBRARY_PATH", f"{SANDBOX_PYTHON_PREFIX}/lib"),) if relocated else ()
    return (*library_path, *BASE_ENV)


def skill_binds(settings: Settings) -> tuple[Bind, ...]:
    """The shipped and the user's skills, read-only at /opt/corral/skills/{public,user}."""
    user = user_dir(settings.config_dir)
    if settings.config_dir.is_dir():
        user.mkdir(mode=0o700, exist_ok=True)
    if not user.is_dir():  # no config directory yet: an empty folder stands in
        user = settings.state_dir / "no-user-skills"
        user.mkdir(mode=0o700, parents=True, exist_ok=True)
    return (
        Bind(PUBLIC_DIR, f"{SANDBOX_SKILLS}/public"),
        Bind(user, f"{SANDBOX_SKILLS}/user"),
    )


def forwarded_env(names: tuple[str, ...], environ: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The operator's chosen host variables that are set, as (name, value) pairs."""
    return tuple((name, environ[name]) for name in names if name in environ)


def _system_mounts(host_root: Path) -> tuple[tuple[Bind, ...], tuple[Symlink, ...]]:
    binds = [Bind(host_root / "usr", "/usr")]
    links: list[Symlink] = []
    for name in TOP_LEVEL_LINKS:
        path = host_root / name
        if path.is_symlink():
            links.append(Symlink(str(path.readlink()), f"/{name}"))
        elif path.is_dir():
            binds.append(Bind(path, f"/{name}"))
    for name in SYSTEM_ETC:
        path = host_root / "etc" / name
        if path.exists():
            binds.append(Bind(path, f"/etc/{name}"))
    return tuple(binds), tuple(links)


# /proc entries that show the host's kernel state or accept writes that change it (the same
# kinds of entries container runtimes hide); only those this kernel has are masked.
PROC_MASKED_FILES = (
    "sysrq-trigger", "kcore", "kmsg", "keys", "key-users", "timer_list", "sched_debug",
    "kallsyms", "latency_stats", "mtrr", "kpagecount", "kpageflags", "kpagecgroup",
)  # fmt: skip
PROC_MASKED_DIRS = ("acpi", "scsi", "driver", "fs", "bus", "irq", "tty", "sysvipc")


def _proc_masks(host_root: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    proc = host_root / "proc"
    files = tuple(name for name in PROC_MASKED_FILES if (proc / name).is_file())
    dirs = tuple(name for name in PROC_MASKED_DIRS if (proc / name).is_dir())
    return files, dirs


def _identity_binds(identity_dir: Path) -> tuple[Bind, ...]:
    return tuple(Bind(identity_dir / name, f"/etc/{name}") for name in IDENTITY_FILES)


IDENTITY_FILES: dict[str, str] = {
    "passwd": (
        f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_GID}:corral sandbox:{SANDBOX_HOME}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_GID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost corral\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "hostname": "corral\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}


def write_identity_files(identity_dir: Path) -> None:
    """Write the sandbox's own passwd, group and hosts into a directory only the server writes."""
    identity_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    (identity_dir / "empty").mkdir(mode=0o555, exist_ok=True)
    for name, text in IDENTITY_FILES.items():
        path = identity_dir / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            path.chmod(0o644)
