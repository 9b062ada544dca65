"""Fingerprints of the per-session copies: taken after copying, compared at the end."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from corral.fsafe import READ_FLAGS, UnsafePath, closing, kind_of, lstat_at, open_file_at
from corral.protect.names import join
from corral.protect.plan import MAX_DEPTH, Fingerprint
from corral.protect.tree import open_real_dir

_CHUNK_BYTES = 1024 * 1024


def tree_fingerprints(
    fd: int,
    prefix: str,
    out: dict[str, Fingerprint],
    budget: list[int],
    expected: Mapping[str, Fingerprint] | None,
    depth: int,
) -> None:
    """Fingerprint every entry under directory `fd`, no link followed, within `budget`.

    With `expected`, a file whose type, size or mode already differ is not hashed (its
    fingerprint differs anyway), so a huge file planted in a copy costs nothing to read.
    """
    with os.scandir(fd) as it:
        names = [e.name for e in it]
    for name in sorted(names):
        budget[0] -= 1
        if budget[0] < 0:
            return
        rel = join(prefix, name)
        info = lstat_at(fd, name)
        if info is None:
            continue
        if stat.S_ISREG(info.st_mode):
            hint = None if expected is None else expected.get(rel)
            out[rel] = _fingerprint_at(fd, name, hint)
            continue
        out[rel] = Fingerprint(kind_of(info.st_mode), 0, stat.S_IMODE(info.st_mode), "")
        if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
            child = open_real_dir(fd, name)
            if child is not None:
                with closing(child):
                    tree_fingerprints(child, rel, out, budget, expected, depth + 1)


def fingerprint_path(path: Path, hint: Fingerprint | None = None) -> Fingerprint | None:
    """The fingerprint of the copy at `path` (in our own directory), or None if it is gone."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Fingerprint("link", 0, 0, "")
        return None
    with closing(fd):
        return fingerprint_fd(fd, hint)


def fingerprint_fd(fd: int, hint: Fingerprint | None) -> Fingerprint:
    """The fingerprint of open `fd`; with a `hint` that already differs, no hashing."""
    info = os.fstat(fd)
    kind = kind_of(info.st_mode)
    mode = stat.S_IMODE(info.st_mode)
    if kind != "file":
        return Fingerprint(kind, 0, mode, "")
    if hint is not None and (hint.type, hint.size, hint.mode) != (kind, info.st_size, mode):
        return Fingerprint(kind, info.st_size, mode, "")
    digest = hashlib.sha256()
    offset = 0
    while data := os.pread(fd, _CHUNK_BYTES, offset):
        digest.update(data)
        offset += len(data)
    return Fingerprint(kind, offset, mode, digest.hexdigest())


def _fingerprint_at(parent: int, name: str, hint: Fingerprint | None) -> Fingerprint:
    try:
        fd = open_file_at(parent, name)
    except (OSError, UnsafePath):
        return Fingerprint("other", 0, 0, "")  # replaced while we looked: it changed
    with closing(fd):
        return fingerprint_fd(fd, hint)
