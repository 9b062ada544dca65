"""Naming the session limit that stopped a piece of code, in its result.

The limit box's counters are read before and after each execution; an OOM kill or a refused
fork in between, a MemoryError, or a full or capped file (ENOSPC, EFBIG, the disk watch)
becomes the result's `limit` and a sentence in its message.
"""

from __future__ import annotations

import errno

from corral.kernels.results import ExecutionResult, Limit
from corral.sandbox.boxes import Counters, LimitBox, describe_hit
from corral.sandbox.limits import Limits


def counters(box: LimitBox | None) -> Counters:
    """The box's counters now; zeros when the session has no running box."""
    return box.counters() if box is not None else Counters()


def attribute_limit(
    result: ExecutionResult, before: Counters, after: Counters, limits: Limits
) -> None:
    """Name the limit that stopped the code: an OOM kill, a refused fork, MemoryError."""
    hit: Limit | None = None
    if after.oom_kills > before.oom_kills:
        hit = "memory"
    elif after.task_refusals > before.task_refusals:
        hit = "tasks"
    elif result.error is not None and result.error.ename == "MemoryError":
        hit = "memory"
    elif result.limit == "disk" or _disk_full(result):
        hit = "disk"
    if hit is None:
        return
    result.limit = hit
    note = describe_hit(hit, limits)
    result.message = f"{note}; {result.message}" if result.message else note


def _disk_full(result: ExecutionResult) -> bool:
    """The code failed on a full filesystem (ENOSPC) or a file past the size limit (EFBIG)."""
    text = result.error.evalue if result.error is not None else ""
    return any(f"[Errno {code}]" in text for code in (errno.ENOSPC, errno.EFBIG))
