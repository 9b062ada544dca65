"""Per-session network policy, owned by the server: stored, applied live, asked for by agents.

`Network` keeps every session's `Policy` (from the store, else the configured default), runs
the `EgressProxy` that enforces it, and records agents' requests for access, which only the
operator can approve. Each change re-checks the session's open tunnels at once.
"""

from __future__ import annotations

import functools
import hashlib
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from corral.config import Settings
from corral.egress.ca import CertificateAuthority
from corral.egress.injection import Attached
from corral.egress.intercept import upstream_context
from corral.egress.protocol import Target
from corral.egress.proxy import (
    EgressProxy,
    ProxyLimits,
    Resolver,
    SecretHook,
    no_secrets,
    not_told,
    system_resolver,
)
from corral.egress.rules import Decision, Policy, make_policy, parse_entry
from corral.egress.vault import HeldSecret
from corral.errors import Conflict, InvalidInput, NotFound
from corral.sandbox.profile import EGRESS_SOCKET_NAME
from corral.store import NetRequest, Store

MAX_REQUEST_HOSTS = 20
# Identities of browser fetches (never a valid session id): they get the browsing policy.
BROWSER_PREFIX = "@browser-"
MAX_REASON_CHARS = 2000
DecisionLog = Callable[[str, Target, Decision], None]


@dataclass(frozen=True)
class NetworkStatus:
    """A session's policy and its proxy's counters (active, connections, refused, bytes)."""

    policy: Policy
    stats: Mapping[str, int]
    secrets: tuple[HeldSecret, ...] = ()  # what it holds; the proxy reads HTTPS to their hosts


@dataclass(frozen=True)
class PolicyChange:
    """A session's policy after a change, and how many open tunnels it closed."""

    policy: Policy
    tunnels_closed: int


class Network:
    """Policies, the proxy and access requests for one server."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        on_decision: DecisionLog,
        *,
        resolver: Resolver = system_resolver,
        secrets_for: Callable[[str], Mapping[bytes, Attached]] = no_secrets,
        on_secret: SecretHook = not_told,
    ) -> None:
        self.settings = settings
        self.store = store
        self.default = make_policy(settings.net_default, _split(settings.net_allow))
        self.browsing = make_policy(settings.browser_net, _split(settings.browser_allow))
        self.policies: dict[str, Policy] = {}
        self.tls = TrustFiles(settings.config_dir / "ca", settings.run_root / "egress-tls")
        extra_ca = Path(settings.egress_upstream_ca) if settings.egress_upstream_ca else None
        self.proxy = EgressProxy(
            self.policy,
            on_decision=on_decision,
            resolver=resolver,
            limits=ProxyLimits(
                max_connections=settings.egress_max_connections,
                idle_timeout_s=settings.egress_idle_timeout_s,
            ),
            secrets_for=secrets_for,
            on_secret=on_secret,
            ca=self.tls.authority,
            upstream_tls=upstream_context(extra_ca),
        )

    def open(self) -> None:
        for session_id, (mode, allow) in self.store.policies().items():
            self.policies[session_id] = make_policy(mode, allow)

    async def close(self) -> None:
        await self.proxy.close_all()

    def policy(self, session_id: str) -> Policy:
        if session_id.startswith(BROWSER_PREFIX):
            return self.browsing
        return self.policies.get(session_id, self.default)

    async def socket_for(self, session_id: str) -> Path:
        """The session's proxy socket on the host, listening once this returns.

        Each socket sits alone in a directory of its own, which is what a sandbox is shown;
        a session keeps its path (a pool kernel's, once renamed to it) for its whole life.
        """
        current = self.proxy.sessions.get(session_id)
        if current is not None:
            path = current.socket_path
        else:
            digest = hashlib.sha256(session_id.encode()).hexdigest()[:16]
            sockets = self.settings.run_root / "egress"
            sockets.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = sockets / digest / EGRESS_SOCKET_NAME
        await self.proxy.open(session_id, path)
        return path

    def reads_https(self, session_id: str) -> bool:
        """Whether the session's policy limits methods or paths somewhere (the proxy then
        reads HTTPS to those hosts, and the session's sandbox must trust corral's CA)."""
        return any(entry.http_level for entry in self.policy(session_id).entries)

    def trust_files(self) -> tuple[Path, Path]:
        """What a sandbox that holds secrets trusts (`TrustFiles.bundle`)."""
        return self.tls.bundle()

    def rename(self, old_id: str, new_id: str) -> None:
        """A warm pool kernel became session `new_id`: its socket now speaks for that
        session, under that session's policy, from the next connection on."""
        self.proxy.rename(old_id, new_id)

    async def forget(self, session_id: str) -> None:
        """The session is deleted: stop its proxy and drop its policy (a new session with the
        same name starts from the default)."""
        await self.proxy.close(session_id)
        self.policies.pop(session_id, None)
        await self.store.run(self.store.delete_policy, session_id)

    # -- changes by the operator -----------------------------------------------------------

    async def set(self, session_id: str, mode: str, allow: list[str]) -> tuple[Policy, int]:
        """Replace the session's policy (stored first); returns it and how many open tunnels
        were cut."""
        policy = make_policy(mode, allow)
        await self.store.run(self.store.put_policy, session_id, policy.mode, policy.allow)
        self.policies[session_id] = policy
        return policy, self.proxy.policy_changed(session_id)

    async def allow(self, session_id: str, hosts: list[str]) -> tuple[Policy, int]:
        """Add entries (a `none` session becomes an allowlist; `public` stays public)."""
        current = self.policy(session_id)
        mode = "allowlist" if current.mode == "none" else current.mode
        return await self.set(session_id, mode, [*current.allow, *hosts])

    async def deny(self, session_id: str, hosts: list[str]) -> tuple[Policy, int]:
        """Remove entries; removing the last one of an allowlist leaves an empty allowlist."""
        drop = {entry.text for host in hosts for entry in parse_entry(host)}
        current = self.policy(session_id)
        return await self.set(session_id, current.mode, [t for t in current.allow if t not in drop])

    # -- requests by the agent -------------------------------------------------------------

    async def request(self, session_id: str, hosts: list[str], reason: str) -> NetRequest:
        """Record an agent's request; it grants nothing until the operator approves it."""
        if not hosts or len(hosts) > MAX_REQUEST_HOSTS:
            raise InvalidInput(f"ask for 1 to {MAX_REQUEST_HOSTS} hosts")
        for host in hosts:
            parse_entry(host)
        reason = reason.strip()[:MAX_REASON_CHARS]
        request_id = await self.store.run(self.store.add_request, session_id, list(hosts), reason)
        return await self.get_request(request_id)

    async def requests(self, status: str | None = None) -> list[NetRequest]:
        if status not in (None, "pending", "approved", "rejected"):
            raise InvalidInput(f"unknown request status {status!r}")
        return await self.store.run(self.store.requests, status)

    async def get_request(self, request_id: int) -> NetRequest:
        for request in await self.store.run(self.store.requests):
            if request.id == request_id:
                return request
        raise NotFound(f"no network request {request_id}")

    async def decide(self, request_id: int, approve: bool) -> NetRequest:
        """The operator's answer; approving adds the hosts to the session's allowlist."""
        request = await self.get_request(request_id)
        if request.status != "pending":
            raise Conflict(f"request {request_id} is already {request.status}")
        if approve:
            await self.allow(request.session, request.hosts)
        decision = "approved" if approve else "rejected"
        await self.store.run(self.store.decide_request, request_id, decision)
        return await self.get_request(request_id)


class TrustFiles:
    """corral's CA, made on first use, and the files a sandbox that holds secrets trusts:
    the CA's certificate, and the system's roots with it in one bundle."""

    def __init__(self, ca_dir: Path, run_dir: Path) -> None:
        self.ca_dir = ca_dir
        self.run_dir = run_dir

    @functools.cache  # noqa: B019 - one per server, which lives as long as it
    def authority(self) -> CertificateAuthority:
        return CertificateAuthority.load_or_create(self.ca_dir, self.run_dir / "leaves")

    def bundle(self) -> tuple[Path, Path]:
        """(the bundle, the CA's certificate), written once per server; `CAUnavailable`."""
        ca = self.run_dir / "corral-ca.pem"
        bundle = self.run_dir / "ca-bundle.pem"
        if not bundle.exists():
            pem = self.authority().cert_pem
            ca.write_bytes(pem)
            roots = system_roots()
            bundle.write_bytes((roots.read_bytes() if roots else b"") + b"\n" + pem)
        return bundle, ca


def system_roots() -> Path | None:
    """The system's bundle of root certificates (what OpenSSL reads by default)."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _split(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]
