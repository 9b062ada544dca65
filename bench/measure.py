"""Sampling in one run, and the first measurements: cold start and `1+1` round trips.

Alternating (corral first on even runs, baseline first on odd ones; with three sides, each
goes first in turn) spreads any drift of the machine, such as another process waking up, over
every side instead of one.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil

from bench.baseline import BaselineKernel, BaselineRoots, baseline_kernel
from bench.sandboxed import corral_session
from bench.served import (
    create_served_session,
    mcp_client,
    mcp_execute,
    rest_client,
    rest_execute,
    served_corral,
)
from corral.kernels.sessions import SessionManager

CODE = "1+1"
T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    """How many samples to take. All counts are positive.

    `concurrency` lists the numbers of sessions run at once; each round of a level runs
    `conc_execs` executions in total, split evenly over its sessions, so `conc_execs` is at
    least the largest level.
    """

    cold_runs: int = 10
    cold_warmup: int = 1
    pool_runs: int = 20
    pool_warmup: int = 1
    rt_runs: int = 200
    rt_warmup: int = 5
    memory_sessions: int = 5
    settle_s: float = 1.0
    fleet_sessions: int = 64
    concurrency: tuple[int, ...] = (1, 8, 32)
    conc_execs: int = 400
    conc_rounds: int = 5
    egress_mib: int = 200
    egress_downloads: int = 7
    egress_download_warmup: int = 1
    egress_connections: int = 300
    egress_connect_warmup: int = 5
    egress_blocks: int = 5
    disk_runs: int = 5
    first_runs: int = 20
    first_warmup: int = 1
    churn_cycles: int = 20
    churn_rounds: int = 3

    def __post_init__(self) -> None:
        if not self.concurrency or min(self.concurrency) <= 0:
            raise ValueError(f"concurrency levels must be positive: {self.concurrency}")
        if self.conc_execs < max(self.concurrency):
            raise ValueError(
                f"{self.conc_execs} executions per round cannot keep "
                f"{max(self.concurrency)} sessions busy"
            )

    @property
    def most_sessions(self) -> int:
        """The most sessions one measurement runs at once (the fleet or the top level)."""
        return max(self.fleet_sessions, *self.concurrency)


@dataclass(frozen=True)
class Paired:
    """Samples of one metric: corral's and the baseline's, in the same unit."""

    corral: list[float]
    baseline: list[float]


def log(message: str) -> None:
    """Progress for the person running the bench, after the seconds since it started: on
    stderr, so stdout stays Markdown."""
    elapsed = time.time() - psutil.Process().create_time()
    print(f"[{elapsed:5.0f} s] {message}", file=sys.stderr, flush=True)


async def alternate(
    corral: Callable[[], Awaitable[T]],
    baseline: Callable[[], Awaitable[T]],
    runs: int,
    warmup: int = 0,
) -> tuple[list[T], list[T]]:
    """`warmup` discarded then `runs` kept samples of each side, alternating which goes first.

    Returns (corral's samples, the baseline's samples), each `runs` long, in run order.
    """
    corral_samples, baseline_samples = await rotate((corral, baseline), runs, warmup)
    return corral_samples, baseline_samples


async def rotate(
    samplers: Sequence[Callable[[], Awaitable[T]]], runs: int, warmup: int = 0
) -> list[list[T]]:
    """`warmup` discarded then `runs` kept samples of each sampler; run i starts with i mod n.

    Returns one list per sampler, in the order of `samplers`, each `runs` long, in run order.
    """
    kept: list[list[T]] = [[] for _ in samplers]
    for index in range(warmup + runs):
        first = index % len(samplers)
        for position in [*range(first, len(samplers)), *range(first)]:
            value = await samplers[position]()
            if index >= warmup:
                kept[position].append(value)
    return kept


def split(total: int, parts: int) -> list[int]:
    """`total` as `parts` counts differing by at most one (no zero counts)."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def to_ms(seconds: tuple[list[float], list[float]]) -> Paired:
    """Samples in seconds, as a `Paired` in milliseconds."""
    return Paired([s * 1000 for s in seconds[0]], [s * 1000 for s in seconds[1]])


# -- 1. cold session start ----------------------------------------------------------------


async def corral_cold_start(manager: SessionManager) -> float:
    """Seconds of `manager.create()` for a new session; deleting it is not timed."""
    async with corral_session(manager) as session_id:
        started = time.perf_counter()
        await manager.create(session_id)
        return time.perf_counter() - started


async def baseline_cold_start(roots: BaselineRoots) -> float:
    """Seconds from `start_kernel()` to `wait_for_ready()` returning; stopping is not timed."""
    async with baseline_kernel(roots) as kernel:
        started = time.perf_counter()
        await kernel.start()
        return time.perf_counter() - started


async def measure_cold_start(manager: SessionManager, roots: BaselineRoots, plan: Plan) -> Paired:
    """Cold start samples in milliseconds, `plan.cold_runs` per side after the warm-up."""
    log(f"cold start: {plan.cold_warmup} warm-up + {plan.cold_runs} runs per side")
    seconds = await alternate(
        lambda: corral_cold_start(manager),
        lambda: baseline_cold_start(roots),
        plan.cold_runs,
        plan.cold_warmup,
    )
    return to_ms(seconds)


# -- 2. round trip of 1+1 ---------------------------------------------------------------


async def corral_round_trip(manager: SessionManager, session_id: str) -> float:
    """Seconds of one `manager.calls.execute(session, "1+1")`; raises if it did not succeed."""
    started = time.perf_counter()
    result = await manager.calls.execute(manager.session_for(session_id), CODE)
    elapsed = time.perf_counter() - started
    if not result.ok or result.kernel_restarted:
        raise RuntimeError(f"corral's {CODE!r} ended {result.status}: {result.message}")
    return elapsed


async def baseline_round_trip(kernel: BaselineKernel) -> float:
    """Seconds of one baseline execute of "1+1" (idle on iopub and the shell reply)."""
    started = time.perf_counter()
    reply = await kernel.execute(CODE)
    elapsed = time.perf_counter() - started
    if reply.get("status") != "ok":
        raise RuntimeError(f"the baseline's {CODE!r} ended {reply.get('status')}")
    return elapsed


async def measure_round_trip(manager: SessionManager, roots: BaselineRoots, plan: Plan) -> Paired:
    """Round trip samples in milliseconds on one session and one baseline kernel."""
    log(f"round trip: {plan.rt_warmup} warm-up + {plan.rt_runs} runs per side")
    async with corral_session(manager) as session_id, baseline_kernel(roots) as kernel:
        await manager.create(session_id)
        await kernel.start()
        seconds = await alternate(
            lambda: corral_round_trip(manager, session_id),
            lambda: baseline_round_trip(kernel),
            plan.rt_runs,
            plan.rt_warmup,
        )
    return to_ms(seconds)


# -- 3. round trip of 1+1 through the server ----------------------------------------------

SERVED_BLOCK = 10  # consecutive calls of one side before the next side's turn


def _in_blocks(sample: Callable[[], Awaitable[float]]) -> Callable[[], Awaitable[list[float]]]:
    async def block() -> list[float]:
        return [await sample() for _ in range(SERVED_BLOCK)]

    return block


async def timed(sample: Callable[[], Awaitable[object]]) -> float:
    """Seconds `sample()` took; it raises when its execution did not succeed."""
    started = time.perf_counter()
    await sample()
    return time.perf_counter() - started


async def measure_served_round_trip(
    manager: SessionManager, workdir: Path, plan: Plan
) -> dict[str, Paired]:
    """`1+1` through REST and through MCP, each paired with in-process samples, in ms.

    `corral serve` runs in a process of its own; one session of its own serves both
    transports, and one session of `manager` the in-process side. The three take turns in
    blocks of `SERVED_BLOCK` consecutive calls, as an agent calls one session back to back
    (a turn per call would measure each call just after two other processes ran). Keys are
    "rest" and "mcp"; each `Paired` has the transport as corral, in-process as baseline.
    """
    log(f"round trip via REST and MCP: {plan.rt_warmup} warm-up + {plan.rt_runs} runs per side")
    async with (
        corral_session(manager) as session_id,
        served_corral(workdir) as served,
        rest_client(served) as rest,
        mcp_client(served) as mcp,
    ):
        await manager.create(session_id)
        await create_served_session(rest, session_id)
        blocks = await rotate(
            (
                _in_blocks(lambda: corral_round_trip(manager, session_id)),
                _in_blocks(lambda: timed(lambda: rest_execute(rest, session_id, CODE))),
                _in_blocks(lambda: timed(lambda: mcp_execute(mcp, session_id, CODE))),
            ),
            math.ceil(plan.rt_runs / SERVED_BLOCK),
            math.ceil(plan.rt_warmup / SERVED_BLOCK),
        )
        in_process, over_rest, over_mcp = (
            [value for block in side for value in block][: plan.rt_runs] for side in blocks
        )
    return {
        "rest": to_ms((over_rest, in_process)),
        "mcp": to_ms((over_mcp, in_process)),
    }
