"""A project tree as protect looks at it: through `corral.fsafe`, where gone means None.

The project can change while it is walked (the sandbox, or the user, writes it), so a name
that vanished, became a link or stopped being a directory since it was listed is simply not
there for these helpers; the caller decides whether that is a refusal.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from corral.fsafe import DIR_FLAGS, LinkRefused, open_dir_at
from corral.fsafe import Kind as FileType

GONE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


def open_root(root: Path) -> int:
    """A descriptor of project folder `root`, itself no link (`OSError` otherwise)."""
    return os.open(root, DIR_FLAGS)


def open_real_dir(parent: int, name: str) -> int | None:
    """A descriptor of real directory `name` in `parent`; None if it is gone or not one."""
    try:
        return open_dir_at(parent, name)
    except LinkRefused:
        return None
    except OSError as exc:
        if exc.errno in GONE:
            return None
        raise


def entry_type(entry: os.DirEntry[str]) -> FileType | None:
    """The type of a listed entry without following it; None if it vanished meanwhile."""
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        return None
    return "other"
