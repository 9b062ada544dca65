"""The Python scripts corral runs inside its sandboxes, and their compiled forms.

Each script is shown read-only at `/opt/corral/bin` (`binds`). Python compiles a script it
is told to run from its source on every start, and what the compiler allocated stays with
the process: 0.5 MiB of every spawner, 0.8 MiB more for the forwarder it loads, 0.2 MiB
of every kernel. So the host compiles each script once (`compile_all`, when a server
prepares), where Python keeps compiled modules (`__pycache__` beside the source), naming
the script's path inside as the file its tracebacks show (the source is shown there too).
A sandbox is shown the compiled form where Python looks for it, and `run_path` runs it;
the forwarder, which the spawner imports, is found there by Python itself, which checks
the source's size and time against the compiled form's header and compiles the source
when they differ. A compiled form made under the host's path (by pip, or by the host
importing the forwarder) is compiled again. Where the host has no fresh compiled form of
its own (an install nobody may write, say), a sandbox is shown the source alone and runs
it, as before.
"""

from __future__ import annotations

import contextlib
import importlib.util
import marshal
import py_compile
import struct
import types
from pathlib import Path

from corral.sandbox.policy import Bind

SANDBOX_BIN = "/opt/corral/bin"
_PACKAGE = Path(__file__).resolve().parent.parent
PYTHON_KERNEL = _PACKAGE / "kernels" / "python_kernel.py"
BASH_KERNEL = _PACKAGE / "kernels" / "bash_entry.py"
SPAWNER = _PACKAGE / "kernels" / "spawner.py"
FORWARDER = _PACKAGE / "egress" / "forwarder.py"
SOURCES = {path.name: path for path in (PYTHON_KERNEL, BASH_KERNEL, SPAWNER, FORWARDER)}

_fresh: dict[str, bool] = {}  # by script name: the host's compiled form is its source's


def compile_all() -> None:
    """Compile every script whose compiled form is missing or older than its source (an
    install that cannot be written keeps the source alone), and note which are fresh."""
    for name, source in SOURCES.items():
        compiled = _compiled(source)
        with contextlib.suppress(OSError, py_compile.PyCompileError):
            if not _compiled_from(compiled, source, shown_at(name)):
                py_compile.compile(
                    str(source),
                    cfile=str(compiled),
                    dfile=shown_at(name),
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP,
                )
        _fresh[name] = _compiled_from(compiled, source, shown_at(name))


def binds(names: tuple[str, ...]) -> tuple[Bind, ...]:
    """The scripts `names`, each with its compiled form when the host has it fresh."""
    shown: list[Bind] = []
    for name in names:
        shown.append(Bind(SOURCES[name], shown_at(name)))
        if _is_fresh(name):
            shown.append(Bind(_compiled(SOURCES[name]), _compiled_at(name)))
    return tuple(shown)


def run_path(name: str) -> str:
    """The file a sandbox runs for the script `name`: its compiled form when shown."""
    return _compiled_at(name) if _is_fresh(name) else shown_at(name)


def shown_at(name: str) -> str:
    """The script's source inside a sandbox."""
    return f"{SANDBOX_BIN}/{name}"


def _is_fresh(name: str) -> bool:
    if name not in _fresh:  # no server prepared in this process: look, never write
        _fresh[name] = _compiled_from(_compiled(SOURCES[name]), SOURCES[name], shown_at(name))
    return _fresh[name]


def _compiled(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def _compiled_at(name: str) -> str:
    return importlib.util.cache_from_source(shown_at(name))


def _compiled_from(compiled: Path, source: Path, shown: str) -> bool:
    """Whether `compiled` holds this Python's code of `source` as it is now (its header
    names the source's time and size, as Python checks before using it), compiled under
    its name inside, `shown` (one compiled on the host, by pip or an import, names the
    host's path: tracebacks inside would show no source, and the sandbox would learn it)."""
    try:
        data = compiled.read_bytes()
        stat = source.stat()
    except OSError:
        return False
    expected = struct.pack("<III", 0, int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)
    if data[:4] != importlib.util.MAGIC_NUMBER or data[4:16] != expected:
        return False
    try:
        code = marshal.loads(data[16:])  # noqa: S302 - corral's own package, trusted as its code is
    except (EOFError, ValueError, TypeError):
        return False
    return isinstance(code, types.CodeType) and code.co_filename == shown
