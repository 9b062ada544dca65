"""Token files: created once, private, never read through a link."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from corral.tokens import MIN_TOKEN_CHARS, Role, TokenError, load_tokens, token_path


def test_tokens_are_generated_once_into_private_files(tmp_path: Path) -> None:
    config = tmp_path / "config"
    first = load_tokens(config, env={})
    assert len(first.agent) >= MIN_TOKEN_CHARS and first.agent != first.admin
    assert config.stat().st_mode & 0o777 == 0o700
    for role in Role:
        assert token_path(config, role).stat().st_mode & 0o777 == 0o600
    assert load_tokens(config, env={}) == first


def test_loose_file_and_directory_modes_are_corrected(tmp_path: Path) -> None:
    config = tmp_path / "config"
    load_tokens(config, env={})
    config.chmod(0o755)
    token_path(config, Role.AGENT).chmod(0o644)
    load_tokens(config, env={})
    assert config.stat().st_mode & 0o777 == 0o700
    assert token_path(config, Role.AGENT).stat().st_mode & 0o777 == 0o600


def test_symlinked_token_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.write_text("x" * 40)
    os.symlink(target, token_path(config, Role.AGENT))
    with pytest.raises(TokenError, match="link"):
        load_tokens(config, env={})


def test_environment_tokens_take_precedence(tmp_path: Path) -> None:
    env = {"CORRAL_AGENT_TOKEN": "a" * 40, "CORRAL_ADMIN_TOKEN": "b" * 40}
    tokens = load_tokens(tmp_path / "config", env=env)
    assert (tokens.agent, tokens.admin) == ("a" * 40, "b" * 40)


def test_short_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenError, match="at least"):
        load_tokens(tmp_path / "config", env={"CORRAL_AGENT_TOKEN": "short"})


def test_identical_tokens_are_refused(tmp_path: Path) -> None:
    env = {"CORRAL_AGENT_TOKEN": "c" * 40, "CORRAL_ADMIN_TOKEN": "c" * 40}
    with pytest.raises(TokenError, match="differ"):
        load_tokens(tmp_path / "config", env=env)


def test_role_lookup(tmp_path: Path) -> None:
    tokens = load_tokens(tmp_path / "config", env={})
    assert tokens.role_of(tokens.agent) is Role.AGENT
    assert tokens.role_of(tokens.admin) is Role.ADMIN
    assert tokens.role_of(tokens.agent + "x") is None
    assert tokens.role_of("") is None


def test_fifo_token_file_is_refused_without_blocking(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    os.mkfifo(token_path(config, Role.AGENT))
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            load_tokens(config, env={})
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(10.0)
    assert not worker.is_alive(), "reading a FIFO token file blocked"
    assert len(outcome) == 1 and isinstance(outcome[0], TokenError)
    assert "regular file" in str(outcome[0])


def test_group_writable_config_directory_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    config.chmod(0o770)
    with pytest.raises(TokenError, match="writable by its group or others"):
        load_tokens(config, env={})
