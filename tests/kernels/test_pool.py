"""The warm pool against real sandboxes: taking, refilling, budgets, idling, cold profiles."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from corral.config import Settings
from corral.errors import InvalidInput
from corral.kernels.results import ExecutionResult
from corral.kernels.sessions import SessionManager
from corral.server.operation import wire
from corral.server.schemas import AuditPageModel, PoolModel
from corral.service import Service
from tests.loopback import HOST, serve_directory

pytestmark = pytest.mark.bwrap
FILL_TIMEOUT_S = 90.0
KERNEL_MIB = 1024 * 1024


@pytest.fixture
async def pooled(settings: Settings) -> AsyncIterator[Service]:
    """A service keeping two kernels ready, filled before the test starts."""
    async with Service(replace(settings, pool_size=2)) as service:
        await service.sessions.pool.wait_full(FILL_TIMEOUT_S)
        yield service


def pool_dir(settings: Settings) -> Path:
    return settings.sessions_dir / ".pool"


def kernel_processes(settings: Settings) -> list[psutil.Process]:
    """The sandboxes of the service under test: outer bwrap processes naming its run root
    (other services of this test process, such as the shared ones, have their own)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            parent = child.parent()
            outer = child.name() == "bwrap" and (parent is None or parent.name() != "bwrap")
            if outer and str(settings.run_root) in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def running(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def run(
    service: Service, session_id: str | None, code: str, language: str = "python"
) -> ExecutionResult:
    return await service.executions.run(code, session_id=session_id, language=language)


async def wait_until(check: object, timeout_s: float = 30.0) -> bool:
    """Poll `check()` every 0.1 s for at most `timeout_s`; True once it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_new_session_takes_a_ready_kernel_and_owns_its_folders(pooled: Service) -> None:
    info = await pooled.create_session("taker")
    assert info.from_pool and info.kernels == ("python",)
    result = await run(
        pooled, "taker", "import os; open('mine.txt','w').write('taken'); print(os.getcwd())"
    )
    assert result.status == "ok" and result.stdout == "/workspace\n"
    assert (info.workspace / "mine.txt").read_text() == "taken"
    assert info.workspace == pooled.settings.sessions_dir / "taker" / "workspace"
    assert [s.id for s in pooled.list_sessions()] == ["taker"]
    assert not any(p.name.startswith("@pool") for p in pooled.settings.sessions_dir.iterdir())


async def test_a_pool_session_is_a_whole_session(pooled: Service) -> None:
    """Limits, packages, files and restart behave as in a cold session."""
    await pooled.create_session("whole")
    limits = pooled.controls.limits("whole")
    assert limits.usage is not None and limits.usage.tasks >= 1
    prefix = await run(pooled, "whole", "import sys; print(sys.prefix)")
    assert prefix.stdout.strip() == "/opt/corral/env"
    pooled.files.write("whole", "in.txt", b"from the files api")
    read = await run(pooled, "whole", "print(open('in.txt').read())")
    assert read.stdout == "from the files api\n"
    await pooled.restart_session("whole")
    again = await run(pooled, "whole", "print(open('in.txt').read())")
    assert again.stdout == "from the files api\n"
    bash = await run(pooled, "whole", "cat in.txt", language="bash")
    assert bash.stdout.strip() == "from the files api"


async def test_a_primed_pool_kernel_looks_new_to_its_session(pooled: Service) -> None:
    """The pool shows each kernel a first result ahead of time; none of it stays behind."""
    info = await pooled.create_session("fresh")
    assert info.from_pool
    probe = "print(repr(_), Out, len(In), [n for n in dir() if n[:1] == '_' and n[1:].isdigit()])"
    result = await run(pooled, "fresh", probe)
    assert (result.stdout, result.execution_count) == ("'' {} 2 []\n", 1)
    shown = await run(pooled, "fresh", "6*7")
    assert shown.results[0]["text/plain"] == "42" and shown.execution_count == 2


async def test_the_pool_reports_what_it_holds_and_what_it_gave(pooled: Service) -> None:
    held = wire(PoolModel, pooled.controls.pool())
    assert (held["size"], held["target"], held["ready"], held["taken"]) == (2, 2, 2, 0)
    assert 0 < held["memory_bytes"] <= held["budget_bytes"]
    await pooled.create_session("counted")
    assert pooled.controls.pool().taken == 1


async def test_the_pool_refills_after_a_take(pooled: Service) -> None:
    pool = pooled.sessions.pool
    await pooled.create_session("first")
    await pooled.create_session("second")
    assert pool.taken == 2
    await pool.wait_full(FILL_TIMEOUT_S)
    assert len(pool.ready) == 2
    third = await pooled.create_session("third")
    assert third.from_pool


async def test_sessions_from_the_pool_share_nothing(pooled: Service) -> None:
    await pooled.create_session("left")
    await pooled.create_session("right")
    await run(pooled, "left", "secret = 'left-only'; open('l.txt','w').write('l')")
    seen = await run(pooled, "right", "import os; print(os.listdir('.'), 'secret' in globals())")
    assert seen.stdout == "[] False\n"


async def test_the_egress_socket_speaks_for_the_session_that_took_it(
    pooled: Service, tmp_path: Path
) -> None:
    (tmp_path / "page.txt").write_text("hello")
    await pooled.create_session("netpool")
    fetch = "curl -s -o /dev/null -w '%{http_code}' http://{host}:{port}/page.txt"
    with serve_directory(tmp_path) as port:
        code = fetch.replace("{host}", HOST).replace("{port}", str(port))
        refused = await run(pooled, "netpool", code, language="bash")
        assert refused.stdout.strip() == "403"
        text = await run(
            pooled, "netpool", f"curl -s http://{HOST}:{port}/page.txt", language="bash"
        )
        assert "corral net allow netpool" in text.stdout
        await pooled.network.allow("netpool", [f"{HOST}:{port}"])
        allowed = await run(pooled, "netpool", code, language="bash")
        assert allowed.stdout.strip() == "200"
    decisions = wire(AuditPageModel, await pooled.audit.page(kind="network", session="netpool"))[
        "entries"
    ]
    assert decisions, "the proxy's decisions are audited under the session's name"


async def test_non_default_profiles_start_cold(settings: Settings, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "readme.txt").write_text("project file")
    changed = replace(settings, pool_size=2, mounts=f"proj={project}")
    async with Service(changed) as service:
        await service.sessions.pool.wait_full(FILL_TIMEOUT_S)
        mounted = await service.create_session("mounted", mounts=["proj"])
        assert not mounted.from_pool
        read = await run(service, "mounted", "print(open('proj/readme.txt').read())")
        assert read.stdout == "project file\n"

        await service.sessions.create("limited", start=False)
        await service.controls.set_limits("limited", {"memory_bytes": 300 * KERNEL_MIB})
        limited = await service.start_session("limited")
        assert not limited.from_pool
        assert service.controls.limits("limited").limits.memory_bytes == 300 * KERNEL_MIB

        await service.create_session("resumed")
        await run(service, "resumed", "open('kept.txt','w').write('kept')")
        await service.stop_session("resumed")
        resumed = await service.start_session("resumed")
        assert not resumed.from_pool
        kept = await run(service, "resumed", "print(open('kept.txt').read())")
        assert kept.stdout == "kept\n"
        assert len(service.sessions.pool.ready) >= 1, "cold starts leave the pool alone"


async def test_a_budget_smaller_than_a_kernel_holds_none(settings: Settings) -> None:
    tight = replace(settings, pool_size=2, pool_memory_bytes=16 * KERNEL_MIB)
    async with Service(tight) as service:
        pool = service.sessions.pool
        assert await wait_until(lambda: pool.estimate_bytes > 0, FILL_TIMEOUT_S)
        assert await wait_until(lambda: not pool.filling and not pool.ready)
        assert pool.estimate_bytes > tight.pool_memory_bytes
        await asyncio.sleep(1.0)  # the filler has had a chance to try again, and must not
        assert not pool.ready and not pool.filling
        info = await service.create_session("cold")
        assert not info.from_pool
        assert (await run(service, "cold", "1+1")).results == [{"text/plain": "2"}]


async def test_the_budget_caps_how_many_are_held(settings: Settings) -> None:
    async with Service(replace(settings, pool_size=3)) as service:
        pool = service.sessions.pool
        assert await wait_until(lambda: pool.estimate_bytes > 0, FILL_TIMEOUT_S)
        one = pool.estimate_bytes
    budget = int(one * 1.6)
    async with Service(replace(settings, pool_size=3, pool_memory_bytes=budget)) as service:
        pool = service.sessions.pool
        await pool.wait_full(FILL_TIMEOUT_S)
        await asyncio.sleep(1.0)
        assert len(pool.ready) == 1
        assert pool.held_bytes() <= budget
        print(f"one pool kernel: {one / KERNEL_MIB:.1f} MiB PSS; budget {budget / KERNEL_MIB:.1f}")


async def test_the_pool_empties_when_idle_and_refills_on_demand(settings: Settings) -> None:
    async with Service(replace(settings, pool_size=2, pool_idle_s=1.0)) as service:
        pool = service.sessions.pool
        await pool.wait_full(FILL_TIMEOUT_S)
        assert await wait_until(lambda: not pool.ready and not pool.filling, 30)
        assert await wait_until(lambda: not kernel_processes(settings), 10)
        assert await wait_until(lambda: not any(pool_dir(settings).iterdir()), 10)
        info = await service.create_session("after-idle")
        assert not info.from_pool
        assert await wait_until(lambda: len(pool.ready) >= 1, FILL_TIMEOUT_S)


async def test_the_pool_leaves_room_for_sessions(settings: Settings) -> None:
    async with Service(replace(settings, pool_size=2, max_sessions=2)) as service:
        pool = service.sessions.pool
        await pool.wait_full(FILL_TIMEOUT_S)
        await service.create_session("one")
        await service.create_session("two")
        assert pool.target() == 0
        assert await wait_until(lambda: not pool.ready and not pool.filling, 30)
        assert len(kernel_processes(settings)) == 2


async def test_a_dead_pool_kernel_is_never_handed_out(pooled: Service) -> None:
    pool = pooled.sessions.pool
    pids = [warm.session.kernels["python"].pid for warm in pool.ready]
    for pid in pids:
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
    assert await wait_until(lambda: not any(map(running, pids)), 10)
    info = await pooled.create_session("after-kill")
    result = await run(pooled, "after-kill", "1+1")
    assert result.results == [{"text/plain": "2"}] and not result.kernel_restarted, result
    assert info.kernels == ("python",)


async def test_the_default_session_comes_from_the_pool(pooled: Service) -> None:
    result = await run(pooled, None, "import os; print(os.getcwd())")
    assert result.stdout == "/workspace\n"
    assert pooled.get_session("default").from_pool


async def test_closing_stops_every_pool_kernel(settings: Settings) -> None:
    manager = SessionManager(replace(settings, pool_size=2))
    await manager.open()
    await manager.pool.wait_full(FILL_TIMEOUT_S)
    assert len(kernel_processes(settings)) == 2
    await manager.close()
    assert await wait_until(lambda: not kernel_processes(settings), 10)
    assert not pool_dir(settings).exists() or not any(pool_dir(settings).iterdir())
    assert not any(settings.run_root.iterdir()) or all(
        p.name == "egress" for p in settings.run_root.iterdir()
    )


def test_pool_size_zero_turns_it_off_and_negative_is_refused() -> None:
    assert Settings.from_env({"CORRAL_POOL_SIZE": "0"}).pool_size == 0
    with pytest.raises(InvalidInput, match="CORRAL_POOL_SIZE"):
        Settings.from_env({"CORRAL_POOL_SIZE": "-1"})
    assert Settings.from_env({"CORRAL_POOL_MEMORY_BYTES": "1G"}).pool_memory_bytes == 1 << 30
