from __future__ import annotations

from pathlib import Path

import pytest

from corral.config import Settings
from corral.errors import InvalidInput


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
