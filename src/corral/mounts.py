"""Project mounts: host folders the operator names, which sessions choose by name.

The operator writes `--mount NAME=PATH[:ro|rw]` (or `CORRAL_MOUNTS="a=/x:rw,b=/y"`); an agent
only ever picks among the NAMEs, and each appears in its sandbox at /workspace/NAME. This module
parses those specifications and checks them once on the host, before any session uses them:

- the path exists, is a directory, and is named by its real path (no symbolic link on the way),
  so what was checked is what gets mounted;
- it is neither `/`, nor corral's own directories (state, tokens, run root), nor an ancestor of
  them, nor inside them;
- it is not the home directory or an ancestor of it, unless the operator allows that explicitly.

`overlapping` lets the caller keep two sessions from mounting overlapping projects read-write.
Errors are `corral.errors.InvalidInput`, with a message that says what to name instead.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corral.errors import InvalidInput
from corral.protect import escape_name

if TYPE_CHECKING:
    from corral.config import Settings

MOUNT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SUFFIXES = {":ro": False, ":rw": True}


@dataclass(frozen=True)
class MountSpec:
    """One operator-named host folder: seen in the sandbox at /workspace/`name`.

    `path` is absolute (after `validate_mounts`, also normalised and free of links);
    `writable` is False for `:ro` (the default) and True for `:rw`.
    """

    name: str
    path: Path
    writable: bool


def parse_mount(text: str, *, cwd: Path | None = None) -> MountSpec:
    """Parse `NAME=PATH`, `NAME=PATH:ro` or `NAME=PATH:rw` (read-only unless `:rw`).

    Only the last `:ro`/`:rw` is a suffix, so `a=/x:y:rw` mounts `/x:y`; a path holding ':'
    without an explicit suffix is refused as ambiguous. A leading `~` is expanded, and a
    relative PATH is made absolute against `cwd` (default: the current directory). Nothing on
    disk is looked at here; `validate_mounts` does that. Raises `InvalidInput`.
    """
    name, sep, rest = text.partition("=")
    if not sep:
        raise InvalidInput(f"mount {_show(text)}: expected NAME=PATH[:ro|rw]")
    check_name(name)
    path_text, writable = _split_suffix(name, rest)
    if not path_text:
        raise InvalidInput(f"mount {name!r}: the path is empty; expected NAME=PATH[:ro|rw]")
    if "\0" in path_text:
        raise InvalidInput(f"mount {name!r}: the path contains a NUL byte")
    path = Path(os.path.expanduser(path_text))
    if not path.is_absolute():
        path = (cwd if cwd is not None else Path.cwd()) / path
    return MountSpec(name, path, writable)


def parse_mount_list(text: str, *, cwd: Path | None = None) -> list[MountSpec]:
    """Parse the comma-separated environment form, e.g. `a=/x:rw,b=/y`.

    Blank items are ignored, so a trailing comma is harmless; a path cannot hold a comma in
    this form (use one `--mount` per folder for such a path). Raises `InvalidInput`.
    """
    return [parse_mount(item.strip(), cwd=cwd) for item in text.split(",") if item.strip()]


def check_name(name: str) -> str:
    """Return `name` if it is a valid mount name, else raise `InvalidInput`."""
    if not MOUNT_NAME.fullmatch(name):
        raise InvalidInput(
            f"mount name {_show(name)} is invalid: use 1 to 64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def validate_mounts(
    specs: Iterable[MountSpec],
    *,
    home: Path,
    protected: Sequence[Path],
    allow_home: bool = False,
) -> dict[str, MountSpec]:
    """Check every spec on disk and return them by name, each with its normalised real path.

    `protected` lists corral's own directories (state, the config directory holding the
    tokens, the run root): a mount may not be one of them, contain one, or sit inside one.
    `home` (and every ancestor of it) is refused unless `allow_home`; folders inside it are
    fine. Raises `InvalidInput` for a duplicate name, a missing path, a non-directory, a path
    through a symbolic link (naming the link and the real path to use instead), `/`, or any of
    the refusals above.
    """
    result: dict[str, MountSpec] = {}
    for spec in specs:
        check_name(spec.name)
        if spec.name in result:
            raise InvalidInput(f"mount {spec.name!r} is named twice; give each folder its own name")
        path = _check_path(spec)
        _check_not_protected(spec.name, path, protected)
        if not allow_home:
            _check_not_home(spec.name, path, home)
        result[spec.name] = MountSpec(spec.name, path, spec.writable)
    return result


def overlapping(a: Path, b: Path) -> bool:
    """True when `a` and `b` are the same folder or one is inside the other.

    The comparison is by name after normalisation (no disk access): pass real paths, such as
    those `validate_mounts` returns.
    """
    pa = Path(os.path.normpath(a))
    pb = Path(os.path.normpath(b))
    return pa.is_relative_to(pb) or pb.is_relative_to(pa)


# -- checks ----------------------------------------------------------------------------------


def _split_suffix(name: str, rest: str) -> tuple[str, bool]:
    """The path and the writable flag of `PATH[:ro|rw]`."""
    suffix = rest[-3:]
    if suffix in _SUFFIXES:
        return rest[:-3], _SUFFIXES[suffix]
    if ":" in rest:
        raise InvalidInput(
            f"mount {name!r}: {_show(rest)} holds ':' but does not end in ':ro' or ':rw'; "
            "add the suffix explicitly (a path may contain ':' only then)"
        )
    return rest, False


def _check_path(spec: MountSpec) -> Path:
    """The normalised path of `spec`, checked to exist, be a directory and hold no link."""
    raw = os.fspath(spec.path)
    if not os.path.isabs(raw):
        raise InvalidInput(f"mount {spec.name!r}: {_show(raw)} is not an absolute path")
    if "\0" in raw:
        raise InvalidInput(f"mount {spec.name!r}: the path contains a NUL byte")
    normal = os.path.normpath(raw)
    real = os.path.realpath(raw)
    if real != normal:
        raise InvalidInput(_link_message(spec.name, raw, real))
    try:
        info = os.lstat(normal)
    except (FileNotFoundError, NotADirectoryError):
        raise InvalidInput(f"mount {spec.name!r}: {_show(normal)} does not exist") from None
    except PermissionError:
        raise InvalidInput(f"mount {spec.name!r}: {_show(normal)} cannot be read") from None
    if not stat.S_ISDIR(info.st_mode):
        raise InvalidInput(f"mount {spec.name!r}: {_show(normal)} is not a directory")
    return Path(normal)


def _link_message(name: str, raw: str, real: str) -> str:
    """The refusal for a path whose real path differs, naming the first link on the way."""
    link = _first_link(raw)
    if link is None:
        return (
            f"mount {name!r}: {_show(raw)} resolves to {_show(real)}; name the real path "
            f"{_show(real)}"
        )
    target = os.readlink(link)
    return (
        f"mount {name!r}: {_show(os.path.normpath(raw))} goes through a symbolic link "
        f"({_show(link)} -> {_show(target)}); name the real path {_show(real)}"
    )


def _first_link(raw: str) -> str | None:
    """The first component of absolute `raw`, walked as written, that is a symbolic link."""
    current = "/"
    for part in raw.split("/"):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        if os.path.islink(current):
            return current
        if part == "..":
            current = os.path.normpath(current)
    return None


def _check_not_protected(name: str, path: Path, protected: Sequence[Path]) -> None:
    """Refuse `/`, corral's own directories, their ancestors and anything inside them."""
    if path == Path("/"):
        raise InvalidInput(f"mount {name!r}: / would expose the whole host; name a project folder")
    for own in _both_forms(protected):
        if path == own:
            raise InvalidInput(
                f"mount {name!r}: {_show(str(path))} is corral's own directory (sessions, "
                "tokens or sockets); name a project folder"
            )
        if path.is_relative_to(own):
            raise InvalidInput(
                f"mount {name!r}: {_show(str(path))} is inside corral's own directory "
                f"{_show(str(own))}; name a project folder outside it"
            )
        if own.is_relative_to(path):
            raise InvalidInput(
                f"mount {name!r}: {_show(str(path))} contains corral's own directory "
                f"{_show(str(own))} (sessions, tokens or sockets); name a folder that does not"
            )


def _check_not_home(name: str, path: Path, home: Path) -> None:
    """Refuse the home directory and its ancestors."""
    for own in _both_forms([home]):
        if own.is_relative_to(path):
            raise InvalidInput(
                f"mount {name!r}: {_show(str(path))} is the home directory or contains it "
                f"({_show(str(own))}: keys, tokens, shell start-up files); name a project "
                "folder inside it, or allow home mounts explicitly"
            )


def _both_forms(paths: Sequence[Path]) -> list[Path]:
    """Each path as written (normalised) and as resolved, so a linked state dir still counts."""
    forms: list[Path] = []
    for path in paths:
        for form in (os.path.normpath(os.path.abspath(path)), os.path.realpath(path)):
            if Path(form) not in forms:
                forms.append(Path(form))
    return forms


def _show(text: str) -> str:
    """A path or spec as shown in a message: escaped, so no control character reaches a tty."""
    return escape_name(text)


def configured_mounts(settings: Settings) -> dict[str, MountSpec]:
    """The operator's mounts from `settings.mounts`, as `Settings` validated them when it
    was made (against corral's own folders and the home)."""
    return dict(settings.mount_specs)
