"""What a scan found and what a session's copies are: the data the three steps pass along."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from corral.fsafe import Kind as FileType
from corral.fsafe import kind_of

MAX_DEPTH = 64  # directories nested deeper are not entered (the plan is then incomplete)

Kind = Literal["readonly", "hooks", "copy"]


@dataclass(frozen=True)
class Stamp:
    """What a protected path was when scanned (from lstat; a link is described, not followed)."""

    type: FileType
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> Stamp:
        return cls(
            kind_of(info.st_mode),
            info.st_dev,
            info.st_ino,
            info.st_size,
            info.st_mtime_ns,
            info.st_ctime_ns,
        )

    def same(self, other: Stamp) -> bool:
        """Same object, untouched. A directory counts as the same while its inode is.

        The times matter for the rest because a freed inode number is soon reused: a file
        deleted and written anew may get the old number back, but not the old change time.
        """
        if (self.type, self.dev, self.ino) != (other.type, other.dev, other.ino):
            return False
        if self.type == "dir":
            return True
        return (self.size, self.mtime_ns, self.ctime_ns) == (
            other.size,
            other.mtime_ns,
            other.ctime_ns,
        )


@dataclass(frozen=True)
class Item:
    """One path to protect, `rel` to the mount root ('/'-separated, as on disk, unescaped).

    `kind`: "readonly" (a read-only copy), "hooks" (a throw-away copy of the directory) or
    "copy" (a writable copy). `exists` is False only for a git directory's missing `hooks`:
    `prepare` then creates the empty directory, so the copy has a verified mount point.
    """

    rel: str
    kind: Kind
    exists: bool = True


@dataclass(frozen=True)
class Plan:
    """The result of `scan`.

    `name` is the mount name used in messages and reports. `seen` maps every protected path
    found (git directories, their protected files, hooks, `.git` files, protected names, and in
    an end scan also links where they do not belong) to its `Stamp`. `complete` is False when
    the walk stopped at `max_entries` or left directories out (`skipped`: on another
    filesystem, deeper than `MAX_DEPTH`, or unreadable); items there are not protected.
    """

    name: str
    items: tuple[Item, ...]
    seen: Mapping[str, Stamp] = field(compare=False)
    extra: tuple[str, ...]
    complete: bool
    skipped: tuple[str, ...]
    entries: int


@dataclass(frozen=True)
class Fingerprint:
    """A copy as it was: type, size in bytes, permission bits, and sha256 of a regular file."""

    type: FileType
    size: int
    mode: int
    sha256: str


@dataclass(frozen=True)
class ProtectedBind:
    """A per-session copy (`source`) to bind over `rel` in the project, read-only or not.

    `kind` is the item's kind. `fingerprints` describe the copy right after copying: key ""
    for a file; for a hooks copy, each entry's path inside it (the directory itself excluded).
    """

    source: Path
    rel: str
    writable: bool
    kind: str
    fingerprints: Mapping[str, Fingerprint] = field(default_factory=dict, compare=False)
