"""A session's timeline: its executions with their output, and the audit log's entries of
the session (network decisions, session changes, the operator's actions) between them.

Executions the server still keeps (`corral.executions`: the running ones and the newest
ended ones) come with their output as it arrives; older ones come from the audit log, with
their code, status and duration (their output was never stored there). An audit entry of an
execution at or after the oldest kept execution's start is that execution, shown once.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.audit import AuditEntry
from corral.execution import Execution
from corral.service import Service

SHOWN_ENTRIES = 200


@dataclass(frozen=True)
class Item:
    """One row of the timeline: a kept execution, or an audit entry."""

    at: float
    execution: Execution | None = None
    entry: AuditEntry | None = None


async def timeline(service: Service, session_id: str) -> tuple[list[Item], int]:
    """The session's items, oldest first, and the newest audit entry id among them (the
    live stream shows entries after it)."""
    kept = service.executions.listed(session_id)
    page = await service.audit.page(session=session_id, limit=SHOWN_ENTRIES)
    horizon = min((e.created_at for e in kept), default=float("inf"))
    items = [Item(e.created_at, execution=e) for e in kept]
    items += [Item(entry.at, entry=entry) for entry in page.entries if _shown(entry, horizon)]
    items.sort(key=lambda item: item.at)
    last = max((entry.id for entry in page.entries), default=0)
    return items, last


def _shown(entry: AuditEntry, horizon: float) -> bool:
    return entry.kind != "execution" or entry.at < horizon


async def entries_after(
    service: Service, session_id: str, after_id: int
) -> tuple[list[AuditEntry], int]:
    """The session's audit entries past `after_id`, oldest first, except executions (the
    live stream shows those from the executions themselves), and the newest id seen."""
    page = await service.audit.page(session=session_id, limit=SHOWN_ENTRIES)
    fresh = [e for e in page.entries if e.id > after_id and e.kind != "execution"]
    newest = max((e.id for e in page.entries), default=after_id)
    return sorted(fresh, key=lambda e: e.id), max(newest, after_id)
