"""Finding the kernel runtime: the virtual environment `make` installs, made from the server's
own interpreter, or a clear refusal that says how to install it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from corral.errors import SandboxUnavailable
from corral.sandbox.runtime import KERNEL_RUNTIME_DIR, current_runtime


def fake_venv(root: Path, home: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (root / "lib" / version / "site-packages").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(f"home = {home}\ninclude-system-site-packages = false\n")
    return root


def test_the_default_is_the_one_make_installs_beside_the_server() -> None:
    runtime = current_runtime()
    assert runtime.site_packages.is_relative_to(Path(sys.prefix).resolve() / KERNEL_RUNTIME_DIR)
    assert runtime.base_prefix == Path(sys.base_prefix).resolve()
    assert (runtime.site_packages / "ipykernel").is_dir()


def test_another_venv_of_the_same_interpreter_is_taken(tmp_path: Path) -> None:
    root = fake_venv(tmp_path / "rt", Path(sys.base_prefix) / "bin")
    assert str(current_runtime(str(root)).site_packages).startswith(str(root.resolve()))


def test_a_missing_runtime_is_refused_with_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="make serve"):
        current_runtime(tmp_path / "absent")


def test_a_runtime_of_another_interpreter_is_refused(tmp_path: Path) -> None:
    root = fake_venv(tmp_path / "rt", tmp_path / "elsewhere" / "bin")
    with pytest.raises(SandboxUnavailable, match="another Python"):
        current_runtime(root)
