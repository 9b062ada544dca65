"""The scripts sandboxes run, compiled once by the host (`corral.sandbox.scripts`): a
fresh compiled form is shown and run, a stale one is compiled again, and a host that
cannot write one shows and runs the source alone."""

from __future__ import annotations

import py_compile
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.sandbox import scripts
from corral.sandbox.policy import Bind

NAME = "probe_script.py"


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A script of its own in place of corral's, with nothing known of it yet."""
    source = tmp_path / NAME
    source.write_text("print('first')\n")
    monkeypatch.setattr(scripts, "SOURCES", {NAME: source})
    monkeypatch.setattr(scripts, "_fresh", {})
    yield source


def compiled_of(source: Path) -> Path:
    return source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"


def test_a_compiled_script_is_shown_beside_its_source_and_run(probe: Path) -> None:
    scripts.compile_all()
    inside = f"/opt/corral/bin/__pycache__/probe_script.{sys.implementation.cache_tag}.pyc"
    assert scripts.run_path(NAME) == inside
    assert scripts.binds((NAME,)) == (
        Bind(probe, "/opt/corral/bin/probe_script.py"),
        Bind(compiled_of(probe), inside),
    )
    ran = subprocess.run([sys.executable, compiled_of(probe)], capture_output=True, text=True)
    assert ran.stdout == "first\n"


def test_a_compiled_script_names_its_path_inside_in_tracebacks(probe: Path) -> None:
    probe.write_text("raise SystemExit(__import__('sys')._getframe().f_code.co_filename)\n")
    scripts.compile_all()
    ran = subprocess.run([sys.executable, compiled_of(probe)], capture_output=True, text=True)
    assert ran.stderr.strip() == "/opt/corral/bin/probe_script.py"


def test_a_source_changed_since_it_was_compiled_is_compiled_again(probe: Path) -> None:
    scripts.compile_all()
    probe.write_text("print('second, and longer')\n")
    assert not scripts._compiled_from(compiled_of(probe), probe, "/opt/corral/bin/" + NAME)
    scripts.compile_all()
    assert scripts.run_path(NAME).endswith(".pyc")
    ran = subprocess.run([sys.executable, compiled_of(probe)], capture_output=True, text=True)
    assert ran.stdout == "second, and longer\n"


def test_a_host_that_cannot_write_the_compiled_form_shows_the_source_alone(
    probe: Path,
) -> None:
    (probe.parent / "__pycache__").write_text("a file where the folder would go")
    scripts.compile_all()
    assert scripts.run_path(NAME) == "/opt/corral/bin/probe_script.py"
    assert scripts.binds((NAME,)) == (Bind(probe, "/opt/corral/bin/probe_script.py"),)


def test_a_compiled_form_of_another_python_is_not_taken_for_fresh(probe: Path) -> None:
    scripts.compile_all()
    compiled = compiled_of(probe)
    data = bytearray(compiled.read_bytes())
    data[0] ^= 0xFF  # another interpreter's magic number
    compiled.write_bytes(bytes(data))
    assert not scripts._compiled_from(compiled, probe, "/opt/corral/bin/" + NAME)


def test_a_compiled_form_naming_the_hosts_path_is_compiled_again(probe: Path) -> None:
    """pip and the host's own imports compile under the host's path; inside, tracebacks
    would show no source and the sandbox would learn where corral is installed."""
    compiled = compiled_of(probe)
    py_compile.compile(str(probe), cfile=str(compiled), doraise=True)  # as an import would
    scripts.compile_all()
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import marshal; print(marshal.loads(open({str(compiled)!r}, 'rb')"
            ".read()[16:]).co_filename)",
        ],
        capture_output=True,
        text=True,
    )
    assert ran.stdout.strip() == "/opt/corral/bin/" + NAME
