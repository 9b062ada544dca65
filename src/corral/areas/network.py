"""Sessions' network policies as the operator changes them, and the agents' requests for
access (`corral.egress.network.Network` applies them to the proxy)."""

from __future__ import annotations

from collections.abc import Callable

from corral.areas.trail import AuditTrail
from corral.egress.network import Network, NetworkStatus, PolicyChange
from corral.egress.rules import Policy
from corral.egress.vault import HeldSecret
from corral.kernels.sessions import DEFAULT_SESSION, SessionManager
from corral.store import NetRequest


class NetworkService:
    """Policies (changed by the operator only, each change audited) and access requests
    (made by agents, decided by the operator)."""

    def __init__(
        self,
        egress: Network,
        sessions: SessionManager,
        trail: AuditTrail,
        held: Callable[[str], tuple[HeldSecret, ...]],
    ) -> None:
        self.egress = egress
        self.sessions = sessions
        self.trail = trail
        self.held = held  # a session's secrets (`SecretService.held`)

    def policy(self, session_id: str) -> NetworkStatus:
        """The session's policy, its proxy counters and the secrets it holds."""
        self._known(session_id)
        return NetworkStatus(
            self.egress.policy(session_id),
            self.egress.proxy.stats(session_id),
            self.held(session_id),
        )

    async def set(self, session_id: str, mode: str, allow: list[str]) -> PolicyChange:
        self._known(session_id)
        changed = await self.egress.set(session_id, mode, allow)
        return self._changed(session_id, "set_network", *changed)

    async def allow(self, session_id: str, hosts: list[str]) -> PolicyChange:
        self._known(session_id)
        changed = await self.egress.allow(session_id, hosts)
        return self._changed(session_id, "allow_network", *changed)

    async def deny(self, session_id: str, hosts: list[str]) -> PolicyChange:
        self._known(session_id)
        changed = await self.egress.deny(session_id, hosts)
        return self._changed(session_id, "deny_network", *changed)

    async def request_access(
        self, session_id: str | None, hosts: list[str], reason: str
    ) -> NetRequest:
        """An agent asks; the request waits for the operator and grants nothing by itself."""
        session = self.sessions.session_for(session_id).record.id
        return await self.egress.request(session, hosts, reason)

    async def requests(self, status: str | None = None) -> list[NetRequest]:
        return await self.egress.requests(status)

    async def decide(self, request_id: int, approve: bool) -> NetRequest:
        if approve:
            self._known((await self.egress.get_request(request_id)).session)
        request = await self.egress.decide(request_id, approve)
        self.trail.admin(
            "approve_network" if approve else "reject_network",
            request.session,
            {"request": request_id, "hosts": request.hosts},
        )
        return request

    def _known(self, session_id: str) -> None:
        if session_id != DEFAULT_SESSION:
            self.sessions.session(session_id)

    def _changed(self, session_id: str, action: str, policy: Policy, cut: int) -> PolicyChange:
        change = PolicyChange(policy, cut)
        self.trail.admin(
            action, session_id, {"mode": policy.mode, "allow": policy.allow, "tunnels_closed": cut}
        )
        return change
