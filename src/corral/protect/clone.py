"""Copying one open regular file to a new one: a copy-on-write clone when the filesystem can."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from corral.fsafe import CREATE_FLAGS

FICLONE = 0x40049409  # _IOW(0x94, 9, int): share the extents of another file (reflink)

_NO_REFLINK = frozenset({errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY})
_NO_COPY_RANGE = frozenset({errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOSYS})
_CHUNK_BYTES = 1024 * 1024


def clone_or_copy(src_fd: int, dst_path: Path, mode: int) -> bool:
    """Copy the regular file open at `src_fd` to a new file `dst_path` with permission `mode`.

    Tries a copy-on-write clone (FICLONE) first and returns True when that worked; falls back
    to copying the bytes (copy_file_range, then read/write) when the filesystem cannot clone.
    `dst_path` must not exist (`O_EXCL | O_NOFOLLOW`); on failure it is removed again.
    """
    dst_fd = os.open(dst_path, CREATE_FLAGS, 0o600)
    try:
        try:
            fcntl.ioctl(dst_fd, FICLONE, src_fd)
            cloned = True
        except OSError as exc:
            if exc.errno not in _NO_REFLINK:
                raise
            cloned = False
            _copy_bytes(src_fd, dst_fd)
        os.fchmod(dst_fd, stat.S_IMODE(mode))
    except BaseException:
        os.close(dst_fd)
        with contextlib.suppress(OSError):
            os.unlink(dst_path)
        raise
    os.close(dst_fd)
    return cloned


def _copy_bytes(src: int, dst: int) -> None:
    """Copy all of `src` into `dst` from offset 0, in the kernel when it can."""
    offset = 0
    try:
        while count := os.copy_file_range(src, dst, _CHUNK_BYTES, offset, offset):
            offset += count
    except OSError as exc:
        if exc.errno not in _NO_COPY_RANGE:
            raise
    # Some filesystems answer 0 before the end; the plain loop finishes from where it stopped.
    while data := os.pread(src, _CHUNK_BYTES, offset):
        view = memoryview(data)
        while view:
            view = view[os.pwrite(dst, view, offset + len(data) - len(view)) :]
        offset += len(data)
