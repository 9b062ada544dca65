"""Running one piece of code on a kernel and collecting what it produces.

Code is sent exactly once. Before the send, a dead kernel raises `KernelUnreachable` (the
caller may retry on a fresh kernel); after it, everything is a result: an exception, a
timeout (interrupt, then give up after a grace period), a flood past the output cap
(interrupt, count what was cut) or a kernel that died.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from jupyter_client.asynchronous.client import AsyncKernelClient

from corral.errors import KernelUnreachable
from corral.kernels.kernel import SandboxedKernel, readable_message, reply_to
from corral.kernels.results import (
    ExecutionError,
    ExecutionResult,
    Limit,
    Status,
    bound_traceback,
    strip_ansi,
)

OutputHook = Callable[[str, Any], Awaitable[None]]
# Called just before code goes to the kernel, with the result that will hold its outcome.
BeforeSend = Callable[[ExecutionResult], None]
POLL_S = 0.25
DRAIN_S = 0.05  # how long a dead kernel's socket is read for messages still arriving
_DISPLAY_TYPES = ("execute_result", "display_data", "update_display_data")
# Why the watch interrupted the code, as the limit a result reports.
_LIMIT_OF_REASON: dict[str, Limit] = {"flood": "output", "disk": "disk"}


class Guard(Protocol):
    """Something that stops running code itself (the disk patrol) and is asked while the
    code runs, and once more at its end, which limit it stopped it for."""

    def stopped(self) -> str | None: ...


@dataclass(frozen=True)
class ExecutionLimits:
    timeout_s: float
    grace_s: float
    max_output_bytes: int
    guard: Guard | None = None
    asked_s: float | None = None  # the caller's timeout, when it was past the cap


@dataclass
class Outcome:
    """The result, and whether the kernel can take more code (False: restart it)."""

    result: ExecutionResult
    kernel_usable: bool


class OutputCollector:
    """Folds iopub messages into a result, keeping at most `max_bytes` of output."""

    def __init__(self, result: ExecutionResult, max_bytes: int) -> None:
        self.result = result
        self.max_bytes = max_bytes

    def add(self, msg: dict[str, Any]) -> bool:
        """Apply one message; True when this message pushed the output past the cap."""
        kind, content = msg["msg_type"], msg["content"]
        was_truncated = self.result.output_truncated
        if kind == "stream":
            self._add_stream(content.get("name", "stdout"), str(content.get("text", "")))
        elif kind in _DISPLAY_TYPES:
            self._add_bundle(content.get("data", {}))
            if kind == "execute_result":
                self.result.execution_count = content.get("execution_count")
        elif kind == "error":
            self.result.error = ExecutionError(
                ename=str(content.get("ename", "")),
                evalue=strip_ansi(str(content.get("evalue", ""))),
                traceback=bound_traceback(
                    [strip_ansi(str(line)) for line in content.get("traceback", [])]
                ),
            )
        elif kind == "clear_output":
            self.result.stdout = self.result.stderr = ""
            self.result.results = []
        return self.result.output_truncated and not was_truncated

    def _add_stream(self, name: str, text: str) -> None:
        kept = self._keep(text)
        if name == "stderr":
            self.result.stderr += kept
        else:
            self.result.stdout += kept

    def _add_bundle(self, data: dict[str, Any]) -> None:
        size = sum(len(str(value)) for value in data.values())
        if self._room() >= size:
            self.result.output_bytes += size
            self.result.results.append(dict(data))
        else:
            self._cut(size)

    def _keep(self, text: str) -> str:
        encoded = text.encode("utf-8", "replace")
        room = self._room()
        if len(encoded) <= room:
            self.result.output_bytes += len(encoded)
            return text
        self.result.output_bytes += room
        self._cut(len(encoded) - room)
        return encoded[:room].decode("utf-8", "ignore")

    def _room(self) -> int:
        return max(0, self.max_bytes - self.result.output_bytes)

    def _cut(self, size: int) -> None:
        self.result.output_truncated = True
        self.result.output_cut_bytes += size


async def run_code(
    kernel: SandboxedKernel,
    code: str,
    limits: ExecutionLimits,
    result: ExecutionResult,
    on_output: OutputHook | None = None,
    before_send: BeforeSend | None = None,
) -> Outcome:
    """Send `code` once and fold everything it produces into `result`; `before_send` is
    called just before it goes (what it raises stops the call, with nothing sent)."""
    client = _client(kernel)
    await kernel.interrupts_settled()  # an interrupt still on its way would land in this code
    if not await kernel.is_alive():
        raise KernelUnreachable(f"the {kernel.language} kernel is not running")
    started = time.monotonic()
    result.started_at = time.time()
    if before_send is not None:
        before_send(result)
    msg_id = client.execute(code, allow_stdin=False, stop_on_error=False)
    watch = _Watch(kernel, limits, started)
    collector = OutputCollector(result, limits.max_output_bytes)
    ended = await _follow_iopub(kernel, msg_id, collector, watch, on_output)
    watch.guard_stopped()  # a stop that came as the code ended
    reply = None
    if ended == "idle":
        reply = await _read_reply(kernel, msg_id, result, limits.grace_s)
    result.duration_s = time.monotonic() - started
    return _conclude(result, ended, watch, limits, reply)


def _client(kernel: SandboxedKernel) -> AsyncKernelClient:
    if kernel.client is None:
        raise KernelUnreachable(f"the {kernel.language} kernel has no connection")
    return kernel.client


class _Watch:
    """Tracks the deadline, the interrupt sent and the grace period after it."""

    def __init__(self, kernel: SandboxedKernel, limits: ExecutionLimits, started: float) -> None:
        self.kernel = kernel
        self.limits = limits
        self.deadline = started + limits.timeout_s
        self.reason: str | None = None  # "timeout", "flood" or a guard's limit once interrupted
        self.grace_end = float("inf")
        self.last_alive_check = started

    async def interrupt(self, reason: str) -> None:
        if self.reason is None:
            self.stopped_for(reason)
            # Waits for the kernel's answer, so the interrupt lands before this call ends.
            await self.kernel.interrupt(timeout_s=self.limits.grace_s)

    def stopped_for(self, reason: str) -> None:
        """The code is being stopped: it has the grace period to end."""
        if self.reason is None:
            self.reason = reason
            self.grace_end = time.monotonic() + self.limits.grace_s

    def guard_stopped(self) -> None:
        """Take note when the guard stopped the code (it interrupts the kernel itself)."""
        guard = self.limits.guard
        if self.reason is None and guard is not None and (limit := guard.stopped()):
            self.stopped_for(limit)

    def next_wait(self) -> float:
        now = time.monotonic()
        return max(0.0, min(POLL_S, self.deadline - now, self.grace_end - now))

    async def check(self) -> str | None:
        """'died', 'unresponsive' or None; sends the timeout interrupt when it is due."""
        now = time.monotonic()
        if now - self.last_alive_check >= POLL_S or now >= self.deadline:
            self.last_alive_check = now
            if not await self.kernel.is_alive():
                return "died"
        if now >= self.grace_end:
            return "unresponsive"
        self.guard_stopped()
        if now >= self.deadline:
            await self.interrupt("timeout")
        return None


async def _follow_iopub(
    kernel: SandboxedKernel,
    msg_id: str,
    collector: OutputCollector,
    watch: _Watch,
    on_output: OutputHook | None,
) -> str:
    """Read iopub until our execution goes idle; returns 'idle', 'died' or 'unresponsive'."""
    client = _client(kernel)
    while True:
        problem = await watch.check()
        if problem == "died":
            await _drain_iopub(client, msg_id, collector, on_output)
        if problem:
            return problem
        try:
            msg = await readable_message(client.get_iopub_msg, watch.next_wait())
        except queue.Empty:
            continue
        if msg is None or msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
            return "idle"
        if await _take(msg, collector, on_output):
            await watch.interrupt("flood")


async def _drain_iopub(
    client: AsyncKernelClient,
    msg_id: str,
    collector: OutputCollector,
    on_output: OutputHook | None,
) -> None:
    """Fold in what the kernel sent before it died and the reader had not taken yet: the
    messages already at the host end of the socket (a dead kernel sends nothing more, so
    the first short wait with nothing arriving ends it)."""
    while True:
        try:
            msg = await readable_message(client.get_iopub_msg, DRAIN_S)
        except queue.Empty:
            return
        if msg is not None and msg.get("parent_header", {}).get("msg_id") == msg_id:
            await _take(msg, collector, on_output)


async def _take(
    msg: dict[str, Any], collector: OutputCollector, on_output: OutputHook | None
) -> bool:
    """Fold one of our messages into the result and pass it on; True when it went past the
    output cap."""
    past_cap = collector.add(msg)
    if on_output is not None and msg["msg_type"] not in ("status", "execute_input"):
        await on_output(msg["msg_type"], msg["content"])
    return past_cap


async def _read_reply(
    kernel: SandboxedKernel, msg_id: str, result: ExecutionResult, timeout_s: float
) -> str | None:
    """Fold the execute_reply into `result`; its status ('ok', 'error', 'aborted'), or
    None when none came within `timeout_s`."""
    reply = await reply_to(_client(kernel).get_shell_msg, msg_id, timeout_s)
    if reply is None:
        return None
    content = reply["content"]
    result.execution_count = content.get("execution_count", result.execution_count)
    if content.get("status") == "error" and result.error is None:
        result.error = ExecutionError(
            str(content.get("ename", "")), strip_ansi(str(content.get("evalue", ""))), []
        )
    return str(content.get("status", ""))


def _unanswered(result: ExecutionResult, reply: str | None) -> None:
    """The kernel went idle without saying the code finished: not a success."""
    result.status = "error"
    if reply == "aborted":
        result.message = "the kernel did not run this code (it aborted the call); send it again"
    else:
        result.message = (
            "the kernel ended this call with no reply: the code may have stopped part way "
            "(its output so far is above); check what it changed before running it again"
        )


def _conclude(
    result: ExecutionResult, ended: str, watch: _Watch, limits: ExecutionLimits, reply: str | None
) -> Outcome:
    if ended == "died":
        result.status = "died"
        result.message = "the kernel died while running this code; its variables are lost"
        return Outcome(result, kernel_usable=False)
    if watch.reason == "timeout":
        result.status = "timeout"
        result.limit = "time"
        result.message = f"stopped after the {limits.timeout_s:g} s time limit"
        if limits.asked_s is not None:
            result.message += f" (the session's cap; {limits.asked_s:g} s was asked)"
    elif watch.reason is not None:
        interrupted = result.error is not None and result.error.ename == "KeyboardInterrupt"
        result.status = "interrupted" if interrupted else _status_of(result)
        result.limit = _LIMIT_OF_REASON.get(watch.reason)
    elif reply in ("ok", "error"):
        result.status = _status_of(result)
    else:  # idle, but the kernel did not say the code finished
        _unanswered(result, reply)
    if result.output_truncated:
        result.limit = result.limit or "output"
        note = (
            f"output cut at {limits.max_output_bytes} bytes; "
            f"{result.output_cut_bytes} more bytes were dropped"
        )
        result.message = f"{result.message}; {note}" if result.message else note
    if ended == "unresponsive":
        result.message = f"{result.message}; the kernel did not stop and was restarted"
        return Outcome(result, kernel_usable=False)
    return Outcome(result, kernel_usable=True)


def _status_of(result: ExecutionResult) -> Status:
    if result.error is None:
        return "ok"
    return "interrupted" if result.error.ename == "KeyboardInterrupt" else "error"
