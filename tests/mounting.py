"""Filesystems a test mounts (root only, as in CI): a small tmpfs, a loop image."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted(point: Path, source: list[str], what: str) -> Iterator[Path]:
    """`mount SOURCE... POINT` (an existing folder), unmounted on exit.

    Skips the test, saying why, where this process may not mount (not root, or a host that
    refuses); CI runs as root.
    """
    if os.geteuid() != 0:
        pytest.skip(f"mounting {what} needs root (CI runs as root)")
    done = subprocess.run(
        ["mount", *source, str(point)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount {what} here: {done.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


def mounted_tmpfs(point: Path, options: str) -> contextlib.AbstractContextManager[Path]:
    """A tmpfs with mount `options` at `point`."""
    return mounted(point, ["-t", "tmpfs", "-o", options, "tmpfs"], "a tmpfs")
