"""The operator's secrets and which sessions hold them (`corral.egress.vault` keeps the
references, `corral.egress.injection` puts values into requests).

Only the operator defines, removes, attaches and detaches secrets (admin routes, the CLI);
an agent never can. A session holds an attached secret as a placeholder in its options,
which its sandbox gets as the variable NAME at its next kernel start; the proxy looks the
placeholder up at each request, so removing or detaching counts from the next request.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.areas.trail import AuditTrail
from corral.audit_entries import AdminAction
from corral.egress.injection import Attached
from corral.egress.vault import (
    OPTION,
    HeldSecret,
    SecretRef,
    Source,
    Vault,
    checked,
    new_placeholder,
)
from corral.errors import InvalidInput, NotFound
from corral.kernels.session import Session
from corral.kernels.sessions import SessionManager
from corral.store import Store


@dataclass(frozen=True)
class SecretListing:
    """A secret's reference and the sessions that hold it."""

    name: str
    source: str
    location: str
    hosts: tuple[str, ...]
    created_at: float
    sessions: tuple[str, ...]


@dataclass(frozen=True)
class Attachment:
    """Whether a session holds a secret now, and whether its running kernels must restart
    for their environment to match."""

    session_id: str
    name: str
    attached: bool
    restart_needed: bool


class SecretService:
    def __init__(self, store: Store, sessions: SessionManager, trail: AuditTrail) -> None:
        self.store = store
        self.sessions = sessions
        self.trail = trail
        self.vault = Vault()

    def open(self) -> None:
        for name, source, location, hosts, created in self.store.secrets():
            kind: Source = "file" if source == "file" else "env"
            self.vault.put(SecretRef(name, kind, location, tuple(hosts), created))

    def listed(self) -> list[SecretListing]:
        return [self._listing(ref) for ref in self.vault.refs()]

    async def add(self, name: str, source: str, location: str, hosts: list[str]) -> SecretListing:
        """Define (or redefine) a secret; raises `InvalidInput`."""
        name, kind, location = checked(name, source, location, hosts)
        created = await self.store.run(self.store.put_secret, name, kind, location, hosts)
        ref = SecretRef(name, kind, location, tuple(hosts), created)
        self.vault.put(ref)
        self._audit("add_secret", name, {"source": kind, "hosts": hosts})
        return self._listing(ref)

    async def remove(self, name: str) -> None:
        """Forget a secret: detached from every session, refused from the next request."""
        self.vault.get(name)
        for session in self._holders(name):
            await self._drop(session, name)
        self.vault.drop(name)
        await self.store.run(self.store.delete_secret, name)
        self._audit("remove_secret", name, {})

    async def attach(self, session_id: str, name: str) -> Attachment:
        """Give a session the secret (its placeholder from the next kernel start)."""
        self.vault.get(name)
        session = self.sessions.session_for(session_id)
        held = dict(session.options.get(OPTION, {}))
        if name not in held:
            held[name] = new_placeholder()
            session.options[OPTION] = held
            await self.sessions.records.save_options(session)
        self.trail.admin("attach_secret", session.id, {"secret": name})
        return Attachment(session.id, name, True, session.run is not None)

    async def detach(self, session_id: str, name: str) -> Attachment:
        session = self.sessions.session_for(session_id)
        if name not in session.options.get(OPTION, {}):
            raise NotFound(f"session {session.id} does not hold secret {name!r}")
        await self._drop(session, name)
        self.trail.admin("detach_secret", session.id, {"secret": name})
        return Attachment(session.id, name, False, session.run is not None)

    def held(self, session_id: str) -> tuple[HeldSecret, ...]:
        """The secrets a session holds, by name, with their hosts (none for an unknown id)."""
        try:
            session = self.sessions.session(session_id)
        except (NotFound, InvalidInput):
            return ()
        names = sorted(n for n in session.options.get(OPTION, {}) if self.vault.holds(n))
        return tuple(HeldSecret(name, self.vault.get(name).hosts) for name in names)

    def held_by(self, session_id: str) -> dict[bytes, Attached]:
        """The session's secrets by placeholder, for the proxy (none for an unknown id)."""
        try:
            session = self.sessions.session(session_id)
        except (NotFound, InvalidInput):  # a browser's or a pool kernel's socket
            return {}
        return self.vault.attached(session.options.get(OPTION, {}))

    async def _drop(self, session: Session, name: str) -> None:
        held = dict(session.options.get(OPTION, {}))
        held.pop(name, None)
        if held:
            session.options[OPTION] = held
        else:
            session.options.pop(OPTION, None)
        await self.sessions.records.save_options(session)

    def _holders(self, name: str) -> list[Session]:
        found = []
        for info in self.sessions.list_sessions():
            session = self.sessions.session(info.id)
            if name in session.options.get(OPTION, {}):
                found.append(session)
        return found

    def _audit(self, action: str, name: str, detail: dict[str, object]) -> None:
        self.trail.record(AdminAction(action=action, target=name, detail=detail))

    def _listing(self, ref: SecretRef) -> SecretListing:
        holders = tuple(s.id for s in self._holders(ref.name))
        return SecretListing(ref.name, ref.source, ref.location, ref.hosts, ref.created_at, holders)
