"""The warm pool: python kernels with the default profile, started before anyone asks.

A new session whose profile is the default one (no mounts, no bridge, no limit changes)
takes a ready kernel instead of waiting about a second for a cold start; the pool then
refills in the background, up to `parallel` kernels at once (the server gives one per core
it may use: on two cores two starts at once made 2.7-3.1 kernels a second, one made 1.5).
It holds its size, or more while sessions start faster (as many as were handed out in the
last `RATE_WINDOW_S`, up to `max_size`), but never more memory (the kernels' proportional
set size, measured when each is ready) than its budget; it leaves room for the sessions the
server may still run, and empties itself when no session has been started from it for its
idle time.

A refill waits after a kernel is handed out, until a call ended and its answer left
(`resume`) or `refill_pause_s` passed: starting a kernel takes most of a core for about half
a second, and the session that just took one is about to run its first code, which would
otherwise wait for that core (on two cores its first `1+1` took three times as long); the
refill's first steps run on the event loop, which would otherwise send them before that
call's answer (a new session's first `1+1` over REST took 10.7 ms where an idle session's
took 7.3; with the answer first, both 6.5).

The pause holds only while at least half the kernels the pool should hold are ready: a
burst of new sessions, each pausing it again, would otherwise keep it from refilling until
it ran dry.

The pool knows nothing of sandboxes: the session manager gives it `spawn` (start one warm
kernel) and `discard` (stop one), and takes kernels with `take`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 30.0
RATE_WINDOW_S = 30.0  # hand-outs this recent size the pool past its configured size
ANSWER_S = 0.05  # after a call ends, the time its answer has to reach the client


class WarmKernel(Protocol):
    """What the pool needs of a kernel it holds."""

    @property
    def memory_bytes(self) -> int: ...

    async def alive(self) -> bool: ...


@dataclass(frozen=True)
class PoolConfig:
    size: int  # kernels held ready; 0 turns the pool off
    budget_bytes: int  # memory the ready kernels may hold together
    idle_s: float  # empty the pool when no session was started from it for this long
    refill_pause_s: float = 0.0  # no refill starts this soon after a hand-out (or a call ends)
    max_size: int = 0  # what recent hand-outs may grow it to; below `size`: no growth
    parallel: int = 1  # kernels started at once, at most


@dataclass(frozen=True)
class PoolStatus:
    """What the pool holds and has done since the server started (`WarmPool.status`)."""

    size: int  # the configured size; 0: the pool is off
    target: int  # kernels it should hold now (less with little room, 0 after its idle time)
    ready: int
    starting: int  # kernels being started for it now
    memory_bytes: int  # the ready kernels' PSS, measured when each became ready
    budget_bytes: int
    taken: int  # sessions that started from it
    missed: int  # sessions that asked and started cold
    failures: int  # kernels it could not start


W = TypeVar("W", bound=WarmKernel)


class WarmPool(Generic[W]):
    """Ready kernels, refilled by one background task. `start()` first, `close()` last."""

    def __init__(
        self,
        config: PoolConfig,
        spawn: Callable[[], Awaitable[W]],
        discard: Callable[[W], Awaitable[None]],
        room: Callable[[], int],
    ) -> None:
        self.config = config
        self._spawn = spawn
        self._discard = discard
        self._room = room  # how many more sessions the server may run now
        self.ready: deque[W] = deque()
        self.estimate_bytes = 0  # the memory of the last kernel measured
        self._starting: set[asyncio.Task[bool]] = set()  # kernels being started for it
        self._backoff_s = 1.0  # the wait after a failed start, doubled by each failure
        self._retry_at = 0.0  # no start before then, after a failure (monotonic)
        self.waiting = 0
        self.taken = 0
        self.missed = 0
        self.failures = 0
        self.last_active = time.monotonic()
        self._tick_s = max(0.5, min(30.0, config.idle_s / 4))  # a look at least this often
        self._quiet_until = 0.0  # the refill pause after a hand-out ends then (monotonic)
        self._handed: deque[float] = deque()  # when kernels were handed out, recent ones
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.config.size > 0:
            self._task = asyncio.create_task(self._fill_forever(), name="corral-warm-pool")

    @property
    def filling(self) -> bool:
        """A kernel is being started for the pool now."""
        return bool(self._starting)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for starting in list(self._starting):
            starting.cancel()  # the spawn stops what it started (`WarmHandOver._spawn`)
        await asyncio.gather(*self._starting, return_exceptions=True)
        while self.ready:
            await self._discard(self.ready.popleft())

    def status(self) -> PoolStatus:
        return PoolStatus(
            size=self.config.size,
            target=self.target(),
            ready=len(self.ready),
            starting=len(self._starting),
            memory_bytes=self.held_bytes(),
            budget_bytes=self.config.budget_bytes,
            taken=self.taken,
            missed=self.missed,
            failures=self.failures,
        )

    # -- taking ----------------------------------------------------------------------------

    async def take(self) -> W | None:
        """A live ready kernel, or None (start cold). Waits only for a kernel already
        half-started that no earlier caller is waiting for: it is closer than a cold one."""
        if self._task is None:
            return None
        self.last_active = time.monotonic()
        self.wake()
        while True:
            while self.ready:
                kernel = self.ready.popleft()
                if await kernel.alive():
                    self.taken += 1
                    self._quiet_until = time.monotonic() + self.config.refill_pause_s
                    self._handed.append(time.monotonic())
                    self.wake()
                    return kernel
                await self._discard(kernel)
            if self.waiting >= len(self._starting):  # one waiter per kernel being started
                self.missed += 1
                return None
            self.waiting += 1
            try:
                self._changed.clear()
                await self._changed.wait()
            finally:
                self.waiting -= 1

    def give_back(self, kernel: W) -> None:
        """A kernel taken but not used (the session changed meanwhile) goes back first."""
        self.taken -= 1
        self.ready.appendleft(kernel)
        self._changed.set()
        self.wake()

    # -- filling ---------------------------------------------------------------------------

    def wake(self) -> None:
        """Look again at what the pool should hold (after a session stopped, for one)."""
        self._wake.set()

    def resume(self) -> None:
        """A call ended: a refill held back for the call of a session just handed a kernel
        may start once the call's answer had `ANSWER_S` to leave (the event loop that
        sends it would otherwise start the refill first)."""
        if self._quiet_until:
            self._quiet_until = min(self._quiet_until, time.monotonic() + ANSWER_S)
            self.wake()

    def target(self) -> int:
        """How many kernels the pool should hold now: its size, or the hand-outs of the last
        `RATE_WINDOW_S` (up to `max_size`: enough for a burst like the last one), within
        the room for sessions; none when off or idle."""
        now = time.monotonic()
        if self.config.size <= 0 or now - self.last_active > self.config.idle_s:
            return 0
        while self._handed and now - self._handed[0] > RATE_WINDOW_S:
            self._handed.popleft()
        wanted = max(self.config.size, min(len(self._handed), self.config.max_size))
        return max(0, min(wanted, self._room()))

    def held_bytes(self) -> int:
        return sum(kernel.memory_bytes for kernel in self.ready)

    def _fits_another(self, starting: int = 0) -> bool:
        """One more kernel, beside `starting` ones being started, fits the budget."""
        held = self.held_bytes() + (starting + 1) * self.estimate_bytes
        return held <= self.config.budget_bytes

    async def wait_full(self, timeout_s: float) -> None:
        """Return once the pool holds its target; raises `TimeoutError` after `timeout_s`."""
        self.last_active = time.monotonic()
        async with asyncio.timeout(timeout_s):
            while len(self.ready) < self.target() and self._fits_another():
                self.wake()
                self._changed.clear()
                await self._changed.wait()

    async def _fill_forever(self) -> None:
        while True:
            try:
                await self._trim()
            except Exception:  # a kernel that would not stop: the next round tries again
                log.exception("the warm pool could not stop a kernel")
                await asyncio.sleep(self._backoff_s)
                continue
            if self._another_wanted():
                now = time.monotonic()
                if (pause := max(self._quiet(), self._retry_at) - now) > 0:
                    # A session just handed a kernel runs first; a failed start backs off.
                    await self._wait_for_wake(pause)
                    continue
                task = asyncio.create_task(self._fill_one(), name="corral-warm-pool-start")
                self._starting.add(task)
                task.add_done_callback(self._started)
                continue
            await self._wait_for_wake(self._tick_s)

    def _quiet(self) -> float:
        """When the refill pause after a hand-out ends: at once while fewer than half
        the kernels the pool should hold are ready (a burst of new sessions, each of
        which would otherwise push the pause on until the pool ran dry)."""
        return self._quiet_until if 2 * len(self.ready) >= self.target() else 0.0

    def _another_wanted(self) -> bool:
        starting = len(self._starting)
        return (
            len(self.ready) + starting < self.target()
            and starting < self.config.parallel
            and self._fits_another(starting)
        )

    def _started(self, task: asyncio.Task[bool]) -> None:
        self._starting.discard(task)
        self._changed.set()  # a caller waiting for this start sees it ended
        if task.cancelled():
            return
        if task.result():
            self._backoff_s = 1.0
        else:
            self._retry_at = time.monotonic() + self._backoff_s
            self._backoff_s = min(MAX_BACKOFF_S, self._backoff_s * 2)
        self.wake()

    async def _wait_for_wake(self, timeout_s: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._wake.wait()

    async def _fill_one(self) -> bool:
        try:
            kernel = await self._spawn()
        except Exception as exc:
            self.failures += 1
            log.warning("the warm pool could not start a kernel: %s", exc)
            return False
        finally:
            self._changed.set()
        self.estimate_bytes = kernel.memory_bytes
        self.ready.append(kernel)
        self.last_active = time.monotonic()  # idle time counts from the last take or fill
        self._changed.set()
        return True

    async def _trim(self) -> None:
        """Stop kernels past the target (idle, less room) or past the memory budget."""
        while self.ready and (
            len(self.ready) > self.target() or self.held_bytes() > self.config.budget_bytes
        ):
            await self._discard(self.ready.pop())
            self._changed.set()
