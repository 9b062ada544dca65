"""How far past its workspace limit a writer gets before the disk patrol stops it.

Each sample starts a fresh session whose workspace limit is `LIMIT_MIB`, runs one writer in
it until the patrol stops it, and measures what the session holds on disk right after the
result came back, the way the patrol does (`corral.sandbox.disk.measure`). corral's side is
that overshoot (MiB past the limit); the baseline is what the same writer puts down in one
patrol tick (`TICK_S`) at the rate it wrote in that sample (bytes on disk / time it ran), so
their ratio is the overshoot counted in ticks of writing.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.measure import Paired, Plan, log
from bench.sandboxed import corral_manager, new_session_id
from corral.kernels.sessions import SessionManager
from corral.sandbox.disk import TICK_S, measure

MIB = 1024 * 1024
LIMIT_MIB = 64
# The writers: Python writing 1 MiB files, a shell loop of dd, and four such loops at once.
WRITERS = {
    "python": (
        "i = 0\nwhile True:\n    open(f'/workspace/f{i}', 'wb').write(b'x' * (1 << 20)); i += 1\n"
    ),
    "dd": (
        "import subprocess\nsubprocess.run(['bash', '-c', 'for i in $(seq 1000); do dd "
        "if=/dev/zero of=/workspace/d$i bs=1M count=16 status=none; done'])\n"
    ),
    "dd4": (
        "import subprocess\nsubprocess.run(['bash', '-c', 'for j in 1 2 3 4; do (for i in "
        "$(seq 1000); do dd if=/dev/zero of=/workspace/d$j.$i bs=1M count=16 status=none; "
        "done) & done; wait'])\n"
    ),
}


async def overshoot(manager: SessionManager, code: str) -> tuple[float, float]:
    """(MiB past the limit at the stop, MiB the writer wrote per tick) for one sample."""
    session_id = new_session_id()
    await manager.create(session_id)
    try:
        started = time.perf_counter()
        result = await manager.calls.execute(manager.session_for(session_id), code, timeout_s=60)
        elapsed = time.perf_counter() - started
        if result.limit != "disk":
            raise RuntimeError(f"the writer was not stopped by the disk limit: {result.text()}")
        used = measure(manager.session(session_id)._written_paths())[0] / MIB
        return max(0.0, used - LIMIT_MIB), used / elapsed * TICK_S
    finally:
        await manager.delete(session_id)


async def measure_disk_overshoot(workdir: Path, plan: Plan) -> dict[str, Paired]:
    """Samples per writer, keyed "disk_overshoot_" + the writer's name."""
    samples: dict[str, Paired] = {}
    async with corral_manager(workdir, workspace_bytes=LIMIT_MIB * MIB) as manager:
        for name, code in WRITERS.items():
            log(f"disk overshoot: {plan.disk_runs} runs of the {name} writer")
            pairs = [await overshoot(manager, code) for _ in range(plan.disk_runs)]
            samples[f"disk_overshoot_{name}"] = Paired(
                [past for past, _ in pairs], [tick for _, tick in pairs]
            )
    return samples
