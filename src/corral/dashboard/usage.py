"""What each session holds now, and a short history of it for the dashboard's charts.

The service answers a session's limits and usage (`ControlService.limits`); this module
keeps the last `keep` looks per session, at most one a second, so that a chart shows the
last minutes and the CPU figure is a rate (CPU seconds between two looks over the time
between them). Looks are taken when someone watches: no page open, no sampling.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from corral.controls import LimitsReport
from corral.errors import NotFound
from corral.kernels.session import SessionInfo
from corral.service import Service

MIN_GAP_S = 1.0


@dataclass(frozen=True)
class Look:
    at: float
    memory_bytes: int
    cpu_seconds: float


@dataclass(frozen=True)
class SessionRow:
    """One session as the sessions page shows it."""

    info: SessionInfo
    network_mode: str
    report: LimitsReport | None
    cpu_percent: float | None
    memory_history: tuple[float, ...]
    cpu_history: tuple[float, ...]


class UsageHistory:
    def __init__(self, keep: int = 120, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep = keep
        self._clock = clock
        self._looks: dict[str, deque[Look]] = {}

    def note(self, session_id: str, report: LimitsReport) -> None:
        """Keep this look if the last one is at least `MIN_GAP_S` old."""
        if report.usage is None:
            self._looks.pop(session_id, None)  # stopped: a new run starts a new chart
            return
        looks = self._looks.setdefault(session_id, deque(maxlen=self.keep))
        now = self._clock()
        if looks and now - looks[-1].at < MIN_GAP_S:
            return
        looks.append(Look(now, report.usage.memory_bytes, report.usage.cpu_seconds))

    def forget_others(self, session_ids: set[str]) -> None:
        for gone in set(self._looks) - session_ids:
            del self._looks[gone]

    def memory(self, session_id: str) -> tuple[float, ...]:
        return tuple(float(look.memory_bytes) for look in self._looks.get(session_id, ()))

    def cpu(self, session_id: str) -> tuple[float, ...]:
        """Percent of one core between each two looks."""
        looks = list(self._looks.get(session_id, ()))
        return tuple(_percent(a, b) for a, b in itertools.pairwise(looks))

    def cpu_now(self, session_id: str) -> float | None:
        rates = self.cpu(session_id)
        return rates[-1] if rates else None


def _percent(before: Look, after: Look) -> float:
    elapsed = after.at - before.at
    used = max(after.cpu_seconds - before.cpu_seconds, 0.0)
    return 100.0 * used / elapsed if elapsed > 0 else 0.0


def session_rows(
    service: Service, history: UsageHistory, only: str | None = None
) -> list[SessionRow]:
    """Every session (or the one named `only`), newest first, its usage noted in `history`."""
    rows = []
    infos = sorted(service.list_sessions(), key=lambda info: info.created_at, reverse=True)
    if only is not None:
        infos = [info for info in infos if info.id == only]
    for info in infos:
        report = _report(service, info.id)
        if report is not None:
            history.note(info.id, report)
        rows.append(
            SessionRow(
                info=info,
                network_mode=service.egress.policy(info.id).mode,
                report=report,
                cpu_percent=history.cpu_now(info.id),
                memory_history=history.memory(info.id),
                cpu_history=history.cpu(info.id),
            )
        )
    if only is None:
        history.forget_others({info.id for info in infos})
    return rows


def _report(service: Service, session_id: str) -> LimitsReport | None:
    try:
        return service.controls.limits(session_id)
    except NotFound:  # deleted between the list and this look
        return None
