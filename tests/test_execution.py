"""The execution handle's own rules, with a stand-in for the call it runs (the real one needs
a kernel; tests/server/test_execution_handle.py runs it through every front-end).

The stand-in gets the handle and its output hook exactly as `Service` does, and the canceller is
called with the handle's task, as `SessionManager.cancel` is.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from corral.errors import SessionNotFound
from corral.execution import Event, Execution, event_of
from corral.kernels.execute import OutputHook
from corral.kernels.results import ExecutionResult
from corral.server.progress import report_progress
from tests.waiting import until


class StandIn:
    """A call that sends the given messages, then waits for `release` before ending."""

    def __init__(self, messages: list[tuple[str, dict[str, Any]]], fail: bool = False) -> None:
        self.messages = messages
        self.fail = fail
        self.release = asyncio.Event()
        self.sent = asyncio.Event()
        self.hook: OutputHook | None = None
        self.cancelled_with: list[asyncio.Future[ExecutionResult]] = []

    async def run(self, execution: Execution) -> ExecutionResult:
        on_output = self.hook = execution.note
        for kind, content in self.messages:
            if on_output is not None:
                await on_output(kind, content)
        self.sent.set()
        await self.release.wait()
        if self.fail:
            raise SessionNotFound("gone")
        return ExecutionResult(stdout="done\n")

    async def cancel(self, task: asyncio.Future[ExecutionResult]) -> None:
        self.cancelled_with.append(task)
        task.cancel()


def make(call: StandIn, keep_bytes: int = 1_000_000, **more: Any) -> Execution:
    return Execution(call.run, call.cancel, session_id="s", keep_bytes=keep_bytes, **more)


async def texts(execution: Execution, after: int = 0) -> list[tuple[int, str]]:
    return [(n, event.text) async for n, event in execution.events(after)]


def test_jupyter_messages_become_corrals_events() -> None:
    assert event_of("stream", {"name": "stdout", "text": "a"}) == Event("stdout", text="a")
    assert event_of("stream", {"name": "stderr", "text": "b"}) == Event("stderr", text="b")
    bundle = {"text/plain": "2"}
    for kind in ("execute_result", "display_data", "update_display_data"):
        assert event_of(kind, {"data": bundle}) == Event("display", data=bundle)
    error = event_of("error", {"ename": "E", "evalue": "\x1b[31mbad\x1b[0m", "traceback": []})
    assert error == Event("error", ename="E", evalue="bad")
    assert event_of("clear_output", {"wait": False}) is None


async def test_events_arrive_in_order_and_end_with_the_execution() -> None:
    call = StandIn([("stream", {"name": "stdout", "text": "1"}), ("display_data", {"data": {}})])
    execution = make(call)
    call.release.set()
    kinds = [(n, event.kind) async for n, event in execution.events()]
    assert kinds == [(1, "stdout"), (2, "display")]
    assert (await execution.result()).stdout == "done\n"


async def test_a_reader_that_leaves_misses_nothing_when_it_comes_back() -> None:
    call = StandIn([("stream", {"name": "stdout", "text": "1"})])
    execution = make(call)
    assert execution.state == "queued" and execution.id.startswith("ex-")
    events = execution.events()
    assert (await anext(events))[1].text == "1"
    await events.aclose()  # the reader went away; the execution goes on
    assert call.hook is not None
    await call.hook("stream", {"name": "stdout", "text": "unread"})
    await call.hook("stream", {"name": "stdout", "text": "later"})
    # Another reader, from where the first left: the rest in order, nothing twice.
    resumed = execution.events(after=1)
    assert (await anext(resumed)) == (2, Event("stdout", text="unread"))
    call.release.set()
    assert await texts(execution, after=1) == [(2, "unread"), (3, "later")]
    assert [item async for item in resumed] == [(3, Event("stdout", text="later"))]
    assert execution.state == "done" and execution.ended_at is not None
    assert (await execution.result()).stdout == "done\n"
    assert execution.outcome() is not None and execution.failure() is None
    assert await texts(execution) == [(1, "1"), (2, "unread"), (3, "later")]


async def test_the_kept_events_stop_at_their_bound_and_say_so() -> None:
    call = StandIn([("stream", {"name": "stdout", "text": "x" * 6}) for _ in range(3)])
    execution = make(call, keep_bytes=15)
    call.release.set()
    await execution.result()
    assert await texts(execution) == [(1, "xxxxxx"), (2, "xxxxxx")]
    assert execution.log.cut


async def test_a_call_refused_before_it_ran_has_a_failure_and_no_outcome() -> None:
    call = StandIn([], fail=True)
    execution = make(call)
    call.release.set()
    assert await execution.wait(10)
    assert (execution.outcome(), execution.failure()) == (None, "Session 'gone' not found.")


async def test_a_cancelled_wait_for_the_result_leaves_the_execution_running() -> None:
    call = StandIn([])
    execution = make(call)
    waiter = asyncio.create_task(execution.result())
    await call.sent.wait()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not execution.done
    call.release.set()
    assert (await execution.result()).stdout == "done\n"
    assert call.cancelled_with == []


async def test_cancel_goes_to_the_canceller_once_and_not_after_the_end() -> None:
    call = StandIn([])
    execution = make(call)
    await call.sent.wait()
    await execution.cancel()
    assert len(call.cancelled_with) == 1
    with pytest.raises(asyncio.CancelledError):
        await execution.result()
    await execution.cancel()
    assert len(call.cancelled_with) == 1


async def test_a_failure_nobody_awaited_is_not_logged_as_unhandled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ended: list[Execution] = []
    call = StandIn([], fail=True)
    execution = make(call, on_end=ended.append)
    call.release.set()
    assert await execution.wait(10)
    assert ended == [execution]
    ended.clear()
    del execution
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
        await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text


async def test_recent_text_takes_the_text_since_the_last_look_and_keeps_the_events() -> None:
    # The polling read of MCP's progress notes: text since the last look, other events
    # passed over, at most the last max_chars; events() still sees every event.
    call = StandIn(
        [
            ("stream", {"name": "stdout", "text": "one "}),
            ("display_data", {"data": {"text/plain": "x"}}),
            ("stream", {"name": "stderr", "text": "two"}),
        ]
    )
    execution = make(call)
    await call.sent.wait()
    assert execution.recent_text(100) == "one two"
    assert execution.recent_text(100) == ""
    assert call.hook is not None
    await call.hook("stream", {"name": "stdout", "text": "three"})
    call.release.set()
    await execution.result()
    assert execution.recent_text(3) == "ree"
    assert [n async for n, _ in execution.events()] == [1, 2, 3, 4]  # all still kept


class Progress:
    """What an MCP context's `report_progress` was told."""

    def __init__(self) -> None:
        self.notes: list[tuple[float, str | None]] = []

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        self.notes.append((progress, message))


async def test_output_is_reported_as_it_arrives_not_at_the_next_tick() -> None:
    call = StandIn([("stream", {"name": "stdout", "text": "first line\n"})])
    execution = make(call)
    progress = Progress()
    reporting = asyncio.create_task(report_progress(execution, progress, every_s=3600, gap_s=0.01))
    await until(lambda: progress.notes, "a note with the first output")
    call.release.set()
    assert (await reporting).stdout == "done\n"
    assert len(progress.notes) == 1
    elapsed, message = progress.notes[0]
    assert elapsed >= 0 and message is not None
    assert message.startswith("still running (") and message.endswith("\nfirst line\n")


async def test_a_silent_run_is_reported_each_tick_with_its_elapsed_time() -> None:
    call = StandIn([])
    execution = make(call)
    progress = Progress()
    reporting = asyncio.create_task(report_progress(execution, progress, every_s=0.05, gap_s=0.01))
    await until(lambda: len(progress.notes) >= 3, "three notes")
    call.release.set()
    await reporting
    elapsed = [note[0] for note in progress.notes]
    assert elapsed == sorted(elapsed) and all(
        "still running" in (n[1] or "") for n in progress.notes
    )
