"""Waiting in tests for a state one can observe, with a deadline (never a fixed sleep)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(check: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    """Return once `check()` is true; fail naming `what` when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.01)
