"""Running code: an execution checked once and started as a handle (`corral.execution`),
its audit entry journaled before its code is sent and completed when it ends, the status
events its session's watchers see, and the executions kept by id for a client that comes
back (`corral.executions`)."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from corral.areas.trail import AuditTrail
from corral.audit_entries import ExecutionBegun, ExecutionEnded
from corral.execution import Execution
from corral.executions import ExecutionRegistry
from corral.kernels.results import ExecutionResult
from corral.kernels.sessions import Session, SessionManager, check_timeout, validate_language
from corral.session_events import SessionEvents

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 30  # for the calls still held at close to end once their kernels stopped


@dataclass(frozen=True)
class Call:
    """What one execution asked for, checked: its code, language, timeout and caller."""

    code: str
    language: str
    timeout_s: float | None
    actor: str


class ExecutionService:
    """Executions in every session; `keep_bytes` bounds the events one keeps."""

    def __init__(
        self,
        sessions: SessionManager,
        trail: AuditTrail,
        events: SessionEvents,
        kept: ExecutionRegistry,
        keep_bytes: int,
    ) -> None:
        self.sessions = sessions
        self.trail = trail
        self.events = events
        self.kept = kept
        self.keep_bytes = keep_bytes

    def get(self, execution_id: str) -> Execution:
        """A kept execution (`ExecutionNotFound` once forgotten)."""
        return self.kept.get(execution_id)

    def listed(self, session_id: str | None = None) -> list[Execution]:
        """The kept executions, newest first, of one session or of all."""
        return self.kept.listed(session_id)

    def start(
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
            functools.partial(self._call, session, call),
            self.sessions.calls.cancel,
            session_id=session.id,
            keep_bytes=self.keep_bytes,
            on_end=self.kept.ended,
            code=call.code,
            language=call.language,
        )
        self.kept.add(execution)
        return execution

    async def _call(self, session: Session, call: Call, execution: Execution) -> ExecutionResult:
        """The execution's whole call: its turn in the session's queue, the kernel, the
        audit entry written before the code is sent and completed once it ended."""
        result = await self.sessions.calls.execute(
            session,
            call.code,
            language=call.language,
            timeout_s=call.timeout_s,
            on_output=execution.note,
            before_send=functools.partial(self._journal_before_sending, execution, call),
        )
        if execution.audit_key is not None:
            self.trail.record(
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
        execution.audit_key = self.trail.begin(
            ExecutionBegun(
                session=result.session_id,
                language=call.language,
                code=call.code,
                actor=call.actor,
                at=result.started_at,
            )
        )
        execution.running = True  # journaled: the code is sent now
        self.events.publish(
            result.session_id, "busy", execution=execution.id, language=call.language
        )

    def _publish_end(self, execution_id: str, result: ExecutionResult) -> None:
        """What a watcher of the session learns when code ends: idle, and what struck."""
        publish = functools.partial(self.events.publish, result.session_id)
        if result.status == "died":
            publish("kernel_died", execution=execution_id)
        if result.kernel_restarted:
            publish("kernel_restarted", execution=execution_id)
        if result.limit is not None:
            publish("limit", execution=execution_id, limit=result.limit, message=result.message)
        publish("idle", execution=execution_id, status=result.status)

    async def run(
        self,
        code: str,
        *,
        session_id: str | None = None,
        language: str = "python",
        timeout_s: float | None = None,
        actor: str = "agent",
        resume: bool = True,
    ) -> ExecutionResult:
        """`start`, then its result (for callers that need no events)."""
        execution = self.start(
            code,
            session_id=session_id,
            language=language,
            timeout_s=timeout_s,
            actor=actor,
            resume=resume,
        )
        return await execution.result()

    async def wait_for_running(self) -> None:
        """At close, after the kernels stopped: every call still held ends promptly (as
        died, or refused), and one that does not within `CLOSE_WAIT_S` is cancelled."""
        for execution in self.kept.running():
            if not await execution.wait(CLOSE_WAIT_S):
                log.warning(
                    "an execution had not ended %g s after its kernel stopped", CLOSE_WAIT_S
                )
                execution.abandon()
                await execution.wait()
