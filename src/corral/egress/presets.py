"""Named allowlist presets and the hosts they stand for.

The package-index presets follow the tools' own configuration, so a user with a mirror gets
the mirror: `pypi` is pip's configured index (PIP_INDEX_URL and PIP_EXTRA_INDEX_URL) or,
when none is set, the default index pip itself ships; `npm` is what `npm config get
registry` reports. The others are fixed lists of the service's hosts.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping
from urllib.parse import urlsplit

FIXED: dict[str, tuple[str, ...]] = {
    "github": ("github.com", "*.github.com", "*.githubusercontent.com"),
    "huggingface": ("huggingface.co", "*.huggingface.co", "*.hf.co"),
}
NAMES: tuple[str, ...] = ("pypi", "npm", *FIXED)


def preset_hosts(name: str, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The allowlist entries preset `name` expands to (empty when the tool is not set up)."""
    if name == "pypi":
        return _pip_hosts(os.environ if env is None else env)
    if name == "npm":
        return _npm_hosts()
    return FIXED.get(name, ())


def _pip_hosts(env: Mapping[str, str]) -> tuple[str, ...]:
    urls = [env.get("PIP_INDEX_URL", ""), *env.get("PIP_EXTRA_INDEX_URL", "").split()]
    hosts = [_host_port(url) for url in urls if url.startswith(("http://", "https://"))]
    if not hosts:
        from pip._internal.models.index import PyPI

        hosts = [PyPI.netloc, PyPI.file_storage_domain]
    return tuple(dict.fromkeys(hosts))


def _host_port(url: str) -> str:
    """`host[:port]` of a URL, without any credentials it carries."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


@functools.cache
def _npm_hosts() -> tuple[str, ...]:
    npm = shutil.which("npm")
    if npm is None:
        return ()
    try:
        done = subprocess.run(
            [npm, "config", "get", "registry"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    host = _host_port(done.stdout.strip())
    return (host,) if host else ()
