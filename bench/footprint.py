"""Memory per session: idle and busy, one kernel at a time, and a fleet of idle sessions.

Every figure is summed over a kernel's whole process tree (`bench.memory.tree_memory`): for
corral the outer bwrap and its descendants (bwrap's child, the spawner, which also relays egress,
and the kernel), for the baseline the kernel process. Only one side's kernels run while
their memory is read, so shared pages are divided among the same kinds of processes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bench.baseline import BaselineKernel, BaselineRoots, baseline_kernel
from bench.fleet import baseline_fleet, corral_fleet
from bench.measure import (
    Paired,
    Plan,
    alternate,
    baseline_round_trip,
    corral_round_trip,
    log,
)
from bench.memory import MIB, TreeMemory, tree_memory
from bench.sandboxed import corral_session, sandbox_pid
from corral.kernels.sessions import SessionManager

MEMORY_FIELDS = ("pss", "uss", "rss")
# A typical data-analysis cell: the usual libraries, a plot saved, a 20 MiB array kept.
WORKLOAD = """\
import os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
frame = pd.DataFrame({"x": np.arange(1000), "y": np.random.default_rng(0).normal(size=1000)})
figure, axes = plt.subplots()
frame.plot(x="x", y="y", ax=axes)
figure.savefig(os.path.join(os.path.expanduser("~"), "bench-plot.png"))
plt.close(figure)
kept = np.ones(20 * 2**20 // 8)
"""
WORKLOAD_TEXT = (
    "`import numpy, pandas, matplotlib` with the Agg backend, a 1000-row DataFrame plotted "
    "and saved as a PNG in the home folder, and a 20 MiB numpy array (`np.ones`) kept alive"
)


@dataclass(frozen=True)
class Footprint:
    """One kernel's tree read idle (after `1+1`) and busy (after `WORKLOAD`)."""

    idle: TreeMemory
    busy: TreeMemory


async def _settled(pid: int, settle_s: float) -> TreeMemory:
    await asyncio.sleep(settle_s)
    return tree_memory(pid)


async def corral_footprint(manager: SessionManager, settle_s: float) -> Footprint:
    """A new session alone: read `settle_s` after `1+1`, then `settle_s` after the workload."""
    async with corral_session(manager) as session_id:
        await manager.create(session_id)
        await corral_round_trip(manager, session_id)
        idle = await _settled(sandbox_pid(manager, session_id), settle_s)
        result = await manager.calls.execute(manager.session_for(session_id), WORKLOAD)
        if not result.ok or result.kernel_restarted:
            raise RuntimeError(f"corral's workload ended {result.status}: {result.text()}")
        return Footprint(idle, await _settled(sandbox_pid(manager, session_id), settle_s))


def _pid(kernel: BaselineKernel) -> int:
    if kernel.pid is None:
        raise RuntimeError("the baseline kernel has no pid")
    return kernel.pid


async def baseline_footprint(roots: BaselineRoots, settle_s: float) -> Footprint:
    """A new baseline kernel alone, read as `corral_footprint` reads a session."""
    async with baseline_kernel(roots) as kernel:
        await kernel.start()
        await baseline_round_trip(kernel)
        idle = await _settled(_pid(kernel), settle_s)
        reply = await kernel.execute(WORKLOAD)
        if reply.get("status") != "ok":
            raise RuntimeError(f"the baseline's workload ended {reply.get('status')}: {reply}")
        return Footprint(idle, await _settled(_pid(kernel), settle_s))


def _mib(trees: list[TreeMemory], field: str) -> list[float]:
    return [getattr(tree, field) / MIB for tree in trees]


async def measure_memory(
    manager: SessionManager, roots: BaselineRoots, plan: Plan
) -> dict[str, Paired]:
    """MiB samples keyed "pss", "uss", "rss" (idle) and "busy_pss", "busy_uss", "busy_rss",
    plus "processes" (idle tree size), `plan.memory_sessions` per side, one kernel at a time.
    """
    log(
        f"memory: {plan.memory_sessions} sessions per side, idle then busy, "
        f"{plan.settle_s:g} s settle"
    )
    corral, baseline = await alternate(
        lambda: corral_footprint(manager, plan.settle_s),
        lambda: baseline_footprint(roots, plan.settle_s),
        plan.memory_sessions,
    )
    samples: dict[str, Paired] = {}
    for field in MEMORY_FIELDS:
        samples[field] = Paired(
            _mib([f.idle for f in corral], field), _mib([f.idle for f in baseline], field)
        )
        samples[f"busy_{field}"] = Paired(
            _mib([f.busy for f in corral], field), _mib([f.busy for f in baseline], field)
        )
    samples["processes"] = Paired(
        [float(f.idle.processes) for f in corral], [float(f.idle.processes) for f in baseline]
    )
    return samples


async def corral_fleet_memory(manager: SessionManager, count: int, settle_s: float) -> list[int]:
    """PSS in bytes of each of `count` idle sessions running together (each ran `1+1`)."""
    async with corral_fleet(manager, count) as session_ids:
        await asyncio.sleep(settle_s)
        return [tree_memory(sandbox_pid(manager, session_id)).pss for session_id in session_ids]


async def baseline_fleet_memory(roots: BaselineRoots, count: int, settle_s: float) -> list[int]:
    """PSS in bytes of each of `count` idle baseline kernels running together."""
    async with baseline_fleet(roots, count) as kernels:
        await asyncio.sleep(settle_s)
        return [tree_memory(_pid(kernel)).pss for kernel in kernels]


async def measure_fleet_memory(
    manager: SessionManager, roots: BaselineRoots, plan: Plan
) -> dict[str, Paired]:
    """MiB samples of `plan.fleet_sessions` idle sessions at once, then as many baseline
    kernels: "fleet_pss" (one sample per session) and "fleet_total" (one sample: the sum).

    `manager` must allow that many running sessions.
    """
    count = plan.fleet_sessions
    log(f"idle fleet: {count} sessions at once, then {count} baseline kernels")
    corral = await corral_fleet_memory(manager, count, plan.settle_s)
    baseline = await baseline_fleet_memory(roots, count, plan.settle_s)
    return {
        "fleet_pss": Paired([b / MIB for b in corral], [b / MIB for b in baseline]),
        "fleet_total": Paired([sum(corral) / MIB], [sum(baseline) / MIB]),
    }
