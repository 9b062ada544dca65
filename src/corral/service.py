"""The one API of corral: REST, MCP and the CLI are thin callers of `Service`.

It owns the session manager, the audit log and the workspace file API, and turns their
lifecycle into an async context manager. Errors it raises are `corral.errors` classes; the
edges map them to their own forms.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from pathlib import Path
from types import TracebackType
from typing import Any

from corral.audit import AuditLog, AuditPage
from corral.audit_entries import (
    AdminAction,
    AuditEntry,
    Event,
    ExecutionBegun,
    ExecutionEnded,
    SessionChanged,
)
from corral.audit_writer import AuditWriter
from corral.browser.fetch import Browser, PageResult
from corral.config import Settings
from corral.controls import BridgeReport, LimitsReport, change_limits, limits_report, switch_bridge
from corral.egress.network import Network, NetworkStatus, PolicyChange
from corral.egress.protocol import Target
from corral.egress.proxy import Resolver
from corral.egress.rules import Decision, Policy
from corral.errors import CorralError, SessionNotFound, StateUnavailable, StorageFull
from corral.execution import Execution
from corral.executions import ExecutionRegistry
from corral.files import FileEntry, Listing, Workspace
from corral.kernels.results import ExecutionResult, NetRefusal
from corral.kernels.sessions import (
    DEFAULT_SESSION,
    Session,
    SessionInfo,
    SessionManager,
    check_timeout,
    validate_language,
    validate_session_id,
)
from corral.owner import StateLock
from corral.sandbox.limits import format_size
from corral.session_events import SessionEvent, SessionEvents
from corral.skills import PUBLIC_DIR, user_dir
from corral.skills.archive import unpack_skill_zip
from corral.skills.catalog import SkillCatalog, SkillFile, SkillInfo, SkillListing
from corral.store import NetRequest

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 30  # for the calls still held at close to end once their kernels stopped


@dataclass(frozen=True)
class Call:
    """What one execution asked for, checked: its code, language, timeout and caller."""

    code: str
    language: str
    timeout_s: float | None
    actor: str


class Service:
    """Sessions, execution, files and the audit log for one corral server (or CLI command)."""

    def __init__(self, settings: Settings, *, resolver: Resolver | None = None) -> None:
        self.settings = settings
        # Never two services on one state: opening resets what the owner holds there.
        self.owner = StateLock(settings.state_dir)
        self.sessions = SessionManager(settings)
        self.audit = AuditLog(settings.db_path)
        # Every entry is journaled before the call that makes it returns, then written by one
        # thread in order: a slow or locked database never holds up the event loop, and a
        # crash of the server loses no entry (`corral.audit_writer`).
        self._audit_writer = AuditWriter(self.audit, settings.audit_journal_path)
        self.network = Network(
            settings,
            self.sessions.store,
            self._audit_decision,
            **({"resolver": resolver} if resolver else {}),
        )
        self.sessions.factory.egress = self.network
        self.sessions.factory.on_event = self._audit_event
        self.browser = Browser(settings, self.sessions.factory, self.network)
        self.skills = SkillCatalog(PUBLIC_DIR, user_dir(settings.config_dir))
        self.session_events = SessionEvents()
        self.executions = ExecutionRegistry(
            settings.execution_keep_s, settings.execution_keep_count
        )

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
            self.network.open()
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
        self.sessions.begin_shutdown()  # queued calls are refused, not run on a closed service
        await self.sessions.close()
        await self._wait_for_executions()
        await self.network.close()
        await asyncio.to_thread(self._audit_writer.close)
        self.audit.close()
        self.owner.release()

    # -- execution -----------------------------------------------------------------------

    def start_execution(
        self,
        code: str,
        *,
        session_id: str | None = None,
        language: str = "python",
        timeout_s: float | None = None,
        actor: str = "agent",
        resume: bool = True,
    ) -> Execution:
        """Start running code in a session (the default one when `session_id` is None).

        The request is checked first, each thing once, before any kernel starts: the
        language, the timeout, and the session (a named one must exist; a stopped one is
        started again, or refused with `SessionClosed` when `resume` is False, as
        coderunner's routes and the MCP tools ask; the default one is made on first use).
        A failed check raises here (`InvalidInput`, `SessionNotFound`, `SessionClosed`).
        The call then queues behind the session's earlier ones; its result is audited when
        it ends. See `corral.execution` for events, cancel and a caller that goes away.
        """
        call = Call(code, validate_language(language), check_timeout(timeout_s), actor)
        session = self.sessions.session_for(session_id, resume=resume)
        execution = Execution(
            functools.partial(self._run, session, call),
            self.sessions.cancel,
            session_id=session.id,
            keep_bytes=self.settings.max_output_bytes,
            on_end=self.executions.ended,
        )
        self.executions.add(execution)
        return execution

    async def _run(self, session: Session, call: Call, execution: Execution) -> ExecutionResult:
        """The execution's whole call: its turn in the session's queue, the kernel, the
        audit entry written before the code is sent and completed once it ended."""
        result = await self.sessions.execute(
            session,
            call.code,
            language=call.language,
            timeout_s=call.timeout_s,
            on_output=execution.note,
            before_send=functools.partial(self._journal_before_sending, execution, call),
        )
        if execution.audit_key is not None:
            self._audit(
                ExecutionEnded(
                    begun=execution.audit_key,
                    status=result.status,
                    duration_s=result.duration_s,
                    output_bytes=result.output_bytes,
                )
            )
            self._publish_end(execution.id, result)
        return result

    def _journal_before_sending(
        self, execution: Execution, call: Call, result: ExecutionResult
    ) -> None:
        """The code is about to be sent: its audit entry first. Raises `StateUnavailable`
        when the journal cannot be written: the code is then not sent, since nothing would
        say it ran."""
        execution.audit_key = self._audit_writer.submit(
            ExecutionBegun(
                session=result.session_id,
                language=call.language,
                code=call.code,
                actor=call.actor,
                at=result.started_at,
            )
        )
        execution.running = True  # journaled: the code is sent now
        self.session_events.publish(
            result.session_id, "busy", execution=execution.id, language=call.language
        )

    def _publish_end(self, execution_id: str, result: ExecutionResult) -> None:
        """What a watcher of the session learns when code ends: idle, and what struck."""
        publish = functools.partial(self.session_events.publish, result.session_id)
        if result.status == "died":
            publish("kernel_died", execution=execution_id)
        if result.kernel_restarted:
            publish("kernel_restarted", execution=execution_id)
        if result.limit is not None:
            publish("limit", execution=execution_id, limit=result.limit, message=result.message)
        publish("idle", execution=execution_id, status=result.status)

    async def execute(
        self,
        code: str,
        *,
        session_id: str | None = None,
        language: str = "python",
        timeout_s: float | None = None,
        actor: str = "agent",
        resume: bool = True,
    ) -> ExecutionResult:
        """`start_execution`, then its result (for callers that need no events)."""
        execution = self.start_execution(
            code,
            session_id=session_id,
            language=language,
            timeout_s=timeout_s,
            actor=actor,
            resume=resume,
        )
        return await execution.result()

    def begin_shutdown(self) -> None:
        """The server is stopping: interrupt running calls, refuse queued and new ones, and
        end the session event streams (so that no connection holds the shutdown up)."""
        self.sessions.begin_shutdown()
        self.session_events.close()

    async def _wait_for_executions(self) -> None:
        """At close, after the kernels stopped: every call still held ends promptly (as
        died, or refused), and one that does not within `CLOSE_WAIT_S` is cancelled."""
        for execution in self.executions.running():
            if not await execution.wait(CLOSE_WAIT_S):
                log.warning(
                    "an execution had not ended %g s after its kernel stopped", CLOSE_WAIT_S
                )
                execution.abandon()
                await execution.wait()

    def _audit(self, entry: AuditEntry) -> None:
        """Journal and queue one audit entry; a refusal is logged and never lets the
        caller's action fail."""
        try:
            self._audit_writer.submit(entry)
        except StateUnavailable as exc:
            log.error("an audit entry (%s) was lost: %s", entry.TAG, exc)

    # -- sessions --------------------------------------------------------------------------

    async def create_session(
        self, session_id: str | None = None, *, actor: str = "agent", mounts: Sequence[str] = ()
    ) -> SessionInfo:
        """A new session, or a stopped one started again (audited as `started`)."""
        if session_id is not None:  # "" or 0 is a bad id, not "choose one for me"
            validate_session_id(session_id)
        known = self.sessions.sessions.get(session_id) if session_id is not None else None
        info = await self.sessions.create(session_id, mounts=mounts)
        self._audit_session(info.id, "started" if known is not None else "created", actor)
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
        return self.sessions.get(session_id)

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
        self._audit_admin("stop_session", session_id, {})
        return info

    async def restart_session(self, session_id: str, *, actor: str = "agent") -> SessionInfo:
        info = await self.sessions.restart(session_id)
        self._audit_session(info.id, "restarted", actor)
        return info

    async def delete_session(self, session_id: str, *, actor: str = "agent") -> None:
        await self.sessions.delete(session_id)
        self._audit_session(session_id, "deleted", actor)

    def _audit_session(self, session_id: str, event: str, actor: str) -> None:
        self._audit(SessionChanged(session=session_id, event=event, actor=actor))
        self.session_events.publish(session_id, event, actor=actor)

    def follow_session(
        self, session_id: str, after: int = 0, idle_s: float | None = None
    ) -> AsyncIterator[SessionEvent | None]:
        """The session's status events after number `after` (`corral.session_events`);
        raises `SessionNotFound` now for a session that does not exist. The default session
        can be followed before its first use, but not once deleted, like any other."""
        self._known(session_id)
        if self.session_events.deleted(session_id):
            raise SessionNotFound(session_id)
        return self.session_events.follow(session_id, after, idle_s)

    # -- files -----------------------------------------------------------------------------

    def workspace(self, session_id: str | None) -> Workspace:
        """The file API of a session's workspace (the default session's when None)."""
        info = self.sessions.session_for(session_id).info()
        return Workspace(info.workspace, max_file_bytes=self.settings.max_upload_bytes)

    def list_files(
        self, session_id: str | None, path: str = ".", *, recursive: bool = False
    ) -> Listing:
        return self.workspace(session_id).list(path, recursive=recursive)

    def read_file(self, session_id: str | None, path: str) -> bytes:
        return self.workspace(session_id).read(path)

    def write_file(self, session_id: str | None, path: str, data: bytes) -> FileEntry:
        """Write a workspace file; refused (`StorageFull`) when it would take the session
        past its workspace limit."""
        session = self.sessions.session_for(session_id)
        workspace = self.workspace(session_id)
        replaced = _size_of_file(workspace, path)  # an overwrite frees what it replaces
        room_bytes, room_files = session.disk.room()
        if len(data) - replaced > room_bytes or (replaced == 0 and room_files < 1):
            limits = session.limits
            raise StorageFull(
                f"{path!r} ({format_size(len(data))}) does not fit: the workspace holds at most "
                f"{format_size(limits.workspace_bytes)} and {limits.workspace_files} files, "
                f"and {format_size(max(0, room_bytes))} are left; delete files to make room"
            )
        entry = workspace.write(path, data)
        session.disk.added(len(data) - replaced)
        return entry

    def delete_file(self, session_id: str | None, path: str, *, recursive: bool = False) -> None:
        self.workspace(session_id).delete(path, recursive=recursive)
        self.sessions.session_for(session_id).disk.look_soon()

    async def set_bridge(self, session_id: str, enabled: bool) -> BridgeReport:
        """Enable or disable a session's SSH agent bridge (admin). It takes effect when the
        session's kernels next start; the report says whether a restart is needed."""
        session = self.sessions.session_for(session_id)
        report = switch_bridge(session, enabled)
        await self.sessions.save_options(session)
        self._audit_admin("set_bridge", session_id, {"ssh_agent": enabled})
        return report

    def _audit_event(self, kind: str, session_id: str, action: str, detail: dict[str, Any]) -> None:
        self.session_events.publish(session_id, kind, action=action, detail=detail)
        actor = "agent" if kind == "bridge" else "system"
        self._audit(Event(kind=kind, actor=actor, action=action, session=session_id, detail=detail))

    # -- skills ------------------------------------------------------------------------------

    async def list_skills(self) -> SkillListing:
        """Every skill (user archives unpacked first) and the archives set aside."""
        return await asyncio.to_thread(self.skills.listing)

    async def skill_info(self, name: str) -> SkillInfo:
        return await asyncio.to_thread(self.skills.info, name)

    async def skill_file(self, name: str, filename: str) -> bytes:
        return await asyncio.to_thread(self.skills.file, name, filename)

    async def skill_text_file(self, name: str, filename: str) -> SkillFile:
        """A skill's file as UTF-8 text (`InvalidInput` when it is not), for the agent."""
        return await asyncio.to_thread(self.skills.text_file, name, filename)

    async def add_skill(self, archive_name: str, data: bytes) -> Path:
        """Unpack a skill archive (the operator's) into the user's skills, with every check
        of `unpack_skill_zip`; returns the skill's folder. Raises `ArchiveRefused`."""
        folder = user_dir(self.settings.config_dir)
        added = await asyncio.to_thread(_unpack_skill, data, archive_name, folder)
        self._audit(
            AdminAction(action="add_skill", target=added.name, detail={"archive": archive_name})
        )
        return added

    # -- browser -----------------------------------------------------------------------------

    async def fetch_page(
        self, url: str, *, screenshot: bool = False, timeout_s: float | None = None
    ) -> PageResult:
        """Load a web page in a sandboxed browser under the browsing policy."""
        return await self.browser.fetch(url, screenshot=screenshot, timeout_s=timeout_s)

    # -- limits ------------------------------------------------------------------------------

    def session_limits(self, session_id: str) -> LimitsReport:
        """A session's limits, the mechanism enforcing them, and its usage (admin)."""
        session = self.sessions.session_for(session_id)
        return limits_report(session, self.sessions.factory.mechanism.name)

    async def set_session_limits(self, session_id: str, changes: dict[str, Any]) -> LimitsReport:
        """Change a session's limits (admin); running sandboxes change at once where they
        can, the rest (the tmpfs size) from their next start. Raises `InvalidInput` for an
        unknown or bad value, `LimitRefused` when the kernel refuses."""
        session = self.sessions.session_for(session_id)
        live = change_limits(session, changes)
        await self.sessions.save_options(session)
        self._audit_admin("set_limits", session_id, {"changes": changes})
        report = limits_report(session, self.sessions.factory.mechanism.name)
        return replace(
            report,
            changed_now=tuple(sorted(live)),
            changed_at_next_start=tuple(sorted(set(changes) - live)),
        )

    # -- network -----------------------------------------------------------------------------

    def network_policy(self, session_id: str) -> NetworkStatus:
        """The session's policy and its proxy counters."""
        self._known(session_id)
        return NetworkStatus(self.network.policy(session_id), self.network.proxy.stats(session_id))

    async def set_network(self, session_id: str, mode: str, allow: list[str]) -> PolicyChange:
        self._known(session_id)
        changed = await self.network.set(session_id, mode, allow)
        return self._changed(session_id, "set_network", *changed)

    async def allow_network(self, session_id: str, hosts: list[str]) -> PolicyChange:
        self._known(session_id)
        changed = await self.network.allow(session_id, hosts)
        return self._changed(session_id, "allow_network", *changed)

    async def deny_network(self, session_id: str, hosts: list[str]) -> PolicyChange:
        self._known(session_id)
        changed = await self.network.deny(session_id, hosts)
        return self._changed(session_id, "deny_network", *changed)

    async def request_network_access(
        self, session_id: str | None, hosts: list[str], reason: str
    ) -> NetRequest:
        """An agent asks; the request waits for the operator and grants nothing by itself."""
        session = self.sessions.session_for(session_id).record.id
        return await self.network.request(session, hosts, reason)

    async def network_requests(self, status: str | None = None) -> list[NetRequest]:
        return await self.network.requests(status)

    async def decide_network_request(self, request_id: int, approve: bool) -> NetRequest:
        if approve:
            self._known((await self.network.get_request(request_id)).session)
        request = await self.network.decide(request_id, approve)
        self._audit_admin(
            "approve_network" if approve else "reject_network",
            request.session,
            {"request": request_id, "hosts": request.hosts},
        )
        return request

    def _known(self, session_id: str) -> None:
        if session_id != DEFAULT_SESSION:
            self.sessions.get(session_id)

    def _changed(self, session_id: str, action: str, policy: Policy, cut: int) -> PolicyChange:
        change = PolicyChange(policy, cut)
        self._audit_admin(action, session_id, change.to_dict())
        return change

    def _audit_admin(self, action: str, session_id: str, detail: dict[str, Any]) -> None:
        self._audit(
            AdminAction(action=action, target=session_id, session=session_id, detail=detail)
        )

    def _audit_decision(self, session_id: str, target: Target, decision: Decision) -> None:
        self.browser.note_decision(session_id, target, decision)
        if not decision.allowed:
            where = f"{target.host}:{target.port}"
            self.sessions.note_refusal(session_id, NetRefusal(where, target.host, decision.rule))
        self._audit(
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

    # -- audit -----------------------------------------------------------------------------

    async def audit_page(
        self,
        *,
        kind: str | None = None,
        session: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> AuditPage:
        """One page of the audit log, newest first, after the entries queued so far (read in
        a thread: a locked database never holds up the event loop)."""

        def read() -> AuditPage:
            self._audit_writer.written()
            return self.audit.query(kind=kind, session=session, before_id=before_id, limit=limit)

        return await asyncio.to_thread(read)


def _unpack_skill(data: bytes, archive_name: str, folder: Path) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="corral-skill-") as tmp:
        archive = Path(tmp) / archive_name
        archive.write_bytes(data)
        return unpack_skill_zip(archive, folder)


def _size_of_file(workspace: Workspace, path: str) -> int:
    """The size of the regular file at `path`, or 0 (none there, or not a file: the write
    itself refuses what it must)."""
    try:
        entry = workspace.stat(path)
    except CorralError:
        return 0
    return entry.size_bytes if entry.kind == "file" else 0
