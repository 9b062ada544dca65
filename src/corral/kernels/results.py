"""The result of one execution: what the code printed, returned and raised, and how it ended.

A failure of the user's code is a result, never an exception: `status` says how it ended.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "error", "timeout", "interrupted", "died"]
# The limit that stopped or cut an execution, when one did.
Limit = Literal["memory", "tasks", "disk", "time", "output"]

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """`text` without terminal colour and cursor sequences."""
    return _ANSI.sub("", text)


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

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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
        return "".join(parts)
