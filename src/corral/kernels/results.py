"""The result of one execution: what the code printed, returned and raised, and how it ended.

A failure of the user's code is a result, never an exception: `status` says how it ended.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "error", "timeout", "interrupted", "died"]
# The limit that stopped or cut an execution, when one did.
Limit = Literal["memory", "tasks", "disk", "time", "output"]

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """`text` without terminal colour and cursor sequences."""
    return _ANSI.sub("", text)


MAX_TRACEBACK_CHARS = 32_000
_CAUSE_MARKS = (
    "The above exception was the direct cause of the following exception",
    "During handling of the above exception, another exception occurred",
)


def bound_traceback(blocks: list[str], max_chars: int = MAX_TRACEBACK_CHARS) -> list[str]:
    """The traceback's blocks (a frame or a chained exception's header each), within
    `max_chars`: past it the middle goes, and a line says how much. A quarter of the room is
    for the start (the root cause of a chain, the outermost call) and the rest for the end
    (the innermost frames and the error raised), which say the most."""
    if sum(len(block) + 1 for block in blocks) <= max_chars:
        return blocks
    head = _fitting(blocks, max_chars // 4)
    tail = _fitting(blocks[len(head) :][::-1], max_chars - max_chars // 4)[::-1]
    middle = blocks[len(head) : len(blocks) - len(tail)]
    if not tail:  # one block larger than the room: its end
        tail = ["..." + blocks[-1][-(max_chars - max_chars // 4) :]]
        middle = blocks[len(head) : -1]
    chained = sum(mark in block for block in middle for mark in _CAUSE_MARKS)
    what = f"{chained} more chained exceptions and " if chained else ""
    cut = (
        f"[corral: {what}{len(middle)} traceback entries "
        f"({sum(len(b) for b in middle):,} characters) cut here; the error raised is last]"
    )
    return [*head, cut, *tail]


def _fitting(blocks: list[str], room: int) -> list[str]:
    kept: list[str] = []
    for block in blocks:
        room -= len(block) + 1
        if room < 0:
            break
        kept.append(block)
    return kept


MAX_REFUSALS = 20  # kept per execution, the first ones


@dataclass(frozen=True)
class NetRefusal:
    """A connection the egress proxy refused while the code ran: `target` is host:port."""

    target: str
    host: str
    rule: str


@dataclass
class ExecutionError:
    """An exception the code raised, as the kernel reported it (ANSI codes stripped)."""

    ename: str
    evalue: str
    traceback: list[str]


@dataclass
class ExecutionResult:
    """How one execution ended and everything it produced, within the output cap.

    `results` are MIME bundles (`{"text/plain": ..., "image/png": <base64>, ...}`) from
    return values and displays, in order. `output_cut_bytes` counts output dropped past the
    cap; `kernel_restarted` says the kernel was replaced (its variables are gone); `limit`
    names the session limit that stopped or cut the code, and `message` says more.
    """

    status: Status = "ok"
    stdout: str = ""
    stderr: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    error: ExecutionError | None = None
    execution_count: int | None = None
    language: str = "python"
    session_id: str = ""
    started_at: float = 0.0
    queued_s: float = 0.0
    duration_s: float = 0.0
    output_bytes: int = 0
    output_truncated: bool = False
    output_cut_bytes: int = 0
    kernel_restarted: bool = False
    limit: Limit | None = None
    message: str | None = None
    network_refused: list[NetRefusal] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def text(self) -> str:
        """A plain-text rendering: output, the last text result, then the error."""
        parts = [self.stdout, self.stderr]
        texts = [bundle["text/plain"] for bundle in self.results if "text/plain" in bundle]
        if texts:
            parts.append(texts[-1] + "\n")
        if self.error is not None:
            parts.append("\n".join(self.error.traceback) + "\n")
        if self.message:
            parts.append(f"[corral] {self.message}\n")
        if self.network_refused:
            parts.append(f"[corral] {refusal_note(self.network_refused, self.session_id)}\n")
        return "".join(parts)


def refusal_note(refused: list[NetRefusal], session_id: str) -> str:
    """What the model and the person read about refused connections, and how to ask."""
    shown = ", ".join(f"{r.target} ({r.rule})" for r in refused)
    hosts = sorted({r.host for r in refused})
    return (
        f"The network policy refused {shown}. Only the operator can allow it; ask with "
        f"request_network_access(hosts={hosts!r}, reason=...), or they can run "
        f"'corral net allow {session_id} {' '.join(hosts)}'."
    )
