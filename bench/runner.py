"""One benchmark run: set up both sides, take every measurement, clean up."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.baseline import BaselineRoots, home_parent
from bench.concurrency import measure_concurrency
from bench.disk import measure_disk_overshoot
from bench.egress import measure_egress
from bench.first_result import measure_new_sessions
from bench.footprint import measure_fleet_memory, measure_memory
from bench.measure import (
    Paired,
    Plan,
    measure_cold_start,
    measure_round_trip,
    measure_served_round_trip,
)
from bench.pool import measure_pool_start
from bench.sandboxed import corral_manager
from bench.system import load_average


async def collect(plan: Plan) -> dict[str, Paired]:
    """All samples of one run, keyed by measurement.

    The keys are "cold_start", "round_trip", "pool_start", "round_trip_rest",
    "round_trip_mcp", those of `measure_new_sessions`, `measure_memory`, `measure_fleet_memory` and
    `measure_concurrency`, "egress_" + each key of `measure_egress`, and those of
    `measure_disk_overshoot`.

    Temporary state, run and baseline directories are removed, the bench's server is shut
    down and every kernel is stopped before this returns or raises.
    """
    workdir = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    roots = BaselineRoots(
        sockets=Path(tempfile.mkdtemp(prefix="crbb", dir="/tmp")),
        homes=Path(tempfile.mkdtemp(prefix="crbh", dir=home_parent())),
    )
    try:
        samples = await _sessions(workdir, roots, plan)
        samples.update(await measure_new_sessions(workdir / "fresh", roots, plan))
        egress = await measure_egress(workdir / "egress", plan)
        samples.update({f"egress_{key}": paired for key, paired in egress.items()})
        samples.update(await measure_disk_overshoot(workdir / "disk", plan))
        return samples
    finally:
        shutil.rmtree(roots.sockets, ignore_errors=True)
        shutil.rmtree(roots.homes, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


async def _sessions(workdir: Path, roots: BaselineRoots, plan: Plan) -> dict[str, Paired]:
    """Every measurement made on the bench's own session manager (its pool off)."""
    async with corral_manager(workdir, max_sessions=plan.most_sessions + 1) as manager:
        samples = {
            "cold_start": await measure_cold_start(manager, roots, plan),
            "round_trip": await measure_round_trip(manager, roots, plan),
            "pool_start": await measure_pool_start(manager, workdir / "pool", plan),
        }
        served = await measure_served_round_trip(manager, workdir / "served", plan)
        samples.update({f"round_trip_{key}": paired for key, paired in served.items()})
        samples.update(await measure_memory(manager, roots, plan))
        samples.update(await measure_fleet_memory(manager, roots, plan))
        samples.update(await measure_concurrency(manager, roots, plan))
    return samples


def run_config(plan: Plan, *, mode: str, total_s: float) -> dict[str, Any]:
    """The plan as recorded in the results, with the mode (full, quick or smoke), the run's
    wall time and the load average at its end."""
    return {
        "mode": mode,
        "quick": mode != "full",
        **asdict(plan),
        "total_s": round(total_s, 1),
        "load_average_end": load_average(),
    }
