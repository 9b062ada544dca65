"""The state directory's one owner: its lock, its runtime file, and the service taking it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from corral.config import Settings
from corral.errors import SandboxError, StateOwned
from corral.owner import LOCK_NAME, RUNTIME_NAME, ServerInfo, StateLock, find_server
from corral.service import Service
from corral.store import Store


def test_a_second_holder_is_refused_with_the_owners_pid_and_url(tmp_path: Path) -> None:
    first = StateLock(tmp_path)
    first.acquire()
    first.publish(ServerInfo.for_address("127.0.0.1", 18302))
    with pytest.raises(StateOwned) as refused:
        StateLock(tmp_path).acquire()
    assert str(refused.value) == (
        f"the state in {tmp_path} is owned by corral pid {os.getpid()}, "
        "serving http://127.0.0.1:18302"
    )
    first.release()
    again = StateLock(tmp_path)
    again.acquire()
    again.release()


def test_find_server_trusts_the_runtime_file_only_while_its_lock_is_held(tmp_path: Path) -> None:
    assert find_server(tmp_path) is None  # nothing there yet
    lock = StateLock(tmp_path)
    lock.acquire()
    info = ServerInfo.for_address("127.0.0.1", 18303)
    lock.publish(info)
    assert find_server(tmp_path) == info
    for name in (LOCK_NAME, RUNTIME_NAME):
        assert stat.S_IMODE((tmp_path / name).lstat().st_mode) == 0o600
    lock.release()
    assert not (tmp_path / RUNTIME_NAME).exists()
    assert find_server(tmp_path) is None


def test_a_runtime_file_whose_lock_is_free_is_stale_and_removed(tmp_path: Path) -> None:
    killed = StateLock(tmp_path)
    killed.acquire()
    killed.release()
    # What a SIGKILLed server leaves: the runtime file, and a lock file nobody holds.
    (tmp_path / RUNTIME_NAME).write_text(
        json.dumps(ServerInfo.for_address("127.0.0.1", 18304).__dict__)
    )
    assert find_server(tmp_path) is None
    assert not (tmp_path / RUNTIME_NAME).exists()


def test_an_owner_that_serves_no_api_is_named_not_ignored(tmp_path: Path) -> None:
    lock = StateLock(tmp_path)
    lock.acquire()
    with pytest.raises(StateOwned, match=f"pid {os.getpid()}, serving no HTTP API"):
        find_server(tmp_path)
    lock.release()


def test_the_runtime_file_replaces_a_link_without_writing_through_it(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (tmp_path / RUNTIME_NAME).symlink_to(target)
    lock = StateLock(tmp_path)
    lock.acquire()  # removes what a dead owner left, links included
    (tmp_path / RUNTIME_NAME).symlink_to(target)
    lock.publish(ServerInfo.for_address("127.0.0.1", 18305))
    assert target.read_text() == "untouched"
    assert not (tmp_path / RUNTIME_NAME).is_symlink()
    lock.release()


def test_a_lock_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SandboxError, match="is a link"):
        StateLock(tmp_path).acquire()
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.bwrap
async def test_a_second_service_on_an_owned_state_is_refused_and_resets_nothing(
    settings: Settings,
) -> None:
    async with Service(settings) as owner:
        await owner.create_session("held")
        with pytest.raises(StateOwned):
            async with Service(settings):
                pass
        assert owner.get_session("held").state != "stopped"
        stored = Store(settings.db_path)
        assert [record.state for record in stored.all()] == ["running"]
        stored.close()
        result = await owner.executions.run("print('still mine')", session_id="held")
        assert result.stdout == "still mine\n"
    async with Service(settings) as next_owner:  # released on close
        assert [info.id for info in next_owner.list_sessions()] == ["held"]
