"""What the CLI does itself when no corral server owns the state directory.

Beside a running server, every CLI command that reads or changes sessions, the audit log
or skills goes through that server's API (`corral.remote`): a second process on the state
would reset what its owner holds (`corral.owner`). When none runs, the commands below act
on the state here, and these functions are the only places they do:

- `stored_sessions` and `audit_page` read the database without taking the state (reads of
  SQLite in WAL mode are safe beside a server that starts meanwhile);
- `delete_session` opens a `Service`, which takes the owner's lock first (`StateOwned` if
  a server took it since) and releases it at the end;
- `skill_listing` and `add_skill` work on the user's skill folder (a listing unpacks the
  archives waiting there, as the server's does);
- `run_once` and `fetch_once` use a service of their own on a throw-away state directory,
  never the user's.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from corral.audit import AuditLog
from corral.browser.fetch import PageResult
from corral.config import Settings
from corral.kernels.results import ExecutionResult
from corral.server.operation import wire
from corral.server.schemas import AuditPageModel
from corral.service import Service
from corral.skills import PUBLIC_DIR, user_dir
from corral.skills.archive import unpack_skill_zip
from corral.skills.catalog import SkillCatalog, SkillListing
from corral.store import Store


def stored_sessions(settings: Settings) -> list[dict[str, Any]]:
    """The sessions' records as stored (all stopped: no server runs them)."""
    store = Store(settings.db_path)
    try:
        return [asdict(record) for record in store.all()]
    finally:
        store.close()


def audit_page(settings: Settings, **query: Any) -> dict[str, Any]:
    """One page of the audit log, read from the database (`AuditLog.query`'s arguments)."""
    log = AuditLog(settings.db_path)
    try:
        return wire(AuditPageModel, log.query(**query))
    finally:
        log.close()


async def delete_session(settings: Settings, session_id: str) -> None:
    """Delete a session's workspace, packages and record, holding the owner's lock."""
    async with Service(_one_shot(settings)) as service:
        await service.delete_session(session_id, actor="admin")


def skill_listing(settings: Settings) -> SkillListing:
    return SkillCatalog(PUBLIC_DIR, user_dir(settings.config_dir)).listing()


def add_skill(settings: Settings, archive: Path) -> Path:
    """Unpack a skill archive into the user's folder with every check; its folder."""
    folder = user_dir(settings.config_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return unpack_skill_zip(archive, folder)


async def run_once(
    settings: Settings, code: str, language: str, timeout_s: float | None
) -> ExecutionResult:
    """`corral run` alone: a session on a state of its own, gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="corral-run-") as tmp:
        async with Service(_one_shot(settings, Path(tmp))) as service:
            await service.create_session("run")
            return await service.executions.run(
                code, session_id="run", language=language, timeout_s=timeout_s
            )


async def fetch_once(
    settings: Settings, url: str, screenshot: bool, timeout_s: float | None
) -> PageResult:
    """`corral fetch` alone: the browser of a service on a state of its own."""
    with tempfile.TemporaryDirectory(prefix="corral-fetch-") as tmp:
        async with Service(_one_shot(settings, Path(tmp))) as service:
            return await service.browser.fetch(url, screenshot=screenshot, timeout_s=timeout_s)


def _one_shot(settings: Settings, scratch: Path | None = None) -> Settings:
    """Settings for a service that runs once: no warm pool (its kernels would only start to
    be stopped again), and a throw-away state directory under `scratch` when given."""
    once = replace(settings, pool_size=0)
    return replace(once, state_dir=scratch / "state") if scratch is not None else once
