"""The Python runtime that kernels use inside the sandbox, and each session's package prefix.

The host's interpreter prefix and the server's site-packages are shown read-only at fixed
paths. Each session gets a small virtual environment of its own (writable, persistent) whose
site-packages comes first and whose `.pth` file adds the shared runtime after it: what an agent
`pip install`s lands in the session, survives restarts, and shadows the shared version.
"""

from __future__ import annotations

import logging
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SANDBOX_PYTHON_PREFIX = "/opt/corral/python"
SANDBOX_RUNTIME_SITE = "/opt/corral/runtime"
SANDBOX_ENV = "/opt/corral/env"
MPL_CONFIG_NAME = "mpl"  # MPLCONFIGDIR is SANDBOX_ENV/mpl (see profile.BASE_ENV)

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


def current_runtime() -> PythonRuntime:
    """The runtime of the running server: its interpreter and its own site-packages."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return PythonRuntime(
        base_prefix=Path(sys.base_prefix).resolve(),
        site_packages=Path(sysconfig.get_paths()["purelib"]).resolve(),
        version=version,
    )


def create_session_env(
    env_dir: Path, runtime: PythonRuntime, *, font_list: Path | None = None
) -> None:
    """Create a session's package prefix on the host, once, if it does not exist yet.

    An existing prefix is never touched again: the sandbox can write it, so the host must not
    follow anything inside it. Every path written is a sandbox path; it only works in there.
    `font_list` (matplotlib's, see `corral.sandbox.fontcache`) is copied into its MPLCONFIGDIR
    while the prefix is still the host's alone; without it matplotlib builds its own.
    """
    if env_dir.exists() or env_dir.is_symlink():
        return
    staging = env_dir.with_name(env_dir.name + ".new")
    if staging.exists():
        shutil.rmtree(staging)
    site = staging / "lib" / f"python{runtime.version}" / "site-packages"
    site.mkdir(parents=True)
    (staging / "bin").mkdir()
    (staging / "pyvenv.cfg").write_text(
        f"home = {SANDBOX_PYTHON_PREFIX}/bin\ninclude-system-site-packages = false\n"
        f"version = {runtime.version}\n"
    )
    (site / "_corral_runtime.pth").write_text(f"{SANDBOX_RUNTIME_SITE}\n")
    for name in ("python", "python3", f"python{runtime.version}"):
        (staging / "bin" / name).symlink_to(runtime.sandbox_base_python)
    for name in ("pip", "pip3"):
        script = staging / "bin" / name
        script.write_text(_PIP_SCRIPT.format(python=runtime.sandbox_python))
        script.chmod(0o755)
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
