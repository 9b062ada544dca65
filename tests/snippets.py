"""Code that tests run inside sessions, and host-side views that tests compare."""

from __future__ import annotations

import os
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
