"""The execution handle's own rules, with a stand-in for the call it runs (the real one needs
a kernel; tests/server/test_execution_handle.py runs it through every front-end).

The stand-in gets the output hook exactly as `Service` passes it, and the canceller is
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


class StandIn:
    """A call that sends the given messages, then waits for `release` before ending."""

    def __init__(self, messages: list[tuple[str, dict[str, Any]]], fail: bool = False) -> None:
        self.messages = messages
        self.fail = fail
        self.release = asyncio.Event()
        self.sent = asyncio.Event()
        self.hook: OutputHook | None = None
        self.cancelled_with: list[asyncio.Future[ExecutionResult]] = []

    async def run(self, on_output: OutputHook | None) -> ExecutionResult:
        self.hook = on_output
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


def test_jupyter_messages_become_corrals_events() -> None:
    assert event_of("stream", {"name": "stdout", "text": "a"}) == Event("stdout", text="a")
    assert event_of("stream", {"name": "stderr", "text": "b"}) == Event("stderr", text="b")
    bundle = {"text/plain": "2"}
    for kind in ("execute_result", "display_data", "update_display_data"):
        assert event_of(kind, {"data": bundle}) == Event("display", data=bundle)
    error = event_of("error", {"ename": "E", "evalue": "\x1b[31mbad\x1b[0m", "traceback": []})
    assert error == Event("error", ename="E", evalue="bad")
    assert event_of("clear_output", {"wait": False}) is None
    assert Event("stdout", text="x").to_dict() == {"text": "x"}
    assert Event("display", data=bundle).to_dict() == {"data": bundle}
    assert Event("error", ename="E", evalue="v").to_dict() == {"ename": "E", "evalue": "v"}


async def test_events_arrive_in_order_and_end_with_the_execution() -> None:
    call = StandIn([("stream", {"name": "stdout", "text": "1"}), ("display_data", {"data": {}})])
    execution = Execution(call.run, call.cancel, keep_events=True)
    call.release.set()
    kinds = [event.kind async for event in execution.events()]
    assert kinds == ["stdout", "display"]
    assert (await execution.result()).stdout == "done\n"


async def test_without_keep_events_no_hook_is_given_and_nothing_is_kept() -> None:
    call = StandIn([("stream", {"name": "stdout", "text": "1"})])
    execution = Execution(call.run, call.cancel, keep_events=False)
    call.release.set()
    assert [event async for event in execution.events()] == []
    await execution.result()
    assert call.hook is None


async def test_a_reader_that_leaves_stops_the_keeping_not_the_execution() -> None:
    call = StandIn([("stream", {"name": "stdout", "text": "1"})])
    execution = Execution(call.run, call.cancel, keep_events=True)
    events = execution.events()
    assert (await anext(events)).text == "1"
    await events.aclose()  # the reader went away
    assert call.hook is not None
    await call.hook("stream", {"name": "stdout", "text": "unread"})
    call.release.set()
    assert (await execution.result()).stdout == "done\n"
    assert [event async for event in execution.events()] == []  # nothing kept for nobody


async def test_a_cancelled_wait_for_the_result_leaves_the_execution_running() -> None:
    call = StandIn([])
    execution = Execution(call.run, call.cancel, keep_events=False)
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
    execution = Execution(call.run, call.cancel, keep_events=False)
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
    execution = Execution(call.run, call.cancel, keep_events=False, on_end=ended.append)
    call.release.set()
    assert await execution.wait(10)
    assert ended == [execution]
    ended.clear()
    del execution
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
        await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text


async def test_recent_text_takes_the_text_since_the_last_look_and_leaves_the_end_visible() -> None:
    # The polling read of MCP's progress notes: text since the last look, other events
    # passed over, at most the last max_chars, and the end still seen by events().
    call = StandIn(
        [
            ("stream", {"name": "stdout", "text": "one "}),
            ("display_data", {"data": {"text/plain": "x"}}),
            ("stream", {"name": "stderr", "text": "two"}),
        ]
    )
    execution = Execution(call.run, call.cancel, keep_events=True)
    await call.sent.wait()
    assert execution.recent_text(100) == "one two"
    assert execution.recent_text(100) == ""
    assert call.hook is not None
    await call.hook("stream", {"name": "stdout", "text": "three"})
    call.release.set()
    await execution.result()
    assert execution.recent_text(3) == "ree"
    assert [event async for event in execution.events()] == []
