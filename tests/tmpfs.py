"""A tmpfs mounted by a test (root only, as in CI): a small disk or another filesystem."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(point: Path, options: str) -> Iterator[Path]:
    """A tmpfs with mount `options` at the existing folder `point`, unmounted on exit.

    Skips the test, saying why, where this process may not mount (not root, or a host that
    refuses); CI runs as root.
    """
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
