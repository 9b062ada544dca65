"""`SandboxPolicy`: everything one sandbox may see and use, as frozen data.

The policy is built by `corral.sandbox.profile` and turned into a bwrap command line by
`corral.sandbox.bwrap.build_argv`; neither step touches the filesystem or starts anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

SANDBOX_UID = 1000
SANDBOX_GID = 1000
SANDBOX_USER = "sandbox"
SANDBOX_HOME = "/home/sandbox"
WORKSPACE = "/workspace"
SANDBOX_RUN_DIR = "/run/corral"


@dataclass(frozen=True)
class Bind:
    """A host path shown at `dest` inside the sandbox, read-only unless `writable`."""

    source: Path
    dest: str
    writable: bool = False


@dataclass(frozen=True)
class Overlay:
    """Host folder `lower` shown at `dest` as an overlay: the sandbox reads it as it is and
    writes into `upper` (with `work`, overlayfs's scratch folder on the same filesystem);
    nothing it does reaches `lower` itself."""

    lower: Path
    upper: Path
    work: Path
    dest: str


Mount = Bind | Overlay


@dataclass(frozen=True)
class Tmpfs:
    """A fresh in-memory filesystem at `dest`, at most `size_bytes` large."""

    dest: str
    size_bytes: int
    mode: int = 0o755


@dataclass(frozen=True)
class Symlink:
    """A symbolic link at `dest` to `target`, as on a merged-/usr host (/bin -> usr/bin)."""

    target: str
    dest: str


@dataclass(frozen=True)
class SandboxPolicy:
    """What one sandbox is made of. Mount order is the order of the tuples, system first.

    `system` holds the read-only host paths every program needs (/usr, a few /etc files, the
    Python runtime); `binds` the session's own paths (workspace, run directory, packages).
    `env` is the whole environment: the sandbox starts from an empty one.
    """

    system: tuple[Bind, ...]
    symlinks: tuple[Symlink, ...]
    tmpfs: tuple[Tmpfs, ...]
    binds: tuple[Mount, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str = WORKSPACE
    hostname: str = "corral"
    uid: int = SANDBOX_UID
    gid: int = SANDBOX_GID
    seccomp: bool = True
    # /proc entries hidden behind an empty file or folder (see profile.PROC_MASKED); /proc is
    # then made read-only, so no sysctl or /proc/sysrq-trigger write reaches the host kernel.
    proc_masked_files: tuple[str, ...] = ()
    proc_masked_dirs: tuple[str, ...] = ()
    empty_dir: Path | None = None

    def with_run_dir(self, run_dir: Path) -> SandboxPolicy:
        """This policy with a session sandbox's run directory (its kernels' sockets) at
        `SANDBOX_RUN_DIR`."""
        return replace(self, binds=(*self.binds, Bind(run_dir, SANDBOX_RUN_DIR, writable=True)))
