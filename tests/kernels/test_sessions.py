"""Session lifecycle against real sandboxes: ids, limits, idle, persistence across restarts."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from corral.config import Settings
from corral.errors import (
    InvalidInput,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    TooManySessions,
)
from corral.kernels.sessions import validate_session_id
from corral.service import Service
from tests.wheels import tiny_wheel


@pytest.mark.parametrize("bad", ["", ".hidden", "../etc", "a/b", "-x", "x" * 65, "é", "a b", 7])
def test_invalid_session_ids_are_refused(bad: object) -> None:
    with pytest.raises(InvalidInput, match="invalid session id"):
        validate_session_id(bad)


@pytest.mark.parametrize("good", ["a", "default", "A.b_c-9", "x" * 64])
def test_valid_session_ids_pass(good: str) -> None:
    assert validate_session_id(good) == good


async def test_unknown_session_is_a_clear_error(service: Service) -> None:
    with pytest.raises(SessionNotFound, match="Session 'ghost' not found"):
        await service.executions.run("1", session_id="ghost")
    with pytest.raises(SessionNotFound):
        service.get_session("ghost")


async def test_invalid_id_on_execute_is_refused_before_anything_runs(service: Service) -> None:
    with pytest.raises(InvalidInput):
        await service.executions.run("1", session_id="../../etc")
    assert service.list_sessions() == []


async def test_unknown_language_is_refused(service: Service) -> None:
    with pytest.raises(InvalidInput, match="unknown language"):
        await service.executions.run("1", language="ruby")


async def test_calls_without_a_session_use_the_default_session(service: Service) -> None:
    await service.executions.run("x = 5")
    result = await service.executions.run("x * 2")
    assert result.results == [{"text/plain": "10"}]
    assert result.session_id == "default"


async def test_create_list_get_stop_restart(service: Service) -> None:
    info = await service.create_session()
    assert info.state == "idle" and info.kernels == ("python",)
    assert [s.id for s in service.list_sessions()] == [info.id]
    with pytest.raises(SessionExists):
        await service.create_session(info.id)
    await service.executions.run("v = 1", session_id=info.id)
    restarted = await service.restart_session(info.id)
    assert restarted.state == "idle"
    gone = await service.executions.run("'v' in dir()", session_id=info.id)
    assert gone.results == [{"text/plain": "False"}]
    stopped = await service.stop_session(info.id)
    assert stopped.state == "stopped" and stopped.kernels == ()
    assert (await service.executions.run("1", session_id=info.id)).status == "ok"


async def test_maximum_number_of_running_sessions(settings: Settings) -> None:
    async with Service(replace(settings, max_sessions=2)) as service:
        await service.create_session("one")
        await service.create_session("two")
        with pytest.raises(TooManySessions, match="maximum of 2"):
            await service.create_session("three")
        await service.stop_session("one")
        await service.create_session("three")
        assert {s.id for s in service.list_sessions() if s.state == "idle"} == {"two", "three"}


async def test_starting_a_stopped_session_resumes_it_with_its_files(service: Service) -> None:
    await service.create_session("again")
    await service.executions.run(
        "open('/workspace/kept.txt','w').write('k'); v = 1", session_id="again"
    )
    await service.stop_session("again")
    assert not service.get_session("again").open
    resumed = await service.create_session("again")
    assert resumed.open and resumed.state == "idle"
    result = await service.executions.run(
        "(open('/workspace/kept.txt').read(), 'v' in dir())", session_id="again"
    )
    assert result.results == [{"text/plain": "('k', False)"}]
    with pytest.raises(SessionExists, match="already exists"):
        await service.create_session("again")


async def test_a_start_refused_by_the_cap_leaves_nothing(settings: Settings) -> None:
    async with Service(replace(settings, max_sessions=1)) as service:
        await service.create_session("one")
        with pytest.raises(TooManySessions):
            await service.create_session("two")
        assert [s.id for s in service.list_sessions()] == ["one"]
        assert not (settings.sessions_dir / "two").exists()
        assert [r.id for r in service.sessions.store.all()] == ["one"]
        await service.stop_session("one")
        assert (await service.create_session("two")).open


async def test_a_resume_refused_by_the_cap_keeps_the_session(settings: Settings) -> None:
    async with Service(replace(settings, max_sessions=1)) as service:
        await service.create_session("one")
        await service.stop_session("one")
        await service.create_session("two")
        with pytest.raises(TooManySessions):
            await service.create_session("one")
        assert {s.id: s.open for s in service.list_sessions()} == {"one": False, "two": True}


async def test_a_closed_session_is_refused_where_resuming_is_not_asked(service: Service) -> None:
    await service.create_session("shut")
    await service.stop_session("shut")
    with pytest.raises(SessionClosed, match="Session 'shut' is closed"):
        await service.executions.run("1", session_id="shut", resume=False)
    with pytest.raises(SessionNotFound):
        await service.executions.run("1", session_id="nobody-here", resume=False)
    assert not service.get_session("shut").open
    assert (await service.executions.run("1", session_id="shut")).status == "ok"  # corral's routes
    assert service.get_session("shut").open


async def test_an_idle_reap_keeps_a_session_open(settings: Settings) -> None:
    async with Service(replace(settings, idle_timeout_s=0.5)) as service:
        await service.create_session("nap")
        service.sessions.session("nap").record.last_used_at = time.time() - 10
        assert await service.sessions.reaper.reap_idle() == ["nap"]
        assert service.get_session("nap").open
        result = await service.executions.run("1", session_id="nap", resume=False)
        assert result.status == "ok"


async def test_idle_timeout_stops_kernels_but_keeps_the_workspace(settings: Settings) -> None:
    async with Service(replace(settings, idle_timeout_s=0.5)) as service:
        await service.create_session("idle")
        await service.executions.run(
            "open('/workspace/f.txt','w').write('kept')", session_id="idle"
        )
        service.sessions.session("idle").record.last_used_at = time.time() - 10
        assert await service.sessions.reaper.reap_idle() == ["idle"]
        assert service.get_session("idle").state == "stopped"
        result = await service.executions.run("open('/workspace/f.txt').read()", session_id="idle")
        assert result.results == [{"text/plain": "'kept'"}]


async def test_delete_removes_the_workspace(service: Service) -> None:
    info = await service.create_session("gone")
    assert info.workspace.is_dir()
    await service.delete_session("gone")
    assert not info.workspace.exists()
    with pytest.raises(SessionNotFound):
        service.get_session("gone")


async def test_a_deleted_sessions_folders_leave_at_once_and_go_off_the_event_loop(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folders move out of the session's place (the same id starts empty at once) and
    are removed in a worker thread, never on the event loop."""
    info = await service.create_session("again")
    (info.workspace / "old.txt").write_text("from before")
    sessions_dir = service.settings.sessions_dir
    removed_in: list[str] = []  # the threads that removed trees under the sessions' folder
    real_rmtree = shutil.rmtree

    def rmtree(path: Path, ignore_errors: bool = False) -> None:
        if Path(path).is_relative_to(sessions_dir):
            removed_in.append(threading.current_thread().name)
        real_rmtree(path, ignore_errors)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    await service.delete_session("again")
    assert removed_in and threading.main_thread().name not in removed_in
    assert not (sessions_dir / "again").exists()
    assert list((sessions_dir / ".trash").iterdir()) == []
    fresh = await service.create_session("again")
    assert list(fresh.workspace.iterdir()) == []


async def test_what_a_stopped_server_left_of_deleted_sessions_is_removed_at_start(
    settings: Settings,
) -> None:
    left = settings.sessions_dir / ".trash" / "gone.1a2b3c4d" / "workspace"
    left.mkdir(parents=True)
    (left / "big.bin").write_bytes(b"x" * 1024)
    async with Service(settings) as service:
        assert not left.parent.exists()
        assert [s.id for s in service.sessions.list_sessions()] == []


async def test_sessions_resume_after_a_server_restart_with_files_and_packages(
    settings: Settings,
) -> None:
    async with Service(settings) as service:
        info = await service.create_session("keep")
        wheel = info.workspace / "corraltiny-1.0-py3-none-any.whl"
        wheel.write_bytes(tiny_wheel())
        install = await service.executions.run(
            "pip install --no-index --quiet /workspace/corraltiny-1.0-py3-none-any.whl",
            session_id="keep",
            language="bash",
        )
        assert install.status == "ok", install.text()
        await service.executions.run(
            "open('/workspace/notes.txt','w').write('n')", session_id="keep"
        )
    async with Service(settings) as again:
        listed = again.get_session("keep")
        assert listed.state == "stopped" and not listed.open
        result = await again.executions.run(
            "import corraltiny, pathlib\n"
            "(corraltiny.VALUE, pathlib.Path('/workspace/notes.txt').read_text())",
            session_id="keep",
        )
        assert result.results == [{"text/plain": "('installed', 'n')"}], result.text()


async def test_installed_package_lives_in_the_session_not_the_shared_runtime(
    settings: Settings,
) -> None:
    async with Service(settings) as service:
        info = await service.create_session("pkg")
        (info.workspace / "w.whl").write_bytes(tiny_wheel())
        await service.executions.run(
            "cp /workspace/w.whl /tmp/corraltiny-1.0-py3-none-any.whl && "
            "pip install --no-index --quiet /tmp/corraltiny-1.0-py3-none-any.whl",
            session_id="pkg",
            language="bash",
        )
        await service.create_session("other")
        result = await service.executions.run("import corraltiny", session_id="other")
        assert result.status == "error"
        assert result.error is not None and result.error.ename == "ModuleNotFoundError"
        env = settings.sessions_dir / "pkg" / "env"
        assert list(env.glob("lib/python*/site-packages/corraltiny/__init__.py"))


def test_session_directories_are_private(settings: Settings, tmp_path: Path) -> None:
    from corral.kernels.provisioner import host_side
    from corral.kernels.sandbox import make_run_dir

    run_dir = make_run_dir(settings.run_root)
    assert run_dir.stat().st_mode & 0o777 == 0o700
    # A unix socket path has at most 107 bytes; the longest is a bash kernel's, host side.
    assert len(str(host_side(run_dir, "bash") / "bash-0a1b2c-65535")) < 100


async def test_a_cancel_while_the_kernel_starts_means_the_code_never_runs(
    service: Service,
) -> None:
    # Nothing was sent while the kernel is still starting, so a cancel must drop the call
    # rather than look for a kernel to interrupt and find none.
    await service.create_session("cold")
    await service.stop_session("cold")
    execution = service.executions.start("open('ran', 'w').close()", session_id="cold")
    session = service.sessions.session_for("cold")
    deadline = time.monotonic() + 30
    while not session.starting:
        assert time.monotonic() < deadline, "the kernel never began to start"
        await asyncio.sleep(0.005)
    await execution.cancel()
    with pytest.raises(asyncio.CancelledError):
        await execution.result()
    check = await service.executions.run("import os; os.path.exists('ran')", session_id="cold")
    assert check.results == [{"text/plain": "False"}]
