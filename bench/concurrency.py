"""Executions per second with N sessions at once, beside N unsandboxed kernels (the floor).

For each level N, a round runs `plan.conc_execs` executions of `1+1` in total: each of N
sessions runs its share one after another, all N at once. A round gives one throughput
sample (executions / wall time from the first send to the last reply) and one latency
sample per execution. Corral's and the baseline's rounds alternate; both fleets are started
once, with the largest level's size, and every level uses their first N members.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

from bench.baseline import BaselineKernel, BaselineRoots
from bench.fleet import baseline_fleet, corral_fleet
from bench.measure import (
    Paired,
    Plan,
    alternate,
    baseline_round_trip,
    corral_round_trip,
    log,
    split,
)
from corral.kernels.sessions import SessionManager


@dataclass(frozen=True)
class Round:
    """One round of a level: its wall time and every execution's latency, in seconds."""

    wall_s: float
    latencies_s: tuple[float, ...]

    @property
    def per_s(self) -> float:
        """Executions per second over the whole round."""
        return len(self.latencies_s) / self.wall_s


async def _stream(one: Callable[[], Awaitable[float]], count: int) -> list[float]:
    """`count` executions in a row, each `one()` returning its seconds."""
    return [await one() for _ in range(count)]


async def run_round(streams: Sequence[Callable[[], Awaitable[list[float]]]]) -> Round:
    """Run every stream at once; their latencies and the wall time of all of them."""
    started = time.perf_counter()
    latencies = await asyncio.gather(*(stream() for stream in streams))
    wall = time.perf_counter() - started
    return Round(wall, tuple(value for stream in latencies for value in stream))


def corral_round(
    manager: SessionManager, session_ids: list[str], total: int
) -> Callable[[], Awaitable[Round]]:
    """A round of `total` executions over `session_ids`, each session its even share."""
    counts = split(total, len(session_ids))
    streams = [
        partial(_stream, partial(corral_round_trip, manager, session_id), count)
        for session_id, count in zip(session_ids, counts, strict=True)
    ]
    return partial(run_round, streams)


def baseline_round(kernels: list[BaselineKernel], total: int) -> Callable[[], Awaitable[Round]]:
    """A round of `total` executions over `kernels`, each kernel its even share."""
    counts = split(total, len(kernels))
    streams = [
        partial(_stream, partial(baseline_round_trip, kernel), count)
        for kernel, count in zip(kernels, counts, strict=True)
    ]
    return partial(run_round, streams)


def _paired(corral: list[Round], baseline: list[Round], level: int) -> dict[str, Paired]:
    """Throughput (executions/s, one sample per round) and latency (ms, one per execution)."""

    def latencies(rounds: list[Round]) -> list[float]:
        return [value * 1000 for r in rounds for value in r.latencies_s]

    return {
        f"exec_rate_{level}": Paired([r.per_s for r in corral], [r.per_s for r in baseline]),
        f"exec_latency_{level}": Paired(latencies(corral), latencies(baseline)),
    }


async def measure_concurrency(
    manager: SessionManager, roots: BaselineRoots, plan: Plan
) -> dict[str, Paired]:
    """Samples keyed "exec_rate_N" (executions/s) and "exec_latency_N" (ms) per level N.

    `manager` must allow the largest level's number of running sessions.
    """
    top = max(plan.concurrency)
    log(
        f"concurrency: {top} sessions and {top} baseline kernels; levels "
        f"{', '.join(map(str, plan.concurrency))}, {plan.conc_rounds} rounds of "
        f"{plan.conc_execs} executions per side and level"
    )
    samples: dict[str, Paired] = {}
    async with (
        corral_fleet(manager, top, plan.rt_warmup) as session_ids,
        baseline_fleet(roots, top, plan.rt_warmup) as kernels,
    ):
        for level in plan.concurrency:
            corral, baseline = await alternate(
                corral_round(manager, session_ids[:level], plan.conc_execs),
                baseline_round(kernels[:level], plan.conc_execs),
                plan.conc_rounds,
            )
            samples.update(_paired(corral, baseline, level))
    return samples
