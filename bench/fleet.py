"""Fleets: many started corral sessions, or many started baseline kernels, at once.

Members start a few at a time (`STARTS_AT_ONCE`), each then runs `1+1` a given number of
times, so a fleet is warm and idle when it is handed over. On exit every member is stopped,
whatever happened.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from bench.baseline import BaselineKernel, BaselineRoots, baseline_kernel
from bench.measure import baseline_round_trip, corral_round_trip
from bench.sandboxed import new_session_id
from corral.kernels.sessions import SessionManager

# Two cores: more starts at once only queue for the CPU, and each start has a timeout.
STARTS_AT_ONCE = 4


async def _bounded(starts: list[Callable[[], Awaitable[None]]]) -> None:
    """Run `starts`, at most `STARTS_AT_ONCE` at a time; the first failure cancels the rest
    and is raised as itself (not in an `ExceptionGroup`), so callers see corral's errors."""
    gate = asyncio.Semaphore(STARTS_AT_ONCE)

    async def one(start: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await start()

    try:
        async with asyncio.TaskGroup() as group:
            for start in starts:
                group.create_task(one(start))
    except ExceptionGroup as failures:
        raise failures.exceptions[0] from failures


@asynccontextmanager
async def corral_fleet(
    manager: SessionManager, count: int, runs: int = 1
) -> AsyncIterator[list[str]]:
    """`count` started sessions of `manager`, each having run `1+1` `runs` times; their ids.

    On exit every session that exists is deleted. Raises what `create` raises, or
    `RuntimeError` when a `1+1` did not succeed.
    """
    ids = [new_session_id() for _ in range(count)]

    async def start(session_id: str) -> None:
        await manager.create(session_id)
        for _ in range(runs):
            await corral_round_trip(manager, session_id)

    try:
        await _bounded([functools.partial(start, session_id) for session_id in ids])
        yield ids
    finally:
        await asyncio.gather(
            *(manager.delete(session_id) for session_id in ids if manager.exists(session_id))
        )


@asynccontextmanager
async def baseline_fleet(
    roots: BaselineRoots, count: int, runs: int = 1
) -> AsyncIterator[list[BaselineKernel]]:
    """`count` started baseline kernels, each having run `1+1` `runs` times.

    On exit every kernel is stopped and its directories removed. Raises `RuntimeError` or
    `TimeoutError` when a kernel does not start or a `1+1` does not succeed.
    """
    async with AsyncExitStack() as stack:
        kernels = [await stack.enter_async_context(baseline_kernel(roots)) for _ in range(count)]
        stack.push_async_callback(_stop_all, kernels)  # at once, before the one-by-one exits

        async def start(kernel: BaselineKernel) -> None:
            await kernel.start()
            for _ in range(runs):
                await baseline_round_trip(kernel)

        await _bounded([functools.partial(start, kernel) for kernel in kernels])
        yield kernels


async def _stop_all(kernels: list[BaselineKernel]) -> None:
    await asyncio.gather(*(kernel.stop() for kernel in kernels))
