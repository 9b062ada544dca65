"""The audit trail: typed entries journaled before the call that makes them returns, and
pages of the log read after everything queued so far (`corral.audit_writer`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from corral.audit import AuditLog, AuditPage
from corral.audit_entries import AdminAction, AuditEntry, ExecutionBegun
from corral.audit_writer import AuditWriter
from corral.errors import StateUnavailable

log = logging.getLogger(__name__)


class AuditTrail:
    """What every area writes to the audit log and the operator reads from it."""

    def __init__(self, audit: AuditLog, writer: AuditWriter) -> None:
        self.log = audit
        self.writer = writer

    def record(self, entry: AuditEntry) -> None:
        """Journal and queue one entry; a refusal is logged and never fails the caller's
        action."""
        try:
            self.writer.submit(entry)
        except StateUnavailable as exc:
            log.error("an audit entry (%s) was lost: %s", entry.TAG, exc)

    def begin(self, entry: ExecutionBegun) -> str:
        """Journal code about to be sent; its key. Raises `StateUnavailable` when the
        journal cannot be written: the code must then not be sent."""
        return self.writer.submit(entry)

    def admin(self, action: str, session_id: str, detail: Mapping[str, Any]) -> None:
        """The operator changed something of one session."""
        self.record(
            AdminAction(action=action, target=session_id, session=session_id, detail=detail)
        )

    async def page(
        self,
        *,
        kind: str | None = None,
        session: str | None = None,
        before_id: int | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
    ) -> AuditPage:
        """One page of the log, newest first, after the entries queued so far (read in a
        thread: a locked database never holds up the event loop)."""

        def read() -> AuditPage:
            self.writer.written()
            return self.log.query(
                kind=kind,
                session=session,
                since=since,
                until=until,
                before_id=before_id,
                limit=limit,
            )

        return await asyncio.to_thread(read)
