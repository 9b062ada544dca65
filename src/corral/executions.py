"""The executions a client can come back to, by id: every running one, and ended ones for a while.

An ended execution is kept `keep_s` seconds and among the newest `keep_count` ended ones,
whichever forgets it first; its events are bounded by the execution itself. So a client
whose connection dropped asks for the state, the result and the events it missed, and the
server's memory stays bounded however many executions run.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from corral.errors import ExecutionNotFound
from corral.execution import Execution


class ExecutionRegistry:
    def __init__(self, keep_s: float, keep_count: int) -> None:
        self.keep_s = keep_s
        self.keep_count = keep_count
        self._running: dict[str, Execution] = {}
        self._ended: OrderedDict[str, Execution] = OrderedDict()  # oldest end first

    def add(self, execution: Execution) -> None:
        self._running[execution.id] = execution

    def ended(self, execution: Execution) -> None:
        """Told by the execution when it ends: kept from now, the oldest forgotten."""
        self._running.pop(execution.id, None)
        self._ended[execution.id] = execution
        self._forget_old()

    def running(self) -> list[Execution]:
        """The executions that have not ended (the service waits for them at close)."""
        return list(self._running.values())

    def get(self, execution_id: str) -> Execution:
        """The execution, or `ExecutionNotFound` naming how long ended ones are kept."""
        self._forget_old()
        found = self._running.get(execution_id) or self._ended.get(execution_id)
        if found is None:
            raise ExecutionNotFound(
                f"no execution {execution_id!r}: ended executions are kept for "
                f"{self.keep_s:g} s (the newest {self.keep_count})"
            )
        return found

    def listed(self, session_id: str | None = None) -> list[Execution]:
        """The kept executions, newest first, of one session or of all."""
        self._forget_old()
        every = [*self._running.values(), *reversed(self._ended.values())]
        chosen = [e for e in every if session_id is None or e.session_id == session_id]
        return sorted(chosen, key=lambda e: e.created_at, reverse=True)

    def _forget_old(self) -> None:
        horizon = time.time() - self.keep_s
        while self._ended:
            oldest = next(iter(self._ended.values()))
            too_many = len(self._ended) > self.keep_count
            if not too_many and (oldest.ended_at or 0) > horizon:
                return
            self._ended.popitem(last=False)
