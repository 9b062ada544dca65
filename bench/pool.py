"""Session start from the warm pool, beside a cold start measured in the same rotation.

The pooled side is a second manager with the default pool (`Settings.pool_size`); the cold
side is the bench's manager, whose pool is off. Before every sample of either side the pool
is waited for until full (not timed), so no kernel is being started in the background while
a sample is taken.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.measure import Paired, Plan, alternate, corral_cold_start, log, to_ms
from bench.sandboxed import corral_manager, corral_session
from corral.kernels.sessions import SessionManager

FILL_TIMEOUT_S = 120.0


async def pool_start(pooled: SessionManager) -> float:
    """Seconds of `create(start=True)` taken from a full pool; deleting is not timed.

    Raises `RuntimeError` when the session's kernel did not come from the pool.
    """
    await pooled.pool.wait_full(FILL_TIMEOUT_S)
    async with corral_session(pooled) as session_id:
        started = time.perf_counter()
        info = await pooled.create(session_id, start=True)
        elapsed = time.perf_counter() - started
        if not info.from_pool:
            raise RuntimeError(f"session {session_id} started cold although the pool was full")
        return elapsed


async def quiet_cold_start(cold: SessionManager, pooled: SessionManager) -> float:
    """Seconds of a cold `create()` on `cold`, once `pooled` is full and quiet."""
    await pooled.pool.wait_full(FILL_TIMEOUT_S)
    return await corral_cold_start(cold)


def _require_pool(pooled: SessionManager) -> None:
    """Fail loudly when the pool is off by default: there would be nothing to measure."""
    if pooled.settings.pool_size <= 0:
        raise RuntimeError("the warm pool is off by default (Settings.pool_size is 0)")


async def measure_pool_start(cold: SessionManager, workdir: Path, plan: Plan) -> Paired:
    """Start samples in ms: from the pool as corral's side, cold on `cold` as the baseline.

    `cold` must have its pool off; the pooled manager keeps its state in `workdir`.
    """
    log(f"pool start: {plan.pool_warmup} warm-up + {plan.pool_runs} runs per side")
    async with corral_manager(workdir, pool=True) as pooled:
        _require_pool(pooled)
        seconds = await alternate(
            lambda: pool_start(pooled),
            lambda: quiet_cold_start(cold, pooled),
            plan.pool_runs,
            plan.pool_warmup,
        )
    return to_ms(seconds)
