"""The one API of corral: REST, MCP and the CLI are thin callers of `Service`.

`Service` is the composition root: its constructor builds every part once, each given what
it needs (nothing is assigned into a part afterwards), and its async context opens and
closes them in order. It owns sessions and execution itself; the other areas are its
attributes, each a class of one concept (`corral.areas`): `files`, `network`, `skills`,
`controls`, `audit`, and `browser` (`corral.browser.fetch.Browser`). Errors are
`corral.errors` classes; the edges map them to their own forms.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from operator import attrgetter
from types import TracebackType
from typing import Any

from corral.areas.controls import ControlService
from corral.areas.executions import ExecutionService
from corral.areas.files import FileService
from corral.areas.network import NetworkService
from corral.areas.secrets import SecretService
from corral.areas.skills import SkillService
from corral.areas.trail import AuditTrail
from corral.audit import AuditLog
from corral.audit_entries import (
    Event,
    SessionChanged,
)
from corral.audit_writer import AuditWriter
from corral.browser.fetch import Browser
from corral.config import Settings
from corral.egress.injection import Attached
from corral.egress.network import Network
from corral.egress.protocol import Target
from corral.egress.proxy import Resolver
from corral.egress.rules import Decision
from corral.errors import SessionNotFound
from corral.executions import ExecutionRegistry
from corral.kernels.results import NetRefusal
from corral.kernels.sessions import (
    DEFAULT_SESSION,
    SessionInfo,
    SessionManager,
    validate_session_id,
)
from corral.owner import StateLock
from corral.sandbox.host import SandboxHost
from corral.session_events import SessionEvent, SessionEvents
from corral.skills import PUBLIC_DIR, user_dir
from corral.skills.catalog import SkillCatalog
from corral.store import Store

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 30  # for the calls still held at close to end once their kernels stopped


class Service:
    """One corral server's parts, built here; sessions and execution are its own methods."""

    def __init__(self, settings: Settings, *, resolver: Resolver | None = None) -> None:
        self.settings = settings
        # Never two services on one state: opening resets what the owner holds there.
        self.owner = StateLock(settings.state_dir)
        store = Store(settings.db_path)
        # Every entry is journaled before the call that makes it returns, then written by one
        # thread in order: a slow or locked database never holds up the event loop, and a
        # crash of the server loses no entry (`corral.audit_writer`).
        self._audit_log = AuditLog(settings.db_path)
        self._audit_writer = AuditWriter(self._audit_log, settings.audit_journal_path)
        self.audit = AuditTrail(self._audit_log, self._audit_writer)
        self.egress = Network(
            settings,
            store,
            self._on_decision,
            secrets_for=self._secrets_held,
            on_secret=self._on_secret,
            **({"resolver": resolver} if resolver else {}),
        )
        self.host = SandboxHost(settings)
        self.sessions = SessionManager(
            settings,
            host=self.host,
            store=store,
            egress=self.egress,
            on_event=self._on_kernel_event,
        )
        self.browser = Browser(settings, self.host, self.egress)
        self.session_events = SessionEvents()
        self.executions = ExecutionService(
            self.sessions,
            self.audit,
            self.session_events,
            ExecutionRegistry(settings.execution_keep_s, settings.execution_keep_count),
            keep_bytes=settings.max_output_bytes,
        )
        self.files = FileService(self.sessions, settings.max_upload_bytes)
        self.skills = SkillService(
            SkillCatalog(PUBLIC_DIR, user_dir(settings.config_dir)),
            user_dir(settings.config_dir),
            self.audit,
        )
        self.controls = ControlService(self.sessions, self.host.mechanism.name, self.audit)
        self.secrets = SecretService(store, self.sessions, self.audit)
        self.network = NetworkService(self.egress, self.sessions, self.audit, self.secrets.held)

    @property
    def kernel_start_failure(self) -> str | None:
        """Why the last kernel start failed, until one succeeds (for `/health`)."""
        return self.sessions.kernels.last_start_failure

    async def __aenter__(self) -> Service:
        self.owner.acquire()  # raises StateOwned before anything of the owner's is touched
        try:
            recovery = await asyncio.to_thread(self._audit_writer.open)
            if recovery.unclean:
                log.warning(
                    "the last run of the server stopped without closing: %d executions it ran "
                    "are marked interrupted in the audit log",
                    recovery.interrupted,
                )
            self.egress.open()
            self.secrets.open()
            await self.sessions.open()
        except BaseException:
            self.owner.release()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.sessions.calls.begin_shutdown()  # queued calls refused, not run on a closed service
        await self.sessions.close()
        await self.executions.wait_for_running()
        await self.egress.close()
        await asyncio.to_thread(self._audit_writer.close)
        self._audit_log.close()
        self.owner.release()

    # -- execution -----------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """The server is stopping: interrupt running calls, refuse queued and new ones, and
        end the session event streams (so that no connection holds the shutdown up)."""
        self.sessions.calls.begin_shutdown()
        self.session_events.close()

    # -- sessions --------------------------------------------------------------------------

    async def create_session(
        self, session_id: str | None = None, *, actor: str = "agent", mounts: Sequence[str] = ()
    ) -> SessionInfo:
        """A new session, or a stopped one started again (audited as `started`)."""
        if session_id is not None:  # "" or 0 is a bad id, not "choose one for me"
            validate_session_id(session_id)
        known = session_id is not None and self.sessions.exists(session_id)
        info = await self.sessions.create(session_id, mounts=mounts)
        self._audit_session(info.id, "started" if known else "created", actor)
        return info

    async def start_session(self, session_id: str, *, actor: str = "agent") -> SessionInfo:
        info = await self.sessions.start(session_id)
        self._audit_session(info.id, "started", actor)
        return info

    def list_sessions(self) -> list[SessionInfo]:
        return self.sessions.list_sessions()

    def active_sessions(self) -> list[SessionInfo]:
        """coderunner's list: the open named sessions (not the default one), by id."""
        listed = self.sessions.list_sessions()
        return sorted(
            (s for s in listed if s.open and s.id != DEFAULT_SESSION), key=attrgetter("id")
        )

    def get_session(self, session_id: str) -> SessionInfo:
        return self.sessions.session(session_id).info()

    async def stop_session(
        self, session_id: str, *, actor: str = "agent", only_open: bool = False
    ) -> SessionInfo:
        """Stop and close a session (`SessionNotFound` for a closed one with `only_open`,
        as coderunner's stop answers)."""
        info = await self.sessions.stop(session_id, only_open=only_open)
        self._audit_session(info.id, "stopped", actor)
        return info

    async def admin_stop_session(self, session_id: str) -> SessionInfo:
        """The operator stops any session: a session event and an admin action."""
        info = await self.stop_session(session_id, actor="admin")
        self.audit.admin("stop_session", session_id, {})
        return info

    async def restart_session(self, session_id: str, *, actor: str = "agent") -> SessionInfo:
        info = await self.sessions.restart(session_id)
        self._audit_session(info.id, "restarted", actor)
        return info

    async def delete_session(self, session_id: str, *, actor: str = "agent") -> None:
        await self.sessions.delete(session_id)
        self._audit_session(session_id, "deleted", actor)

    def _audit_session(self, session_id: str, event: str, actor: str) -> None:
        self.audit.record(SessionChanged(session=session_id, event=event, actor=actor))
        self.session_events.publish(session_id, event, actor=actor)

    def follow_session(
        self, session_id: str, after: int = 0, idle_s: float | None = None
    ) -> AsyncIterator[SessionEvent | None]:
        """The session's status events after number `after` (`corral.session_events`);
        raises `SessionNotFound` now for a session that does not exist. The default session
        can be followed before its first use, but not once deleted, like any other."""
        if session_id != DEFAULT_SESSION:
            self.sessions.session(session_id)  # SessionNotFound now, not in the stream
        if self.session_events.deleted(session_id):
            raise SessionNotFound(session_id)
        return self.session_events.follow(session_id, after, idle_s)

    def _on_kernel_event(
        self, kind: str, session_id: str, action: str, detail: dict[str, Any]
    ) -> None:
        """What the kernel factory reports (the bridge used, protected files changed):
        published to the session's watchers and audited."""
        self.session_events.publish(session_id, kind, action=action, detail=detail)
        actor = "agent" if kind == "bridge" else "system"
        self.audit.record(
            Event(kind=kind, actor=actor, action=action, session=session_id, detail=detail)
        )

    def _secrets_held(self, session_id: str) -> Mapping[bytes, Attached]:
        """The proxy asks, at each plain-HTTP request, for the session's secrets."""
        return self.secrets.held_by(session_id)

    def _on_secret(
        self, session_id: str, target: Target, names: tuple[str, ...], refused: str | None
    ) -> None:
        """Secrets were put into a request, or a request carrying one was refused (maybe
        an attempt to walk it out): audited by name, never by value."""
        self.audit.record(
            Event(
                kind="network",
                actor="agent",
                action="secret_refused" if refused else "secret",
                session=session_id,
                target=f"{target.host}:{target.port}",
                detail={"secrets": list(names), **({"reason": refused} if refused else {})},
            )
        )

    def _on_decision(self, session_id: str, target: Target, decision: Decision) -> None:
        """The proxy decided a connection: the browser and the running call are told of a
        refusal, and every decision is audited."""
        self.browser.note_decision(session_id, target, decision)
        if not decision.allowed:
            where = f"{target.host}:{target.port}"
            self.sessions.note_refusal(session_id, NetRefusal(where, target.host, decision.rule))
        self.audit.record(
            Event(
                kind="network",
                actor="agent",
                action="allow" if decision.allowed else "deny",
                session=session_id,
                target=f"{target.host}:{target.port}",
                detail={
                    "host": target.host,
                    "port": target.port,
                    "allowed": decision.allowed,
                    "address": str(decision.address) if decision.address else None,
                    "rule": decision.rule,
                },
            )
        )
