"""A session's package prefix: what the host relies on in it is checked and put back at each
start, following nothing the sandbox may have put there, and nothing else is touched."""

from __future__ import annotations

import os
from pathlib import Path

from corral.sandbox.runtime import create_session_env, current_runtime, repair_session_env


def fresh_prefix(tmp_path: Path) -> tuple[Path, Path]:
    """A new package prefix and an empty folder outside it (where a planted link points)."""
    env = tmp_path / "env"
    create_session_env(env, current_runtime())
    outside = tmp_path / "outside"
    outside.mkdir()
    return env, outside


def test_a_fresh_prefix_needs_no_repair(tmp_path: Path) -> None:
    env = tmp_path / "env"
    create_session_env(env, current_runtime())
    assert repair_session_env(env, current_runtime()) == []


def test_damaged_entries_are_rewritten_and_packages_kept(tmp_path: Path) -> None:
    runtime = current_runtime()
    env, outside = fresh_prefix(tmp_path)
    (outside / "victim").write_text("host data")
    site = env / "lib" / f"python{runtime.version}" / "site-packages"
    (site / "installed.py").write_text("X = 1\n")
    (env / "pyvenv.cfg").unlink()
    (env / "pyvenv.cfg").symlink_to(outside / "victim")  # never followed, never written
    (env / "bin" / "pip").chmod(0o777)
    (env / "bin" / "python3").unlink()
    repaired = repair_session_env(env, runtime)
    assert repaired == ["pyvenv.cfg", "bin/python3", "bin/pip"]
    assert (outside / "victim").read_text() == "host data"
    assert not (env / "pyvenv.cfg").is_symlink()
    assert (site / "installed.py").read_text() == "X = 1\n"
    assert repair_session_env(env, runtime) == []


def test_a_directory_swapped_for_a_link_is_made_anew_without_following_it(tmp_path: Path) -> None:
    runtime = current_runtime()
    env, outside = fresh_prefix(tmp_path)
    os.rename(env / "bin", tmp_path / "old-bin")
    (env / "bin").symlink_to(outside)
    repaired = repair_session_env(env, runtime)
    assert repaired == [
        f"bin/{name}" for name in ("python", "python3", f"python{runtime.version}", "pip", "pip3")
    ]
    assert (env / "bin").is_dir() and not (env / "bin").is_symlink()
    assert list(outside.iterdir()) == []
