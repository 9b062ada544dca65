"""Code that tests run inside sessions, and host-side helpers: tree snapshots, git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def fork_loop(count: int) -> str:
    """Code that forks up to `count` sleeping children and prints how many it made."""
    return f"""
import os, time
forked = 0
try:
    for _ in range({count}):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        forked += 1
finally:
    print('forked', forked)
"""


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root` (links by target, files by bytes), to compare host trees."""
    seen: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            seen[rel] = f"link -> {os.readlink(path)}"
        elif path.is_file():
            seen[rel] = path.read_bytes()
        else:
            seen[rel] = "dir"
    return seen


def git(cwd: Path, *args: str) -> str:
    """The real git in `cwd`, with no configuration but a fixed identity; its stdout."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    done = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", "-c", "protocol.file.allow=always", *args],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout
