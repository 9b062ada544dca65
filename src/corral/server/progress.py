"""MCP progress notifications for a running execution: its output as it arrives, and how
long it has run while it is silent.

A note goes out when new stdout or stderr arrives (at most one every `gap_s`, carrying all
that arrived meanwhile) and, when nothing arrives, every `every_s`, so a client sees a 3-second
run's output while it runs rather than only its result. The output is looked at when a note
is due (`Execution.recent_text`), never followed event by event: a task per event cost each
call about 15% of its MCP round trip.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from corral.execution import Execution
from corral.kernels.results import ExecutionResult

PROGRESS_TEXT_CHARS = 4000  # of new output in one note
GAP_S = 0.25  # the shortest time between two notes


class ProgressSink(Protocol):
    """The part of an MCP request context that reports progress."""

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None: ...


async def report_progress(
    execution: Execution, ctx: ProgressSink, *, every_s: float, gap_s: float = GAP_S
) -> ExecutionResult:
    """Await the execution's result, telling `ctx` how it goes: a note with the output that
    arrived since the last one (at most `PROGRESS_TEXT_CHARS`) soon after it arrives, and
    one with the elapsed time after `every_s` of silence. Progress is the elapsed seconds."""
    loop = asyncio.get_running_loop()
    began = last = loop.time()
    while not await execution.wait_for_output(last + every_s - loop.time()):
        if loop.time() < last + gap_s and await execution.wait(last + gap_s - loop.time()):
            break
        last = loop.time()
        elapsed = round(last - began, 1)
        text = execution.recent_text(PROGRESS_TEXT_CHARS)
        await ctx.report_progress(progress=elapsed, message=_note(elapsed, text))
    return await execution.result()


def _note(elapsed_s: float, text: str) -> str:
    note = f"still running ({elapsed_s:g} s elapsed)"
    return f"{note}\n{text}" if text else note
