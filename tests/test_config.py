from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from corral.config import Settings
from corral.errors import InvalidInput
from corral.mounts import MountSpec


def test_defaults_need_no_environment() -> None:
    settings = Settings.from_env({})
    assert settings.max_sessions > 0
    assert settings.state_dir.name == "corral"


def test_environment_overrides_values_and_paths(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "CORRAL_STATE_DIR": str(tmp_path),
            "CORRAL_MAX_SESSIONS": "3",
            "CORRAL_EXEC_TIMEOUT_S": "2.5",
            "CORRAL_RUN_ROOT": "/tmp/x",
        }
    )
    assert settings.state_dir == tmp_path
    assert settings.max_sessions == 3
    assert settings.exec_timeout_s == 2.5
    assert settings.run_root == Path("/tmp/x")
    assert settings.db_path == tmp_path / "corral.db"


@pytest.mark.parametrize("raw", ["abc", "-1", "0"])
def test_bad_numbers_are_refused_with_the_variable_named(raw: str) -> None:
    with pytest.raises(InvalidInput, match="CORRAL_MAX_SESSIONS"):
        Settings.from_env({"CORRAL_MAX_SESSIONS": raw})


def test_the_limits_are_parsed_once_and_follow_a_replace(tmp_path: Path) -> None:
    settings = Settings.from_env({"CORRAL_STATE_DIR": str(tmp_path), "CORRAL_TASKS": "64"})
    assert settings.limits.tasks == 64
    assert settings.limits is settings.limits  # held, not rebuilt per call
    assert replace(settings, tasks=32).limits.tasks == 32


def test_a_limit_the_sessions_would_refuse_stops_the_settings(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="memory"):
        Settings.from_env({"CORRAL_STATE_DIR": str(tmp_path), "CORRAL_MEMORY_BYTES": "1M"})
    with pytest.raises(InvalidInput, match="tasks"):
        Settings(state_dir=tmp_path, run_root=tmp_path / "run", tasks=2)


def test_the_mounts_are_checked_once_and_held_by_name(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    settings = Settings(
        state_dir=tmp_path / "state", run_root=tmp_path / "run", mounts=f"proj={project}:rw"
    )
    assert dict(settings.mount_specs) == {"proj": MountSpec("proj", project, writable=True)}
    (tmp_path / "link").symlink_to(project)
    with pytest.raises(InvalidInput, match="goes through a symbolic link"):
        replace(settings, mounts=f"proj={tmp_path / 'link'}")
    with pytest.raises(InvalidInput, match="does not exist"):
        Settings.from_env({"CORRAL_STATE_DIR": str(tmp_path), "CORRAL_MOUNTS": "x=/nonexistent"})


def test_the_parsed_fields_are_not_environment_variables(tmp_path: Path) -> None:
    settings = Settings.from_env({"CORRAL_STATE_DIR": str(tmp_path), "CORRAL_LIMITS": "x"})
    assert settings.limits.tasks == settings.tasks
