"""Memory of a process tree: PSS, USS and RSS summed over a process and its descendants."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

MIB = 1024 * 1024


@dataclass(frozen=True)
class TreeMemory:
    """Bytes summed over every process of one tree that was alive when it was read."""

    pss: int
    uss: int
    rss: int
    processes: int


def tree_memory(pid: int) -> TreeMemory:
    """PSS, USS and RSS of `pid` plus all its descendants (`children(recursive=True)`).

    A descendant that exits while the tree is read is skipped. Raises `psutil.NoSuchProcess`
    when `pid` itself is gone and `psutil.AccessDenied` when smaps cannot be read.
    """
    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    pss = uss = rss = count = 0
    for process in tree:
        try:
            info = process.memory_full_info()
        except psutil.NoSuchProcess:
            if process is root:
                raise
            continue
        pss += info.pss
        uss += info.uss
        rss += info.rss
        count += 1
    return TreeMemory(pss=pss, uss=uss, rss=rss, processes=count)
