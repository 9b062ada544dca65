"""The end-of-run comparison: which protected files a session changed or created.

Each copy is compared with its fingerprint (a hooks copy entry by entry), then a fresh scan of
the project finds protected items that appeared, and the plan's stamps find those that
disappeared, were replaced, or turned into a link or another type. Nothing here raises for
what the sandbox did: a link or an odd type is reported by name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from corral.fsafe import DIR_FLAGS, UnsafePath, closing, lstat_at, walk
from corral.protect.fingerprint import fingerprint_path, tree_fingerprints
from corral.protect.names import escape_name, join
from corral.protect.plan import Fingerprint, Plan, ProtectedBind, Stamp
from corral.protect.scan import Scanner
from corral.protect.tree import open_root


def changes(
    plan: Plan, binds: Sequence[ProtectedBind], root: Path, *, max_entries: int = 200_000
) -> list[str]:
    """The escaped names (as "MOUNT/rel") of protected files changed or created since `plan`.

    Compares each copy with its fingerprint, then scans `root` again (never raising; a link
    or an odd type is reported by name) for protected items that are new, gone, replaced, or
    of another type. Sorted, without duplicates. Past `max_entries`, the rest of the tree is
    not looked at.
    """
    changed: set[str] = set()
    for bind in binds:
        if bind.kind == "hooks":
            changed.update(_hooks_changes(bind, max_entries))
        elif _file_changed(bind):
            changed.add(bind.rel)
    end = Scanner(plan.name, max_entries, strict=False).run(root, plan.extra)
    changed.update(end.seen.keys() - plan.seen.keys() - {b.rel for b in binds})
    changed.update(_moved(plan, root))
    return sorted({escape_name(f"{plan.name}/{rel}" if rel else plan.name) for rel in changed})


def _file_changed(bind: ProtectedBind) -> bool:
    before = bind.fingerprints.get("")
    return before is None or fingerprint_path(bind.source, before) != before


def _hooks_changes(bind: ProtectedBind, max_entries: int) -> set[str]:
    """Paths (relative to the mount root) added, removed or changed in a hooks copy."""
    now: dict[str, Fingerprint] = {}
    try:
        copy_fd = os.open(bind.source, DIR_FLAGS)
    except OSError:
        return {bind.rel}
    with closing(copy_fd):
        budget = [max_entries]
        tree_fingerprints(copy_fd, "", now, budget, bind.fingerprints, depth=0)
    if budget[0] < 0:
        return {bind.rel}
    names = {
        sub
        for sub in bind.fingerprints.keys() | now.keys()
        if bind.fingerprints.get(sub) != now.get(sub)
    }
    return {join(bind.rel, sub) for sub in names}


def _moved(plan: Plan, root: Path) -> set[str]:
    """Protected paths of the plan that are now gone, replaced or of another type."""
    try:
        root_fd = open_root(root)
    except OSError:
        return set(plan.seen)
    with closing(root_fd):
        return {
            rel
            for rel, before in plan.seen.items()
            if not _same_as(_stamp_at(root_fd, rel), before)
        }


def _same_as(now: Stamp | None, before: Stamp) -> bool:
    return now is not None and before.same(now)


def _stamp_at(root_fd: int, rel: str) -> Stamp | None:
    """The stamp of `rel`, reached through real directories only; None if that fails."""
    parts = rel.split("/")
    try:
        with walk(root_fd, parts[:-1]) as parent:
            info = lstat_at(parent, parts[-1])
    except (UnsafePath, FileNotFoundError, NotADirectoryError):
        return None
    return None if info is None else Stamp.of(info)
