"""Unpacking a skill archive (`.zip`) into the user's skill folder, within bounds.

The archive is untrusted: it may come from anywhere and the server may run as root. Every
member is checked before anything is written (`_plan`), then the files are streamed into a
fresh hidden folder beside the skills, counting the bytes really produced, and the finished
skill is renamed into place. Whatever goes wrong, nothing half-written remains.

Refused (each with its reason in `ArchiveRefused`): not a zip or a damaged one; absolute
member names, drive letters, backslashes, '.' or '..' parts; links, devices, FIFOs and
sockets; password-protected members; compression methods zipfile cannot read; more than
`max_files` members; more than `max_total_bytes` unpacked (declared or real); a member over
1 MiB that expands more than `max_ratio` times; a layout without SKILL.md; SKILL.md whose
front matter does not parse; a skill name already taken in the user folder.

`SKILL.md` front matter is read here by `parse_front_matter`, which the catalog uses too.
"""

from __future__ import annotations

import contextlib
import lzma
import os
import re
import secrets
import shutil
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

import yaml  # type: ignore[import-untyped]

from corral.errors import InvalidInput
from corral.fsafe import CREATE_FLAGS, closing, open_dir_at, walk

MIB = 1024 * 1024
SKILL_MD = "SKILL.md"
MAX_SKILL_MD_BYTES = MIB
RATIO_FLOOR_BYTES = MIB  # members smaller than this are not ratio-checked
CHUNK_BYTES = 64 * 1024
MAX_DIRECTORY_ENTRY_BYTES = 1024  # a central directory entry, name and extra fields included
MAX_NAME_BYTES = 255  # one part of a member name, as on Linux
SKILL_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
IGNORED_TOP = "__MACOSX"  # macOS Finder's resource forks: never part of a skill
READABLE_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_DAMAGED = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError)


class ArchiveRefused(InvalidInput):
    """A skill archive that corral will not unpack; the message says why."""


class FrontMatterError(ValueError):
    """SKILL.md front matter that is missing or does not parse; the message says why."""


def parse_front_matter(text: str) -> dict[str, Any]:
    """The YAML mapping between the leading '---' line of SKILL.md and the next '---' line.

    Raises `FrontMatterError` with a one-line reason (no front matter, not closed, not valid
    YAML with the line number in SKILL.md, not a mapping). Only the mapping is checked here;
    what its keys must hold is the catalog's business.
    """
    lines = text.removeprefix("\ufeff").splitlines()
    if not lines or lines[0].rstrip() != "---":
        raise FrontMatterError("SKILL.md has no front matter (its first line must be '---')")
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip() in ("---", "...")), 0)
    if not end:
        raise FrontMatterError("SKILL.md front matter is not closed by a '---' line")
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # a bad date is a ValueError
        raise FrontMatterError(
            f"SKILL.md front matter is not valid YAML: {_yaml_reason(exc)}"
        ) from None
    if not isinstance(data, dict):
        raise FrontMatterError("SKILL.md front matter is not a mapping of keys to values")
    return data


def _yaml_reason(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} (line {mark.line + 2})" if mark is not None else str(problem)


@dataclass(frozen=True)
class _Member:
    info: zipfile.ZipInfo
    parts: tuple[str, ...]  # the destination, relative to the skill folder
    is_dir: bool


def unpack_skill_zip(
    zip_path: Path,
    user_dir: Path,
    *,
    max_total_bytes: int = 200 * MIB,
    max_files: int = 2000,
    max_ratio: int = 100,
) -> Path:
    """Unpack the skill in `zip_path` into `user_dir/<name>` and return that folder.

    The layout is either one top folder holding SKILL.md (the skill is named after the folder)
    or SKILL.md at the root (the skill is named after the archive's stem). `zip_path` itself
    is left alone. Raises `ArchiveRefused` with the reason; then nothing was written.
    """
    try:
        with zip_path.open("rb") as raw:
            _check_directory(raw, max_files)
            with zipfile.ZipFile(raw) as archive:
                name, members = _plan(archive, zip_path, max_total_bytes, max_files, max_ratio)
                _check_free(user_dir, name)
                return _extract(archive, members, user_dir, name, max_total_bytes)
    except ArchiveRefused:
        raise
    except zipfile.BadZipFile as exc:
        raise _refused(f"it is not a readable zip archive ({exc})") from exc
    except (EOFError, ValueError, struct.error, NotImplementedError, RuntimeError) as exc:
        raise _refused(f"it could not be read ({exc})") from exc


def set_aside(zip_path: Path, reason: str) -> Path:
    """Rename a refused archive to `<name>.zip.bad`, write the reason to `<name>.zip.bad.txt`.

    An older `.zip.bad` of the same name is replaced. Returns the new path.
    """
    bad = zip_path.with_name(zip_path.name + ".bad")
    os.replace(zip_path, bad)
    note = bad.with_name(bad.name + ".txt")
    with contextlib.suppress(FileNotFoundError):
        note.unlink()  # never write through a link someone left at the name
    fd = os.open(note, CREATE_FLAGS, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(reason.strip() + "\n")
    return bad


# -- checking, before anything is written ---------------------------------------------------


def _plan(
    archive: zipfile.ZipFile, zip_path: Path, max_total: int, max_files: int, max_ratio: int
) -> tuple[str, list[_Member]]:
    """The skill's name and its members, every member checked; raises `ArchiveRefused`."""
    infos = [i for i in archive.infolist() if PurePosixPath(i.filename).parts[:1] != (IGNORED_TOP,)]
    if len(infos) > max_files:
        raise _refused(f"it has {len(infos)} members; at most {max_files} are allowed")
    declared = 0
    for info in infos:
        _check_member(info, max_ratio)
        declared += info.file_size
        if declared > max_total:
            raise _refused(f"it would unpack to more than {_mib(max_total)}")
    names = [_split_name(info.filename) for info in infos]
    files = {parts for info, parts in zip(infos, names, strict=True) if not _is_dir(info)}
    if (SKILL_MD,) in files:
        name, strip = zip_path.stem, 0
    else:
        tops = {parts[0] for parts in names}
        if len(tops) != 1 or (*tops, SKILL_MD) not in files:
            raise _refused(
                f"it must hold {SKILL_MD} at its root, or one folder with {SKILL_MD} in it"
            )
        name, strip = tops.pop(), 1
    if not SKILL_NAME.fullmatch(name):
        raise _refused(f"{name!r} is not a valid skill name (letters, digits, '-', '_', '.')")
    members = [
        _Member(info, parts[strip:], _is_dir(info))
        for info, parts in zip(infos, names, strict=True)
        if parts[strip:]
    ]
    _check_tree(members)
    _check_skill_md(archive, members)
    return name, members


def _check_member(info: zipfile.ZipInfo, max_ratio: int) -> None:
    label = repr(info.filename)
    if info.flag_bits & 0x1:
        raise _refused(
            f"member {label} is password-protected (encrypted), which corral cannot unpack"
        )
    if info.compress_type not in READABLE_METHODS:
        raise _refused(f"member {label} uses compression method {info.compress_type}")
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        raise _refused(f"member {label} is a symbolic link; links are not allowed in skills")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise _refused(f"member {label} is a special file (device, FIFO or socket)")
    if kind == stat.S_IFDIR and not info.filename.endswith("/"):
        raise _refused(f"member {label} is a directory without a trailing '/'")
    if kind == stat.S_IFREG and info.filename.endswith("/"):
        raise _refused(f"member {label} is a file with a trailing '/'")
    ratio = info.file_size / max(info.compress_size, 1)
    if info.file_size > RATIO_FLOOR_BYTES and ratio > max_ratio:
        raise _refused(
            f"member {label} expands {ratio:.0f} times (more than {max_ratio}): "
            "it looks like a zip bomb"
        )


def _split_name(name: str) -> tuple[str, ...]:
    """The parts of a member name; raises `ArchiveRefused` for a name that could escape."""
    label = repr(name)
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in name):
        raise _refused(f"member {label} contains a control character")
    if "\\" in name:
        raise _refused(f"member {label} contains a backslash")
    if name.startswith("/"):
        raise _refused(f"member {label} is an absolute path")
    if re.match(r"[A-Za-z]:", name):
        raise _refused(f"member {label} starts with a drive letter")
    parts = name.removesuffix("/").split("/")
    if ".." in parts:
        raise _refused(f"member {label} climbs out with '..'")
    if any(part in ("", ".") for part in parts):
        raise _refused(f"member {label} has an empty or '.' part")
    if any(len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES for part in parts):
        raise _refused(f"member {label} has a part longer than {MAX_NAME_BYTES} bytes")
    return tuple(parts)


def _is_dir(info: zipfile.ZipInfo) -> bool:
    return info.filename.endswith("/")


def _check_tree(members: list[_Member]) -> None:
    """No file twice, and no file where another member needs a folder."""
    files: set[tuple[str, ...]] = set()
    dirs: set[tuple[str, ...]] = set()
    for member in members:
        if member.is_dir:
            dirs.add(member.parts)
        elif member.parts in files:
            raise _refused(f"member {member.info.filename!r} appears twice")
        else:
            files.add(member.parts)
        dirs.update(member.parts[:i] for i in range(1, len(member.parts)))
    clash = files & dirs
    if clash:
        raise _refused(f"{'/'.join(min(clash))!r} is both a file and a folder")


def _check_skill_md(archive: zipfile.ZipFile, members: list[_Member]) -> None:
    info = next(m.info for m in members if m.parts == (SKILL_MD,) and not m.is_dir)
    if info.file_size > MAX_SKILL_MD_BYTES:
        raise _refused(f"its {SKILL_MD} is larger than {_mib(MAX_SKILL_MD_BYTES)}")
    try:
        with archive.open(info) as src:
            data = src.read(MAX_SKILL_MD_BYTES + 1)
    except _DAMAGED as exc:
        raise _refused(f"its {SKILL_MD} is damaged ({exc})") from exc
    try:
        parse_front_matter(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise _refused(f"its {SKILL_MD} is not UTF-8 text") from None
    except FrontMatterError as exc:
        raise _refused(str(exc)) from None


def _check_directory(raw: IO[bytes], max_files: int) -> None:
    """Refuse too many members before zipfile loads the central directory into memory.

    zipfile builds an object per entry, reading as many as fit in the directory's declared
    size, so both the declared count and that size are bounded here. An archive without an
    end record passes: zipfile then says what is wrong with it.
    """
    bounds = _directory_bounds(raw)
    raw.seek(0)
    if bounds is None:
        return
    entries, directory_bytes = bounds
    if entries > max_files:
        raise _refused(f"it has {entries} members; at most {max_files} are allowed")
    if directory_bytes > max_files * MAX_DIRECTORY_ENTRY_BYTES:
        raise _refused(f"its central directory is larger than {max_files} members can need")


def _directory_bounds(raw: IO[bytes]) -> tuple[int, int] | None:
    """(member count, central directory bytes) from the end records, zip64 ones included."""
    size = raw.seek(0, os.SEEK_END)
    raw.seek(max(0, size - (_EOCD.size + 0xFFFF)))
    tail = raw.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + _EOCD.size > len(tail):
        return None
    record = _EOCD.unpack_from(tail, at)
    entries, directory_bytes = record[4], record[5]
    locator_at = at - _ZIP64_LOCATOR.size
    if (entries == 0xFFFF or directory_bytes == 0xFFFFFFFF) and locator_at >= 0:
        signature, _, offset, _ = _ZIP64_LOCATOR.unpack_from(tail, locator_at)
        if signature == b"PK\x06\x07" and offset + _ZIP64_EOCD.size <= size:
            raw.seek(offset)
            record64 = _ZIP64_EOCD.unpack(raw.read(_ZIP64_EOCD.size))
            if record64[0] == b"PK\x06\x06":
                entries, directory_bytes = record64[6], record64[7]
    return int(entries), int(directory_bytes)


# -- writing ----------------------------------------------------------------------------------


def _extract(
    archive: zipfile.ZipFile, members: list[_Member], user_dir: Path, name: str, max_total: int
) -> Path:
    """Stream the members into a hidden folder in `user_dir`, then rename it to `name`.

    Folders and files are made beneath the new folder's descriptor (`fsafe`), never by a
    path that something else in the user folder could have redirected.
    """
    user_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = user_dir / f".unpack-{secrets.token_hex(8)}"
    temp.mkdir(mode=0o700)
    try:
        root = temp / name
        root.mkdir(mode=0o755)
        budget = _Budget(max_total)
        with closing(open_dir_at(None, root)) as root_fd:
            for member in members:
                folder = member.parts if member.is_dir else member.parts[:-1]
                with walk(root_fd, folder, create_mode=0o755) as parent:
                    if not member.is_dir:
                        _write_member(archive, member.info, parent, member.parts[-1], budget)
        _check_free(user_dir, name)  # again: another unpack may have finished meanwhile
        os.rename(root, user_dir / name)
        return user_dir / name
    finally:
        shutil.rmtree(temp, ignore_errors=True)


class _Budget:
    """The bytes really written so far, against the cap (declared sizes are not trusted)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0

    def spend(self, count: int) -> None:
        self.used += count
        if self.used > self.max_bytes:
            raise _refused(f"it unpacks to more than {_mib(self.max_bytes)}")


def _write_member(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, parent: int, name: str, budget: _Budget
) -> None:
    mode = 0o755 if (info.external_attr >> 16) & stat.S_IXUSR else 0o644
    written = 0
    with archive.open(info) as src, _new_file(parent, name, mode) as out:
        for chunk in _chunks(src, info.filename):
            written += len(chunk)
            if written > info.file_size:
                raise _refused(f"member {info.filename!r} is larger than it declares")
            budget.spend(len(chunk))
            out.write(chunk)


def _chunks(src: IO[bytes], member: str) -> Iterator[bytes]:
    """The member's bytes as they are inflated; a damaged stream is a refusal."""
    while True:
        try:
            chunk = src.read(CHUNK_BYTES)
        except _DAMAGED as exc:
            raise _refused(f"member {member!r} is damaged ({exc})") from exc
        if not chunk:
            return
        yield chunk


@contextlib.contextmanager
def _new_file(parent: int, name: str, mode: int) -> Iterator[IO[bytes]]:
    fd = os.open(name, CREATE_FLAGS, mode, dir_fd=parent)
    with os.fdopen(fd, "wb") as out:
        yield out


def _check_free(user_dir: Path, name: str) -> None:
    if os.path.lexists(user_dir / name):
        raise _refused(f"a skill named {name!r} already exists in the user skills folder")


def _refused(reason: str) -> ArchiveRefused:
    return ArchiveRefused(f"skill archive refused: {reason}")


def _mib(count: int) -> str:
    return f"{count / MIB:g} MiB"
