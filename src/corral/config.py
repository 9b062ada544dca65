"""Settings: where corral keeps its state and how far a session may go.

Defaults are embedded, so `corral serve` needs no file. Each can be overridden by an
environment variable (`CORRAL_<NAME>`), which the CLI and tests use.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import platformdirs

from corral.errors import InvalidInput
from corral.mounts import MountSpec, parse_mount_list, validate_mounts
from corral.sandbox.limits import Limits, parse_size

MIB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    """Everything configurable about a corral server. Units are in the names.

    Construction (and so `from_env` and `dataclasses.replace`) checks what later code relies
    on and keeps it parsed: `limits`, the limits a new session starts with, and
    `mount_specs`, the operator's project mounts by name (each folder checked on disk: no
    link, not corral's own folders, not the home unless allowed). Raises `InvalidInput`.
    """

    state_dir: Path
    run_root: Path
    config_dir: Path = Path("/nonexistent")
    host: str = "127.0.0.1"
    port: int = 8222
    bwrap: str | None = None
    kernel_runtime: str | None = None  # the kernels' virtual environment; default: make's
    max_sessions: int = 16
    idle_timeout_s: float = 3600.0
    exec_timeout_s: float = 300.0
    interrupt_grace_s: float = 5.0
    kernel_start_timeout_s: float = 60.0
    max_output_bytes: int = 1_000_000
    execution_keep_s: float = 600.0  # how long an ended execution can be asked for by id
    execution_keep_count: int = 200  # and at most this many ended ones
    tmp_size_bytes: int = 1024 * MIB
    home_size_bytes: int = 128 * MIB
    memory_bytes: int = 2048 * MIB  # per session, its tmpfs pages included; no swap
    cpus: float = 1.0
    tasks: int = 256  # processes and threads per session
    workspace_bytes: int = 5120 * MIB  # the workspace and the session's package prefix
    workspace_files: int = 200_000  # files and directories there and in the run directories
    limit_mechanism: str = "auto"  # auto (the strongest available) or rlimit (the fallback)
    forward_env: str = ""  # host variables passed into every sandbox, comma-separated names
    mounts: str = ""  # the operator's project folders: NAME=PATH[:ro|rw], comma-separated
    allow_home_mount: bool = False  # let a mount be the home folder (or contain it)
    protected_files: str = ""  # more file names protected in read-write mounts, comma-separated
    browser_net: str = "public"  # the browsing policy: public, allowlist or none
    browser_allow: str = ""  # its allowlist (or extra non-global entries), comma-separated
    browser_timeout_s: float = 30.0  # per page
    browser_max_chars: int = 200_000  # visible text returned per page
    browser_max_concurrent: int = 2  # fetches running at once; more wait their turn
    browser_memory_bytes: int = 2048 * MIB
    browser_chromium: str | None = None  # the Chromium to run; default: the system's
    progress_interval_s: float = 1.0  # between progress notes of a silent run
    net_default: str = "none"  # the network mode of new sessions: none, allowlist or public
    net_allow: str = ""  # the allowlist of new sessions, comma-separated
    net_elicitation: bool = False  # let a human approve access requests in the MCP client
    egress_max_connections: int = 64
    egress_idle_timeout_s: float = 300.0
    # A CA file trusted, besides the system's roots, for origins the proxy reads (secrets).
    egress_upstream_ca: str = ""
    max_body_bytes: int = 10 * MIB
    header_timeout_s: float = 10.0  # for a request's headers to arrive, from its first byte
    body_idle_timeout_s: float = 30.0  # the longest wait for the next part of a request body
    body_timeout_s: float = 300.0  # for a whole request body
    max_connections: int = 1000  # open HTTP connections (and requests running); more get 503
    max_upload_bytes: int = 100 * MIB
    allowed_hosts: str = ""  # extra Host names accepted besides the bound address, comma-separated
    pool_size: int = 2  # default-profile python kernels kept ready for new sessions; 0: none
    pool_max_size: int = 12  # what a burst of session starts may grow the pool to
    pool_memory_bytes: int = 512 * MIB  # what the ready kernels may hold together (their PSS)
    pool_idle_s: float = 900.0  # empty the pool when no session was started for this long
    # No refill starts this soon after a session took a kernel: its first code goes first.
    pool_refill_pause_s: float = 0.25
    ui_login_ttl_s: float = 28800.0  # how long a dashboard login lasts (8 h)
    font_list_build: bool = True  # build matplotlib's font list once, for every new session
    # Parsed from the fields above at construction; never set directly.
    limits: Limits = field(init=False, repr=False, compare=False)
    mount_specs: Mapping[str, MountSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "limits", self._parse_limits())
        object.__setattr__(self, "mount_specs", self._parse_mounts())

    def _parse_limits(self) -> Limits:
        """The limits a new session starts with; the operator may change them per session."""
        limits = Limits(
            memory_bytes=self.memory_bytes,
            cpus=self.cpus,
            tasks=self.tasks,
            workspace_bytes=self.workspace_bytes,
            tmp_bytes=self.tmp_size_bytes,
            exec_timeout_s=self.exec_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            output_bytes=self.max_output_bytes,
            workspace_files=self.workspace_files,
        )
        return limits.changed(asdict(limits))  # the configured limits pass the same checks

    def _parse_mounts(self) -> Mapping[str, MountSpec]:
        if not self.mounts.strip():
            return {}
        return validate_mounts(
            parse_mount_list(self.mounts),
            home=Path.home(),
            protected=[self.state_dir, self.config_dir, self.run_root],
            allow_home=self.allow_home_mount,
        )

    @property
    def forwarded_names(self) -> tuple[str, ...]:
        """The validated names of `forward_env`; raises `InvalidInput` for a refused one."""
        return tuple(validate_env_name(n.strip()) for n in self.forward_env.split(",") if n.strip())

    @property
    def protected_names(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in self.protected_files.split(",") if n.strip())

    @property
    def sessions_dir(self) -> Path:
        return self.state_dir / "sessions"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "corral.db"

    @property
    def audit_journal_path(self) -> Path:
        """The audit writer's write-ahead journal, beside the database."""
        return self.state_dir / "audit.journal"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Defaults, overridden by `CORRAL_*` variables. Raises `InvalidInput` on a bad value."""
        env = os.environ if env is None else env
        settings = cls(
            state_dir=_default_state_dir(env),
            run_root=_default_run_root(env),
            config_dir=_default_config_dir(env),
        )
        overrides: dict[str, object] = {}
        for spec in fields(cls):
            raw = env.get(f"CORRAL_{spec.name.upper()}")
            if raw is None or not spec.init or spec.name in ("state_dir", "run_root", "config_dir"):
                continue
            overrides[spec.name] = _parse(spec.name, raw, getattr(settings, spec.name))
        return replace(settings, **overrides)  # type: ignore[arg-type]


ZERO_ALLOWED = frozenset({"pool_size", "pool_refill_pause_s"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Set by corral itself inside the sandbox, or able to change how it loads code.
RESERVED_ENV = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH"}
    | {"PYTHONHOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "SSH_AUTH_SOCK"}
)


def validate_env_name(name: str) -> str:
    """`name` if the operator may forward it into sandboxes; raises `InvalidInput`.

    Proxy settings never pass (they carry credentials and would route around the egress
    proxy), nor variables corral sets itself.
    """
    if not _ENV_NAME.fullmatch(name):
        raise InvalidInput(f"{name!r} is not an environment variable name")
    if "PROXY" in name.upper():
        raise InvalidInput(f"{name} is a proxy setting: proxy settings never enter a sandbox")
    if name.upper() in RESERVED_ENV:
        raise InvalidInput(f"{name} is set by corral inside the sandbox and cannot be forwarded")
    return name


def _parse(name: str, raw: str, default: object) -> object:
    if name.endswith("_bytes"):
        return _positive(name, raw, parse_size(raw))
    try:
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes")
        if isinstance(default, int):
            value: float = int(raw)
        elif isinstance(default, float):
            value = float(raw)
        elif default is None or isinstance(default, str):
            return raw or default
        else:
            return raw
    except ValueError as exc:
        raise InvalidInput(f"CORRAL_{name.upper()}={raw!r} is not a number") from exc
    if name in ZERO_ALLOWED and value == 0:
        return value
    return _positive(name, raw, value)


def _positive(name: str, raw: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise InvalidInput(f"CORRAL_{name.upper()} must be positive, not {raw!r}")
    return value


def _default_state_dir(env: Mapping[str, str]) -> Path:
    if env.get("CORRAL_STATE_DIR"):
        return Path(env["CORRAL_STATE_DIR"]).absolute()
    return Path(platformdirs.user_state_dir("corral", appauthor=False))


def _default_config_dir(env: Mapping[str, str]) -> Path:
    if env.get("CORRAL_CONFIG_DIR"):
        return Path(env["CORRAL_CONFIG_DIR"]).absolute()
    return Path(platformdirs.user_config_dir("corral", appauthor=False))


def _default_run_root(env: Mapping[str, str]) -> Path:
    """A short directory for kernel sockets: unix socket paths must stay under 108 bytes."""
    if env.get("CORRAL_RUN_ROOT"):
        return Path(env["CORRAL_RUN_ROOT"]).absolute()
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "corral"
    return Path(f"/tmp/corral-{os.getuid()}")
