"""The Python runtime that kernels use inside the sandbox, and each session's package prefix.

The host's interpreter prefix and the kernel runtime's site-packages are shown read-only at
fixed paths. The kernel runtime is a virtual environment of its own (`make` installs it from
runtime/requirements.lock into .venv/kernel-runtime), not the server's: the server's packages
are not importable from a sandbox, and upgrading them does not change what agents find.
Each session gets a small virtual environment of its own (writable, persistent) whose
site-packages comes first and whose `.pth` file adds the shared runtime after it: what an agent
`pip install`s lands in the session, survives restarts, and shadows the shared version.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from corral import fsafe
from corral.errors import SandboxUnavailable

SANDBOX_PYTHON_PREFIX = "/opt/corral/python"
SANDBOX_RUNTIME_SITE = "/opt/corral/runtime"
SANDBOX_ENV = "/opt/corral/env"
KERNEL_RUNTIME_DIR = "kernel-runtime"
MPL_CONFIG_NAME = "mpl"  # MPLCONFIGDIR is SANDBOX_ENV/mpl (see profile.BASE_ENV)

# What a session finds importable (the import names of runtime/requirements.in's libraries);
# `corral doctor` checks each inside a sandbox and the README lists them.
RUNTIME_LIBRARIES: tuple[str, ...] = (
    *("numpy", "pandas", "scipy", "sklearn", "statsmodels", "seaborn", "matplotlib"),
    *("sympy", "mpmath", "duckdb", "pyarrow", "joblib", "tqdm"),
    *("pypdf", "docx", "pptx", "openpyxl", "xlsxwriter", "xlrd", "PIL", "reportlab"),
    *("pdfplumber", "pypdfium2", "pdf2image", "img2pdf", "imageio", "imageio_ffmpeg", "bs4"),
    *("yaml", "requests", "httpx", "aiohttp"),
)
# The server's own packages: none of them may be importable from a sandbox.
SERVER_ONLY: tuple[str, ...] = ("corral", "mcp", "starlette", "uvicorn", "pydantic", "click")
# Programs a session may run when the host has them (a sandbox sees the host's /usr, read-only):
# what coderunner's image offers; scripts/install-system-packages installs them as root.
SYSTEM_TOOLS: tuple[str, ...] = ("ffmpeg", "pdftotext", "pdftoppm", "rg", "fdfind", "7z")

log = logging.getLogger(__name__)

_PIP_SCRIPT = """#!{python}
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""


@dataclass(frozen=True)
class PythonRuntime:
    """Where the interpreter and the shared packages live on the host."""

    base_prefix: Path
    site_packages: Path
    version: str  # "3.11"

    @property
    def sandbox_python(self) -> str:
        """The interpreter inside the sandbox, as seen from there."""
        return f"{SANDBOX_ENV}/bin/python"

    @property
    def sandbox_base_python(self) -> str:
        return f"{SANDBOX_PYTHON_PREFIX}/bin/python{self.version}"


def default_runtime_prefix() -> Path:
    """Where `make` installs the kernel runtime: beside the server's own packages."""
    return Path(sys.prefix) / KERNEL_RUNTIME_DIR


def current_runtime(prefix: Path | str | None = None) -> PythonRuntime:
    """The kernel runtime at `prefix` (default: `default_runtime_prefix()`), which must be a
    virtual environment of the server's own interpreter: the sandbox shows that interpreter.

    Raises `SandboxUnavailable`, saying how to install it, when it is missing or was made
    with another interpreter.
    """
    root = Path(prefix or default_runtime_prefix()).absolute()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base_prefix = Path(sys.base_prefix).resolve()
    home = _venv_home(root)
    if home is None:
        raise SandboxUnavailable(
            f"the kernel runtime is not installed at {root}: `make serve` installs it "
            "(or set CORRAL_KERNEL_RUNTIME to a virtual environment made from "
            "runtime/requirements.lock)"
        )
    site_packages = root / "lib" / f"python{version}" / "site-packages"
    if home.resolve() != (base_prefix / "bin").resolve() or not site_packages.is_dir():
        raise SandboxUnavailable(
            f"the kernel runtime at {root} was made with another Python ({home}) than the "
            f"server's ({base_prefix}, {version}): remove it and run `make serve` again"
        )
    return PythonRuntime(
        base_prefix=base_prefix, site_packages=site_packages.resolve(), version=version
    )


def _venv_home(root: Path) -> Path | None:
    """The `home` of the virtual environment at `root`, or None if there is none."""
    try:
        lines = (root / "pyvenv.cfg").read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip())
    return None


@dataclass(frozen=True)
class _Entry:
    """One name the host relies on in a package prefix: a file with this content and mode,
    or (`link`) a symbolic link to this target."""

    parts: tuple[str, ...]
    content: str
    mode: int = 0o644
    link: bool = False


def _entries(runtime: PythonRuntime) -> tuple[_Entry, ...]:
    site = ("lib", f"python{runtime.version}", "site-packages")
    pyvenv = (
        f"home = {SANDBOX_PYTHON_PREFIX}/bin\ninclude-system-site-packages = false\n"
        f"version = {runtime.version}\n"
    )
    pip = _PIP_SCRIPT.format(python=runtime.sandbox_python)
    return (
        _Entry(("pyvenv.cfg",), pyvenv),
        _Entry((*site, "_corral_runtime.pth"), f"{SANDBOX_RUNTIME_SITE}\n"),
        *(
            _Entry(("bin", name), runtime.sandbox_base_python, link=True)
            for name in ("python", "python3", f"python{runtime.version}")
        ),
        *(_Entry(("bin", name), pip, 0o755) for name in ("pip", "pip3")),
    )


def repair_note(repaired: list[str]) -> str:
    """What a result tells the agent once its package prefix was repaired."""
    return (
        f"the session's package prefix was damaged and has been repaired "
        f"({', '.join(repaired)} in {SANDBOX_ENV}); installed packages are kept"
    )


def repair_session_env(env_dir: Path, runtime: PythonRuntime) -> list[str]:
    """Put back what the host relies on in an existing package prefix; the names repaired.

    The sandbox can write the prefix, so nothing in it is followed: each directory on the
    way is opened without following links (a link or a file there is replaced by an empty
    directory, since what it pointed at is not the host's to read), and each entry that is
    not exactly what `create_session_env` wrote is removed and written again. Everything
    else (the installed packages) is left as it is.
    """
    repaired: list[str] = []
    with fsafe.closing(fsafe.open_dir_at(None, env_dir)) as root:
        for entry in _entries(runtime):
            if _repair_entry(root, entry):
                repaired.append("/".join(entry.parts))
    return repaired


def _repair_entry(root: int, entry: _Entry) -> bool:
    *dirs, name = entry.parts
    fd = os.dup(root)
    replaced = False
    try:
        for part in dirs:
            child, fresh = _dir_replacing(fd, part)
            os.close(fd)
            fd = child
            replaced = replaced or fresh
        if _entry_intact(fd, name, entry):
            return replaced
        _remove_any(fd, name)
        _write_entry(fd, name, entry)
        return True
    finally:
        os.close(fd)


def _dir_replacing(parent: int, name: str) -> tuple[int, bool]:
    """A descriptor of directory `name`, made anew when something else is there."""
    info = fsafe.lstat_at(parent, name)
    fresh = info is not None and not stat.S_ISDIR(info.st_mode)
    if fresh:
        _remove_any(parent, name)
    return fsafe.open_child_dir(parent, name, mode=0o755), fresh or info is None


def _entry_intact(parent: int, name: str, entry: _Entry) -> bool:
    info = fsafe.lstat_at(parent, name)
    if info is None:
        return False
    if entry.link:
        return stat.S_ISLNK(info.st_mode) and os.readlink(name, dir_fd=parent) == entry.content
    if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) != entry.mode:
        return False
    expected = entry.content.encode()
    if info.st_size != len(expected):
        return False
    with fsafe.closing(fsafe.open_file_at(parent, name)) as fd:
        return os.read(fd, len(expected) + 1) == expected


def _remove_any(parent: int, name: str) -> None:
    info = fsafe.lstat_at(parent, name)
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        fsafe.remove_tree(parent, name)
    else:
        os.unlink(name, dir_fd=parent)


def _write_entry(parent: int, name: str, entry: _Entry) -> None:
    if entry.link:
        os.symlink(entry.content, name, dir_fd=parent)
        return
    with fsafe.closing(os.open(name, fsafe.CREATE_FLAGS, entry.mode, dir_fd=parent)) as fd:
        os.fchmod(fd, entry.mode)
        os.write(fd, entry.content.encode())


def create_session_env(
    env_dir: Path, runtime: PythonRuntime, *, font_list: Path | None = None
) -> None:
    """Create a session's package prefix on the host, once, if it does not exist yet.

    An existing prefix is left alone here (the sandbox can write it; `repair_session_env`
    checks it without following anything). Every path written is a sandbox path; it only
    works in there.
    `font_list` (matplotlib's, see `corral.sandbox.fontcache`) is copied into its MPLCONFIGDIR
    while the prefix is still the host's alone; without it matplotlib builds its own.
    """
    if env_dir.exists() or env_dir.is_symlink():
        return
    staging = env_dir.with_name(env_dir.name + ".new")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    repair_session_env(staging, runtime)  # from nothing: every entry is written
    if font_list is not None:
        _seed_font_list(staging / MPL_CONFIG_NAME, font_list)
    staging.rename(env_dir)


def _seed_font_list(mpl_dir: Path, font_list: Path) -> None:
    """Copy the font list in; a failure only costs the session matplotlib's own build."""
    mpl_dir.mkdir()
    try:
        shutil.copyfile(font_list, mpl_dir / font_list.name, follow_symlinks=False)
    except OSError as exc:
        log.warning("matplotlib's font list was not copied into %s: %s", mpl_dir, exc)
