"""The escape battery's fixtures: one attacked host per test process (see battery.py)."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.service import Service
from tests.conftest import make_settings
from tests.escapes.battery import (
    FILES,
    HOST_VAR,
    MEMORY,
    SECRET,
    SSH_KEY,
    TASKS,
    TMP,
    WORKSPACE,
    A,
    B,
    Host,
    corral_server,
    counting_web,
    make_repo,
)
from tests.server.conftest import free_port


@pytest.fixture(scope="package")
async def host(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Host]:
    base = tmp_path_factory.mktemp("escapes").resolve()
    secret = base / "secret" / "host-secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    ssh_key = base / "home" / ".ssh" / "id_ed25519"
    ssh_key.parent.mkdir(parents=True)
    ssh_key.write_text(SSH_KEY + "\n")
    ssh_key.chmod(0o600)
    repo = make_repo(base)
    run = Path(tempfile.mkdtemp(prefix="crx", dir="/tmp"))
    settings = make_settings(
        base / "state",
        run,
        config_dir=base / "config",
        port=free_port(),
        memory_bytes=MEMORY,
        tasks=TASKS,
        workspace_bytes=WORKSPACE,
        workspace_files=FILES,
        tmp_size_bytes=TMP,
        exec_timeout_s=30.0,
        mounts=f"proj={repo}:rw",
    )
    try:
        with pytest.MonkeyPatch.context() as patch, counting_web() as (web_port, web_hits):
            patch.setenv(HOST_VAR, SECRET)
            service = Service(settings)
            async with corral_server(settings, service) as server_hits:  # opens the service
                await service.create_session(A, mounts=["proj"])
                await service.create_session(B)
                yield Host(
                    service,
                    settings,
                    secret,
                    ssh_key,
                    repo,
                    settings.port,
                    server_hits,
                    web_port,
                    web_hits,
                )
    finally:
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture
async def disk_sid(host: Host) -> AsyncIterator[str]:
    """A session of the attempt's own, for one that fills the disk: deleted afterwards with
    whatever it left (files and processes), so a failed attempt leaves no full workspace
    to the next one."""
    sid = f"esc-disk-{secrets.token_hex(3)}"
    await host.service.create_session(sid)
    try:
        yield sid
    finally:
        await host.service.delete_session(sid)
