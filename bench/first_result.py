"""What a new session costs an agent, through the real server: its first result, and churn.

Time to first result: create a session, then run its first `1+1`, over REST and over MCP
(`start_python_session`, then `execute_python_code`), against `corral serve` with its default
warm pool, full before each sample (waited for through `GET /v1/admin/pool`, not timed).
The baseline is the same first result under plain jupyter_client: an unsandboxed kernel
started before the sample, as a pool holds one, then its first `1+1`.

Churn: cycles of create / `1+1` / delete over REST, back to back, nothing waited for between
them (the pool refills as it can); a sample per cycle, and the cycles per second of each
round. The baseline cycle: start an unsandboxed kernel, `1+1`, stop it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from mcp import Client

from bench.baseline import BaselineRoots, baseline_kernel
from bench.http1 import KeepAliveClient
from bench.measure import (
    CODE,
    Paired,
    Plan,
    alternate,
    baseline_round_trip,
    log,
    rotate,
    to_ms,
)
from bench.sandboxed import new_session_id
from bench.served import (
    create_served_session,
    delete_served_session,
    mcp_client,
    mcp_execute,
    rest_client,
    rest_execute,
    served_corral,
    wait_pool_full,
)


@dataclass(frozen=True)
class Clients:
    """The clients of one pooled server: REST (agent), MCP (agent), REST (admin)."""

    rest: KeepAliveClient
    mcp: Client
    admin: KeepAliveClient


@asynccontextmanager
async def pooled_server(workdir: Path) -> AsyncIterator[Clients]:
    """`corral serve` with its default warm pool, and its three clients."""
    async with (
        served_corral(workdir, pool=True) as served,
        rest_client(served) as rest,
        mcp_client(served) as mcp,
        rest_client(served, admin=True) as admin,
    ):
        yield Clients(rest, mcp, admin)


async def rest_first_result(clients: Clients) -> float:
    """Seconds from POST /v1/sessions to the first `1+1`'s result, the pool full before."""
    await wait_pool_full(clients.admin)
    session_id = new_session_id()
    started = time.perf_counter()
    await create_served_session(clients.rest, session_id)
    await rest_execute(clients.rest, session_id, CODE)
    elapsed = time.perf_counter() - started
    await delete_served_session(clients.rest, session_id)
    return elapsed


async def mcp_first_result(clients: Clients) -> float:
    """Seconds from the start_python_session tool to the first `1+1`'s result over MCP."""
    await wait_pool_full(clients.admin)
    session_id = new_session_id()
    started = time.perf_counter()
    reply = await clients.mcp.call_tool("start_python_session", {"session_id": session_id})
    if reply.is_error:
        raise RuntimeError(f"MCP start_python_session failed: {reply.content}")
    await mcp_execute(clients.mcp, session_id, CODE)
    elapsed = time.perf_counter() - started
    await delete_served_session(clients.rest, session_id)
    return elapsed


async def baseline_first_result(roots: BaselineRoots) -> float:
    """Seconds of the first `1+1` of a plain kernel started (not timed) just before."""
    async with baseline_kernel(roots) as kernel:
        await kernel.start()
        return await baseline_round_trip(kernel)


async def rest_cycle(clients: Clients) -> float:
    """Seconds of one create / `1+1` / delete over REST."""
    session_id = new_session_id()
    started = time.perf_counter()
    await create_served_session(clients.rest, session_id)
    await rest_execute(clients.rest, session_id, CODE)
    await delete_served_session(clients.rest, session_id)
    return time.perf_counter() - started


async def baseline_cycle(roots: BaselineRoots) -> float:
    """Seconds of one start / `1+1` / stop of a plain kernel (the directories not timed)."""
    async with baseline_kernel(roots) as kernel:
        started = time.perf_counter()
        await kernel.start()
        reply = await kernel.execute(CODE)
        await kernel.stop()
        elapsed = time.perf_counter() - started
    if reply.get("status") != "ok":
        raise RuntimeError(f"the baseline's {CODE!r} ended {reply.get('status')}")
    return elapsed


async def measure_new_sessions(
    workdir: Path, roots: BaselineRoots, plan: Plan
) -> dict[str, Paired]:
    """Keys "first_result_rest", "first_result_mcp" and "churn_cycle" (ms), "churn_rate"
    (cycles per second, one sample per round)."""
    log(f"first result: {plan.first_warmup} warm-up + {plan.first_runs} runs per side")
    async with pooled_server(workdir) as clients:
        rest, mcp, baseline = await rotate(
            (
                lambda: rest_first_result(clients),
                lambda: mcp_first_result(clients),
                lambda: baseline_first_result(roots),
            ),
            plan.first_runs,
            plan.first_warmup,
        )
        log(f"churn: {plan.churn_rounds} rounds of {plan.churn_cycles} cycles per side")
        await wait_pool_full(clients.admin)
        corral_rounds, baseline_rounds = await alternate(
            lambda: _round(lambda: rest_cycle(clients), plan.churn_cycles),
            lambda: _round(lambda: baseline_cycle(roots), plan.churn_cycles),
            plan.churn_rounds,
        )
    return {
        "first_result_rest": to_ms((rest, baseline)),
        "first_result_mcp": to_ms((mcp, baseline)),
        "churn_cycle": to_ms(
            ([s for r in corral_rounds for s in r[1]], [s for r in baseline_rounds for s in r[1]])
        ),
        "churn_rate": Paired(
            [plan.churn_cycles / r[0] for r in corral_rounds],
            [plan.churn_cycles / r[0] for r in baseline_rounds],
        ),
    }


async def _round(cycle: Callable[[], Awaitable[float]], cycles: int) -> tuple[float, list[float]]:
    """`cycles` cycles back to back: the round's wall seconds and each cycle's."""
    started = time.perf_counter()
    samples = [await cycle() for _ in range(cycles)]
    return time.perf_counter() - started, samples
