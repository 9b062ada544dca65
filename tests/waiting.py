"""Waiting in tests for a state one can observe, with a deadline (never a fixed sleep)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable


async def until(check: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    """Return once `check()` is true (awaited, when it gives an awaitable); fail naming
    `what` when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while not await _value(check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.01)


async def _value(value: object) -> object:
    return await value if inspect.isawaitable(value) else value
