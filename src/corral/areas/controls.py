"""The operator's switches on one session: its limits and its SSH agent bridge
(`corral.controls` applies them to the session and its running sandboxes); and what the
warm pool holds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from corral.areas.trail import AuditTrail
from corral.controls import BridgeReport, LimitsReport, change_limits, limits_report, switch_bridge
from corral.kernels.pool import PoolStatus
from corral.kernels.sessions import SessionManager


class ControlService:
    """Limits and the bridge, each change audited; `mechanism` names what enforces limits."""

    def __init__(self, sessions: SessionManager, mechanism: str, trail: AuditTrail) -> None:
        self.sessions = sessions
        self.mechanism = mechanism
        self.trail = trail

    def pool(self) -> PoolStatus:
        return self.sessions.pool.status()

    def limits(self, session_id: str) -> LimitsReport:
        """A session's limits, the mechanism enforcing them, and its usage."""
        return limits_report(self.sessions.session_for(session_id), self.mechanism)

    async def set_limits(self, session_id: str, changes: dict[str, Any]) -> LimitsReport:
        """Change a session's limits; running sandboxes change at once where they can, the
        rest (the tmpfs size) from their next start. Raises `InvalidInput` for an unknown or
        bad value, `LimitRefused` when the kernel refuses."""
        session = self.sessions.session_for(session_id)
        live = change_limits(session, changes)
        await self.sessions.records.save_options(session)
        self.trail.admin("set_limits", session_id, {"changes": changes})
        return replace(
            limits_report(session, self.mechanism),
            changed_now=tuple(sorted(live)),
            changed_at_next_start=tuple(sorted(set(changes) - live)),
        )

    async def set_bridge(self, session_id: str, enabled: bool) -> BridgeReport:
        """Enable or disable a session's SSH agent bridge. It takes effect when the
        session's kernels next start; the report says whether a restart is needed."""
        session = self.sessions.session_for(session_id)
        report = switch_bridge(session, enabled)
        await self.sessions.records.save_options(session)
        self.trail.admin("set_bridge", session_id, {"ssh_agent": enabled})
        return report
