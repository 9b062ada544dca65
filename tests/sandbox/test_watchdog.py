"""The rlimit mechanism's watchdog on real processes of this test (no sandbox, no kernel):
reading a process tree from /proc, memory as a total, the CPU token bucket, and the
`RlimitBox` that acts on them.

Waits are bounded by deadlines on observable states (a process gone, a file written), not
sleeps; the CPU bound is a generous ratio of CPU time to wall time over a fixed run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from corral.sandbox import watchdog
from corral.sandbox.boxes import RlimitBox
from corral.sandbox.limits import Limits
from corral.sandbox.watchdog import CpuThrottle, Sample

MIB = 1024 * 1024
LIMITS = Limits(
    memory_bytes=512 * MIB,
    cpus=0.25,
    tasks=64,
    workspace_bytes=64 * MIB,
    tmp_bytes=32 * MIB,
    exec_timeout_s=30.0,
    idle_timeout_s=600.0,
    output_bytes=100_000,
)
# A parent that starts `count` children holding `mib` MiB each, then writes `ready`.
HOLDERS = """
import subprocess, sys, time
count, mib, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
code = f'b = bytearray({mib} << 20); import time; time.sleep(60)'
kids = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(count)]
open(ready, 'w').close()
time.sleep(60)
"""
SPINNERS = """
import os, time
for _ in range(2):
    if os.fork() == 0:
        break
while True:
    pass
"""


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; every one of their trees is killed afterwards."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        watchdog.kill_tree(process.pid)
        process.kill()
        process.wait()


def wait_for(condition: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not callable(condition) or not condition():
        assert time.monotonic() < deadline, "the state was not reached in time"
        time.sleep(0.02)


def holders(procs: list[subprocess.Popen[bytes]], tmp: Path, count: int, mib: int) -> int:
    ready = tmp / f"ready-{len(procs)}"
    process = subprocess.Popen([sys.executable, "-c", HOLDERS, str(count), str(mib), str(ready)])
    procs.append(process)
    wait_for(ready.exists)
    wait_for(lambda: _children_hold(process.pid, count, mib * MIB))
    return process.pid


def test_a_tree_is_read_parents_first(procs: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    root = holders(procs, tmp_path, 3, 1)
    pids = watchdog.tree_pids(root)
    assert pids[0] == root and len(pids) == 4
    assert set(pids[1:]) == {child.pid for child in psutil.Process(root).children()}


def test_a_sample_shows_threads_and_resident_memory(
    procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    root = holders(procs, tmp_path, 1, 64)
    child = watchdog.tree_pids(root)[1]
    found = watchdog.sample(child)
    assert found is not None and found.threads == 1
    assert found.rss_bytes >= 64 * MIB
    # PSS is the process's share of what is resident: above zero, at most its RSS (the host
    # may page some of it out or share it, so not necessarily all 64 MiB). The RSS the kernel
    # reports in stat and status is counted per thread in batches of up to 64 pages, so it
    # may lag the exact walk of smaps_rollup behind PSS by that much.
    lag = 64 * os.sysconf("SC_PAGE_SIZE") * found.threads
    assert 0 < watchdog.pss_bytes(child) <= found.rss_bytes + lag
    assert watchdog.sample(2**22 + 7) is None  # above pid_max's default: no such process


def test_memory_is_a_total_over_trees(procs: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    small = holders(procs, tmp_path, 1, 32)
    large = holders(procs, tmp_path, 2, 64)
    trees = {root: watchdog.sample_tree(root) for root in (small, large)}
    assert watchdog.over_memory(trees, 1024 * MIB) is None
    assert watchdog.over_memory(trees, 140 * MIB) == large  # each alone fits, both do not


def test_tasks_are_a_total_over_trees() -> None:
    trees = {1: [Sample(10, 0.0, 30, 0)], 2: [Sample(20, 0.0, 20, 0), Sample(21, 0.0, 20, 0)]}
    assert watchdog.over_tasks(trees, 70) is None
    assert watchdog.over_tasks(trees, 60) == 2


def test_a_tree_past_both_limits_is_named_for_its_tasks(
    procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A fork bomb's children each dirty a little memory, so between two looks the trees may
    pass the memory limit too; the cause to name is the task count."""
    root = holders(procs, tmp_path, 2, 32)
    trees = {root: watchdog.sample_tree(root)}
    threads = sum(s.threads for s in trees[root])
    assert watchdog.over_limit(trees, memory_bytes=16 * MIB, tasks=threads - 1) == ("tasks", root)
    assert watchdog.over_limit(trees, memory_bytes=16 * MIB, tasks=threads) == ("memory", root)
    assert watchdog.over_limit(trees, memory_bytes=1024 * MIB, tasks=threads) is None


def test_the_cpu_budget_stops_past_the_quota_and_continues_when_paid_back() -> None:
    throttle = CpuThrottle()
    assert not throttle.decide([Sample(1, 0.0, 1, 0)], 0.5, now=0.0)  # a fresh burst
    # Two CPUs busy for 0.1 s against half a CPU: 0.2 s used, 0.05 earned.
    assert throttle.decide([Sample(1, 0.2, 1, 0)], 0.5, now=0.1)
    # Stopped: nothing used, 0.05 s earned per 0.1 s, until the debt is gone.
    assert throttle.decide([Sample(1, 0.2, 1, 0)], 0.5, now=0.2)
    assert not throttle.decide([Sample(1, 0.2, 1, 0)], 0.5, now=0.5)
    # A quiet tree saves up at most BURST_S of quota.
    throttle.decide([Sample(1, 0.2, 1, 0)], 0.5, now=100.0)
    assert throttle.budget_s == pytest.approx(0.5 * watchdog.BURST_S)


def test_a_process_seen_first_counts_all_its_cpu_time() -> None:
    throttle = CpuThrottle()
    throttle.decide([], 1.0, now=0.0)
    assert throttle.decide([Sample(7, 0.5, 1, 0)], 1.0, now=0.05)


def test_rlimit_box_kills_the_largest_tree_past_the_total(
    procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    box = RlimitBox("wd-memory", LIMITS)
    small = holders(procs, tmp_path, 1, 64)
    large = holders(procs, tmp_path, 3, 160)  # 480 MiB: each child alone fits
    box.pids |= {small, large}
    box.check()
    assert box.counters().oom_kills == 1
    wait_for(lambda: not _alive(large))
    assert _alive(small)
    box.check()
    assert box.counters().oom_kills == 1  # what is left fits


def test_rlimit_box_holds_spinners_to_the_cpu_quota(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    box = RlimitBox("wd-cpu", LIMITS)
    process = subprocess.Popen([sys.executable, "-c", SPINNERS])
    procs.append(process)
    box.pids.add(process.pid)
    wait_for(lambda: len(watchdog.tree_pids(process.pid)) == 3)
    before = _cpu_s(process.pid)
    started = time.monotonic()
    while time.monotonic() - started < 3.0:
        box.check()
        time.sleep(watchdog.TICK_S)
    wall_s = time.monotonic() - started
    used_s = _cpu_s(process.pid) - before
    # Three spinners would use up to 3 x wall on free cores; the quota is 0.25 x wall.
    assert used_s < wall_s / 3, (used_s, wall_s)
    box.remove()
    wait_for(lambda: not _alive(process.pid))


def test_freeze_stops_every_process_and_thaw_continues_them(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    box = RlimitBox("wd-freeze", LIMITS)
    process = subprocess.Popen([sys.executable, "-c", SPINNERS])
    procs.append(process)
    box.pids.add(process.pid)
    wait_for(lambda: len(watchdog.tree_pids(process.pid)) == 3)
    box.freeze()
    wait_for(lambda: all(_stopped(pid) for pid in watchdog.tree_pids(process.pid)))
    box.thaw()
    wait_for(lambda: not any(_stopped(pid) for pid in watchdog.tree_pids(process.pid)))


def _children_hold(root: int, count: int, size: int) -> bool:
    children = watchdog.sample_tree(root)[1:]
    return len(children) == count and all(child.rss_bytes >= size for child in children)


def _cpu_s(root: int) -> float:
    return sum(s.cpu_s for s in watchdog.sample_tree(root))


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _stopped(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    except psutil.Error:
        return False
