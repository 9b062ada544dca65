"""Fixtures: settings in temporary directories, and real services with real sandboxes."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from corral.config import Settings
from corral.service import Service


def pytest_configure(config: pytest.Config) -> None:
    """The escape battery's count of attempts, printed at the end of every run."""
    from tests.escapes.battery import BatterySummary

    config.pluginmanager.register(BatterySummary("tests/escapes/"), "escape-battery")


# The longest tests, mostly waiting on a server: run first, so that xdist starts them at once
# beside the rest of the suite instead of leaving them to end the run alone.
LONG_FIRST = ("tests/server/test_conformance.py::",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))


@pytest.fixture
def run_root() -> Iterator[Path]:
    """A short directory for kernel sockets (unix socket paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="crt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_settings(state_dir: Path, run_root: Path, **overrides: object) -> Settings:
    base = dict(
        state_dir=state_dir,
        run_root=run_root,
        exec_timeout_s=60.0,
        interrupt_grace_s=3.0,
        max_output_bytes=100_000,
        # No warm pool: it would start more kernels than most tests use, and its refills
        # would change the process and descriptor counts other tests of the same worker
        # take. tests/kernels/test_pool*.py test the pool.
        pool_size=0,
        # Nor the background build of matplotlib's font list (a sandbox per service that
        # starts a kernel); tests/sandbox/test_fontcache.py builds it on purpose.
        font_list_build=False,
    )
    base.update(overrides)
    return Settings(**base)  # type: ignore[arg-type]


@pytest.fixture
def settings(tmp_path: Path, run_root: Path) -> Settings:
    return make_settings(tmp_path / "state", run_root)


@pytest.fixture
async def service(settings: Settings) -> AsyncIterator[Service]:
    """A fresh service per test, for tests that break or restart things."""
    async with Service(settings) as svc:
        yield svc


@pytest.fixture(scope="session")
async def shared_service(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    """One service for read-only property tests, so each kernel starts once per run."""
    run = Path(tempfile.mkdtemp(prefix="crs", dir="/tmp"))
    settings = make_settings(tmp_path_factory.mktemp("shared") / "state", run)
    try:
        async with Service(settings) as svc:
            yield svc
    finally:
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="session")
async def sandbox(shared_service: Service) -> Service:
    """The shared service with a session named 'probe' running (python and bash)."""
    await shared_service.create_session("probe")
    return shared_service


async def disk_looked_at_again(service: Service, sid: str, timeout_s: float = 20.0) -> None:
    """Wait, bounded, until the disk patrol has measured the session once more: after the
    test changed its files from the host, the session is judged by what it holds now."""
    session = service.sessions.session(sid)
    watch = session.disk
    since = time.monotonic()
    if not session.kernels:  # the patrol watches running sessions only
        watch.look()
        return
    watch.look_soon()
    while watch.measured_at <= since:
        if time.monotonic() - since > timeout_s:
            raise AssertionError(f"the disk patrol did not look at {sid} again")
        await asyncio.sleep(0.02)
