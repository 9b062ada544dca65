"""Matplotlib's font list, built once in a sandbox and copied into every new session's prefix.

matplotlib keeps the fonts it found in `$MPLCONFIGDIR/fontlist-v*.json`; without that file
the first `import matplotlib.pyplot` looks at every font of the system (seconds) and says
"Matplotlib is building the font cache" on stderr. Each session has its own MPLCONFIGDIR in
its own fresh package prefix, so each one would pay that. Instead:

- the list is built inside a sandbox of the default profile, so every path in it is a path a
  session sees (the runtime at /opt/corral/runtime, the system's fonts under /usr);
- it is kept in the state directory under a key made of matplotlib's version, the runtime's
  host paths and the font files present (names, sizes, times), so a later server reuses it
  and a changed matplotlib or font set makes a new one;
- the server's start only looks for a list kept under the current key (no build, so even
  the warm pool's first kernel gets it); without one, the first kernel launch starts the
  build in the background (nothing waits for it); once it is ready, `create_session_env`
  copies it into each new prefix before any sandbox sees that prefix.

A session created before the list is ready, or whose copy is missing or corrupt, is left to
matplotlib, which rebuilds its own as it always did. A runtime without matplotlib has none.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

from corral import fsafe
from corral.sandbox.launch import start_sandbox
from corral.sandbox.policy import SandboxPolicy
from corral.sandbox.process import kill_group
from corral.sandbox.profile import SessionPaths
from corral.sandbox.runtime import MPL_CONFIG_NAME, PythonRuntime, create_session_env

log = logging.getLogger(__name__)

# Where fontconfig and matplotlib find the system's fonts (a session's home is empty).
FONT_DIRS: tuple[Path, ...] = (
    Path("/usr/share/fonts"),
    Path("/usr/local/share/fonts"),
    Path("/etc/fonts"),
)
LIST_GLOB = "fontlist-v*.json"
MAX_LIST_BYTES = 16 << 20
BUILD_TIMEOUT_S = 300.0
BUILD_SCRIPT = "import matplotlib.font_manager"

PolicyFor = Callable[[SessionPaths], SandboxPolicy]


class FontCache:
    """The font list of one server: `seed()` says what to copy into a new prefix.

    `cache_dir` is the server's own (in its state directory); `policy_for` gives the default
    profile over a session's paths; `bwrap` is the host's bwrap.
    """

    def __init__(
        self,
        cache_dir: Path,
        runtime: PythonRuntime,
        *,
        policy_for: PolicyFor,
        bwrap: str,
        font_dirs: tuple[Path, ...] = FONT_DIRS,
        build_on_first_seed: bool = True,
    ) -> None:
        self.cache_dir = cache_dir
        self.runtime = runtime
        self.policy_for = policy_for
        self.bwrap = bwrap
        self.font_dirs = font_dirs
        self.build_on_first_seed = build_on_first_seed
        self.ready: Path | None = None
        self._task: asyncio.Task[Path | None] | None = None
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._closed = False

    def seed(self) -> Path | None:
        """The font list to copy into a new prefix, or None while there is none.

        The first call without one (on the event loop) starts the build in the background,
        unless `build_on_first_seed` is off (then only `wait_ready` builds).
        """
        if self.ready is None and self.build_on_first_seed:
            self._start()
        return self.ready

    async def find_kept(self) -> Path | None:
        """The list an earlier server kept for the current key, looked for off the event loop
        (no build: this is for the server's start), or None."""
        return await asyncio.to_thread(self.ensure, build=False)

    async def wait_ready(self) -> Path | None:
        """Find or build the list (started if it is not yet) and return it, None if none."""
        return await asyncio.shield(self._start())

    async def close(self) -> None:
        """Stop a build under way (its sandbox is killed) and wait for the thread to end."""
        self._closed = True
        process = self._process
        if process is not None:
            kill_group(process.pid)
        if self._task is not None:
            await asyncio.wait({self._task})

    def _start(self) -> asyncio.Task[Path | None]:
        if self._task is None:
            self._task = asyncio.create_task(asyncio.to_thread(self.ensure), name="corral-fonts")
        return self._task

    def ensure(self, *, build: bool = True) -> Path | None:
        """Blocking: the kept list for the current key, built first if there is none (and
        `build`).

        Any failure is logged and leaves sessions to build their own (None).
        """
        with self._lock:
            if self.ready is None and not self._closed:
                try:
                    self.ready = self._find_or_build(build)
                except (OSError, ValueError, subprocess.SubprocessError) as exc:
                    log.warning("matplotlib's font list could not be prepared: %s", exc)
            return self.ready

    def _find_or_build(self, build: bool) -> Path | None:
        key = cache_key(self.runtime, self.font_dirs)
        if key is None:
            return None
        kept = kept_list(self.cache_dir / key)
        if kept is None and build:
            kept = self._build(key)
        if kept is not None:
            self._forget_others(key)
        return kept

    def _build(self, key: str) -> Path | None:
        """Build the list in a sandbox over a throw-away prefix and keep a checked copy."""
        self.cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        work = self.cache_dir / "build"
        _remove(work)
        paths = SessionPaths(workspace=work / "workspace", env=work / "env")
        paths.workspace.mkdir(mode=0o700, parents=True)
        create_session_env(paths.env, self.runtime)
        try:
            if not self._run_build(paths):
                return None
            found = read_built_list(work)
        finally:
            _remove(work)
        if found is None:
            return None
        name, data = found
        staging = self.cache_dir / f"{key}.new"
        _remove(staging)
        staging.mkdir(mode=0o700)
        (staging / name).write_bytes(data)
        staging.rename(self.cache_dir / key)
        return self.cache_dir / key / name

    def _run_build(self, paths: SessionPaths) -> bool:
        # Normal priority: niced, a busy host could starve it past the first sessions it is for.
        command = [self.runtime.sandbox_python, "-c", BUILD_SCRIPT]
        process = start_sandbox(
            self.policy_for(paths),
            command,
            bwrap=self.bwrap,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._process = process
        try:
            _, stderr = process.communicate(timeout=BUILD_TIMEOUT_S)
        finally:
            self._process = None
            if process.returncode is None:
                kill_group(process.pid)
                process.communicate()
        if process.returncode != 0 and not self._closed:
            log.warning("building matplotlib's font list failed: %s", stderr[-2000:])
        return process.returncode == 0

    def _forget_others(self, key: str) -> None:
        """Lists of an older matplotlib or font set are of no use any more."""
        for entry in self.cache_dir.iterdir():
            if entry.name != key:
                _remove(entry)


def cache_key(runtime: PythonRuntime, font_dirs: tuple[Path, ...]) -> str | None:
    """What the list depends on, hashed; None when the runtime has no matplotlib."""
    version = matplotlib_version(runtime.site_packages)
    if version is None:
        return None
    digest = hashlib.sha256()
    for part in (version, str(runtime.site_packages), str(runtime.base_prefix)):
        digest.update(part.encode() + b"\0")
    for line in font_files(font_dirs):
        digest.update(line.encode("utf-8", "surrogateescape") + b"\0")
    return f"mpl-{version}-{digest.hexdigest()[:16]}"


def matplotlib_version(site_packages: Path) -> str | None:
    """The version of the matplotlib installed in `site_packages`, without importing it."""
    for dist in metadata.distributions(name="matplotlib", path=[str(site_packages)]):
        return str(dist.version)
    return None


def font_files(font_dirs: tuple[Path, ...]) -> Iterator[str]:
    """One line per entry under the font directories (path, size, mtime); links not followed."""
    for top in font_dirs:
        for root, dirs, files in os.walk(top):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                yield f"{path} {info.st_size} {info.st_mtime_ns}"


def kept_list(key_dir: Path) -> Path | None:
    """The list kept under `key_dir` when there is exactly one and it reads as one."""
    if not key_dir.is_dir() or key_dir.is_symlink():
        return None
    found = sorted(key_dir.glob(LIST_GLOB))
    if len(found) != 1 or not found[0].is_file() or found[0].is_symlink():
        return None
    try:
        return found[0] if is_font_list(found[0].read_bytes()) else None
    except OSError:
        return None


def read_built_list(work: Path) -> tuple[str, bytes] | None:
    """The list the build sandbox left in `work/env/mpl`, as (name, bytes), when it is one.

    That prefix was a sandbox's: nothing in it is followed, and what is read is checked.
    """
    try:
        with fsafe.walk(work, ("env", MPL_CONFIG_NAME)) as mpl:
            names = sorted(n for n in os.listdir(mpl) if Path(n).match(LIST_GLOB))
            if len(names) != 1:
                return None
            fd = fsafe.open_file_at(mpl, names[0], ("env", MPL_CONFIG_NAME))
            with open(fd, "rb") as file:
                data = file.read(MAX_LIST_BYTES + 1)
    except fsafe.UnsafePath as exc:
        log.warning("the font list build left something unsafe: %s", exc)
        return None
    if len(data) > MAX_LIST_BYTES or not is_font_list(data):
        return None
    return names[0], data


def is_font_list(data: bytes) -> bool:
    """Whether `data` is JSON of the shape matplotlib writes (an object with its version)."""
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nesting too deep to parse
        return False
    return isinstance(parsed, dict) and "_version" in parsed and "ttflist" in parsed


def _remove(path: Path) -> None:
    """Remove a file or a tree (links are removed, never followed), if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
