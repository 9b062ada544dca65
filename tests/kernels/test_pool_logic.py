"""The warm pool's rules, with stand-in kernels: who waits, what it holds, when it empties.

The pool knows nothing of sandboxes (the session manager hands it `spawn` and `discard`), so
these run without bwrap; tests/kernels/test_pool.py runs it with real sandboxes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from corral.kernels import pool as pool_module
from corral.kernels.pool import PoolConfig, WarmPool

MIB = 1024 * 1024


@dataclass
class StandIn:
    number: int
    memory_bytes: int = 40 * MIB
    living: bool = True

    async def alive(self) -> bool:
        return self.living


@dataclass
class Factory:
    """Starts stand-ins after `delay_s`; fails while `failing`; records what was discarded."""

    delay_s: float = 0.01
    memory_bytes: int = 40 * MIB
    failing: bool = False
    room: int = 100
    started: int = 0
    discarded: list[int] = field(default_factory=list)
    gate: asyncio.Event | None = None
    numbers: itertools.count[int] = field(default_factory=itertools.count)

    async def spawn(self) -> StandIn:
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.delay_s)
        if self.failing:
            raise RuntimeError("no kernel today")
        self.started += 1
        return StandIn(next(self.numbers), self.memory_bytes)

    async def discard(self, kernel: StandIn) -> None:
        self.discarded.append(kernel.number)

    def pool(self, **config: float) -> WarmPool[StandIn]:
        settings = {"size": 2, "budget_bytes": 512 * MIB, "idle_s": 60.0, **config}
        return WarmPool(PoolConfig(**settings), self.spawn, self.discard, lambda: self.room)


@pytest.fixture
async def factory() -> AsyncIterator[Factory]:
    yield Factory()


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.005)


async def test_it_fills_to_its_size_and_hands_out_the_oldest_first(factory: Factory) -> None:
    pool = factory.pool()
    pool.start()
    try:
        await pool.wait_full(5)
        assert [k.number for k in pool.ready] == [0, 1]
        taken = await pool.take()
        assert taken is not None and taken.number == 0
        await pool.wait_full(5)
        assert len(pool.ready) == 2 and factory.started == 3
    finally:
        await pool.close()
    assert sorted(factory.discarded) == [1, 2]


async def test_an_off_pool_hands_out_nothing(factory: Factory) -> None:
    pool = factory.pool(size=0)
    pool.start()
    assert await pool.take() is None
    await asyncio.sleep(0.05)
    assert factory.started == 0
    await pool.close()


async def test_one_caller_waits_for_a_half_started_kernel_the_next_starts_cold(
    factory: Factory,
) -> None:
    factory.gate = asyncio.Event()
    pool = factory.pool(size=1)
    pool.start()
    try:
        await until(lambda: pool.filling)
        first = asyncio.create_task(pool.take())
        await until(lambda: pool.waiting == 1)
        assert await pool.take() is None  # a second waiter would only queue behind it
        factory.gate.set()
        taken = await first
        assert taken is not None and taken.number == 0
        assert pool.missed == 1
    finally:
        await pool.close()


async def test_a_dead_kernel_is_discarded_not_handed_out(factory: Factory) -> None:
    pool = factory.pool(size=2)
    pool.start()
    try:
        await pool.wait_full(5)
        pool.ready[0].living = False
        taken = await pool.take()
        assert taken is not None and taken.number == 1
        assert factory.discarded == [0]
    finally:
        await pool.close()


async def test_the_budget_caps_what_it_holds(factory: Factory) -> None:
    pool = factory.pool(size=5, budget_bytes=100 * MIB)  # room for two of 40 MiB
    pool.start()
    try:
        await pool.wait_full(5)
        await asyncio.sleep(0.05)
        assert len(pool.ready) == 2 and pool.held_bytes() == 80 * MIB
    finally:
        await pool.close()


async def test_a_kernel_larger_than_the_budget_is_not_kept_nor_retried(factory: Factory) -> None:
    factory.memory_bytes = 600 * MIB
    pool = factory.pool(size=2, budget_bytes=512 * MIB)
    pool.start()
    try:
        await until(lambda: factory.discarded == [0])
        await asyncio.sleep(0.1)
        assert factory.started == 1 and not pool.ready
    finally:
        await pool.close()


async def test_it_leaves_room_for_sessions(factory: Factory) -> None:
    pool = factory.pool(size=3)
    pool.start()
    try:
        await pool.wait_full(5)
        factory.room = 1
        pool.wake()
        await until(lambda: len(pool.ready) == 1)
        assert len(factory.discarded) == 2
    finally:
        await pool.close()


async def test_it_empties_when_idle_and_refills_on_the_next_take(factory: Factory) -> None:
    pool = factory.pool(size=2, idle_s=0.2)
    pool.start()
    try:
        await pool.wait_full(5)
        await until(lambda: not pool.ready, 5)
        assert await pool.take() is None
        await until(lambda: len(pool.ready) == 2)
    finally:
        await pool.close()


async def test_failed_starts_back_off_and_recover(factory: Factory) -> None:
    factory.failing = True
    pool = factory.pool(size=1)
    pool.start()
    try:
        await until(lambda: pool.failures >= 1)
        await asyncio.sleep(0.3)
        assert pool.failures == 1, "the next try waits for the back-off"
        factory.failing = False
        await pool.wait_full(5)
        assert len(pool.ready) == 1
    finally:
        await pool.close()


async def test_a_refill_waits_for_the_pause_after_a_hand_out(factory: Factory) -> None:
    pool = factory.pool(size=2, refill_pause_s=30.0)
    pool.start()
    try:
        await pool.wait_full(5)
        assert await pool.take() is not None
        await asyncio.sleep(0.1)  # a refill would have started within milliseconds
        assert (factory.started, pool.filling, len(pool.ready)) == (2, False, 1)
    finally:
        await pool.close()


async def test_the_pool_refills_once_the_pause_is_over(factory: Factory) -> None:
    pool = factory.pool(size=2, refill_pause_s=0.2)
    pool.start()
    try:
        await pool.wait_full(5)
        assert await pool.take() is not None
        await until(lambda: len(pool.ready) == 2)
        assert factory.started == 3
    finally:
        await pool.close()


async def test_a_call_ending_ends_the_pause(factory: Factory) -> None:
    pool = factory.pool(size=1, refill_pause_s=30.0)
    pool.start()
    try:
        await pool.wait_full(5)
        assert await pool.take() is not None
        pool.resume()
        await pool.wait_full(5)
        assert factory.started == 2
    finally:
        await pool.close()


async def test_a_refill_after_a_call_waits_for_its_answer_to_leave(
    factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop that sends a call's answer would otherwise start the refill (the
    package prefix, the sandbox) first: a new session's first answer waited for it."""
    monkeypatch.setattr(pool_module, "ANSWER_S", 30.0)
    pool = factory.pool(size=2, refill_pause_s=60.0)
    pool.start()
    try:
        await pool.wait_full(5)
        assert await pool.take() is not None
        pool.resume()
        await asyncio.sleep(0.1)  # a refill would have started within milliseconds
        assert (factory.started, pool.filling) == (2, False)
    finally:
        await pool.close()


async def test_a_burst_that_takes_half_the_pool_refills_it_despite_the_pause(
    factory: Factory,
) -> None:
    """Each hand-out pauses the refill; a burst of them would hold it off until the pool
    ran dry, so the pause holds only while half of what the pool should hold is ready."""
    pool = factory.pool(size=4, refill_pause_s=30.0)
    pool.start()
    try:
        await pool.wait_full(5)
        for _ in range(2):
            assert await pool.take() is not None
        await asyncio.sleep(0.1)  # a refill would have started within milliseconds
        assert (factory.started, len(pool.ready)) == (4, 2)
        assert await pool.take() is not None  # one ready of the four
        await until(lambda: len(pool.ready) == 2)  # back to half, then paused again
        await asyncio.sleep(0.1)
        assert (factory.started, len(pool.ready)) == (5, 2)
    finally:
        await pool.close()


async def test_a_burst_of_starts_grows_it_within_its_budget(factory: Factory) -> None:
    pool = factory.pool(size=1, max_size=8, budget_bytes=200 * MIB)
    pool.start()
    try:
        for _ in range(6):
            await pool.wait_full(5)
            assert await pool.take() is not None
        assert pool.target() == 6
        await pool.wait_full(5)
        assert len(pool.ready) == 5, "five of 40 MiB fit 200 MiB; a sixth would not"
    finally:
        await pool.close()


async def test_it_grows_no_further_than_its_max_size(factory: Factory) -> None:
    pool = factory.pool(size=1, max_size=3)
    pool.start()
    try:
        for _ in range(5):
            await pool.wait_full(5)
            assert await pool.take() is not None
        assert pool.target() == 3
    finally:
        await pool.close()


async def test_it_starts_up_to_parallel_kernels_at_once(factory: Factory) -> None:
    factory.gate = asyncio.Event()
    pool = factory.pool(size=3, parallel=2)
    pool.start()
    try:
        await until(lambda: pool.status().starting == 2)
        factory.gate.set()
        await pool.wait_full(5)
        assert (factory.started, len(pool.ready)) == (3, 3)
    finally:
        await pool.close()


async def test_callers_wait_one_each_for_kernels_being_started(factory: Factory) -> None:
    factory.gate = asyncio.Event()
    pool = factory.pool(size=2, parallel=2)
    pool.start()
    try:
        await until(lambda: pool.status().starting == 2)
        first, second = (asyncio.create_task(pool.take()) for _ in range(2))
        await until(lambda: pool.waiting == 2)
        assert await pool.take() is None, "a third caller starts cold"
        factory.gate.set()
        assert None not in await asyncio.gather(first, second)
    finally:
        await pool.close()


async def test_a_failed_start_ends_the_wait_of_its_caller(factory: Factory) -> None:
    factory.gate, factory.failing = asyncio.Event(), True
    pool = factory.pool(size=1)
    pool.start()
    try:
        await until(lambda: pool.filling)
        taker = asyncio.create_task(pool.take())
        await until(lambda: pool.waiting == 1)
        factory.gate.set()
        assert await asyncio.wait_for(taker, 5) is None
    finally:
        await pool.close()


async def test_a_kernel_given_back_is_the_next_handed_out(factory: Factory) -> None:
    pool = factory.pool(size=2)
    pool.start()
    try:
        await pool.wait_full(5)
        taken = await pool.take()
        assert taken is not None
        pool.give_back(taken)
        again = await pool.take()
        assert again is taken and pool.taken == 1
    finally:
        await pool.close()
