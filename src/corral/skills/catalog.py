"""The skills an agent can use: listing them, and reading their SKILL.md and other files.

A skill is a folder with a SKILL.md whose YAML front matter gives `name` (equal to the
folder's name) and `description`. Public skills ship with corral; user skills live in a
folder of their own, where a dropped `.zip` is unpacked on `refresh()` (see `archive`).
Both are shown read-only inside every sandbox under `sandbox_root`, and every text names
that path, never the host's.

The user folder is not corral's: anything may be in it. Files are read through `corral.fsafe`,
walking directory descriptors with `O_NOFOLLOW` (a link anywhere is refused, never followed), only
regular files are opened, and every read is capped. A skill with a problem (bad front
matter, a link for a folder, a user skill with a public skill's name) is still listed, with
the problem, so one bad skill never hides the others.

The structured calls (`list`, `info`, `file`) raise, from `corral.errors`:
    InvalidInput   a bad skill name or file name, a link, a folder or special file where a
                   file is wanted, a file that is not UTF-8 text where text is wanted
    NotFound       no such skill or file
    TooLarge       a file over `max_file_bytes`
The agent's texts (coderunner's forms, "Error: ..." instead of raising) are made from
these in `corral.texts`.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from corral.errors import CorralError, InvalidInput, NotFound, TooLarge
from corral.fsafe import LinkRefused, NotRegular, UnsafePath, open_file_beneath
from corral.skills import SANDBOX_SKILLS
from corral.skills.archive import (
    SKILL_MD,
    SKILL_NAME,
    ArchiveRefused,
    FrontMatterError,
    parse_front_matter,
    set_aside,
    unpack_skill_zip,
)

log = logging.getLogger(__name__)

Source = Literal["public", "user"]
SOURCES: tuple[Source, ...] = ("public", "user")
MIB = 1024 * 1024
MAX_FILE_NAME_BYTES = 4096
MAX_REASON_BYTES = 4096  # of a set-aside archive's .txt note


@dataclass(frozen=True)
class SkillEntry:
    """One skill as listed. `path` is on the host; `location` is where the sandbox sees it."""

    name: str
    description: str
    source: Source
    path: Path
    location: str
    problem: str | None


@dataclass(frozen=True)
class SetAside:
    """An archive in the user folder that was refused, and why."""

    name: str  # the file name, ending in .zip.bad
    reason: str


@dataclass(frozen=True)
class SkillListing:
    """Every skill (public first) and the user archives set aside."""

    skills: tuple[SkillEntry, ...]
    set_aside: tuple[SetAside, ...]


@dataclass(frozen=True)
class SkillInfo:
    """A skill's listing entry and its SKILL.md text."""

    entry: SkillEntry
    content: str


@dataclass(frozen=True)
class SkillFile:
    """One text file of a skill; `location` is its path in the sandbox."""

    skill: str
    source: Source
    filename: str
    location: str
    content: str


class SkillCatalog:
    """The public and user skills; cheap to build, holds no descriptor between calls."""

    def __init__(
        self,
        public_dir: Path,
        user_dir: Path,
        *,
        sandbox_root: str = SANDBOX_SKILLS,
        max_file_bytes: int = MIB,
    ) -> None:
        self.dirs: dict[Source, Path] = {"public": public_dir, "user": user_dir}
        self.sandbox_root = sandbox_root
        self.max_file_bytes = max_file_bytes
        self.problems: dict[str, str] = {}  # archive file name -> why this catalog refused it
        self._refreshing = threading.Lock()

    # -- the user folder -----------------------------------------------------------------

    def refresh(self) -> list[Path]:
        """Unpack every `.zip` waiting in the user folder; return the new skill folders.

        An unpacked archive is removed. A refused one is renamed `<name>.zip.bad` beside a
        `<name>.zip.bad.txt` with the reason, which is logged and kept in `problems`; the
        others are unpacked all the same. A link named `*.zip` is set aside too; a folder so
        named is left alone (it is listed as a skill). Holds a lock while it works, so call
        it from a worker thread in async code.
        """
        user = self.dirs["user"]
        added: list[Path] = []
        with self._refreshing:
            for zip_path in _pending_archives(user):
                try:
                    added.extend(self._unpack(zip_path))
                except ArchiveRefused as exc:
                    self._set_aside(zip_path, str(exc))
                except FileNotFoundError:
                    continue  # taken away meanwhile
                except OSError as exc:  # left in place, tried again next time
                    log.error("skill archive %s could not be unpacked: %s", zip_path.name, exc)
                    self.problems[zip_path.name] = f"it could not be unpacked: {exc}"
        return added

    def _unpack(self, zip_path: Path) -> list[Path]:
        if zip_path.is_symlink():
            raise ArchiveRefused("skill archive refused: it is a symbolic link")
        if not zip_path.is_file():
            return []
        folder = unpack_skill_zip(zip_path, self.dirs["user"])
        zip_path.unlink()
        log.info("skill archive %s unpacked into %s", zip_path.name, folder)
        return [folder]

    def _set_aside(self, zip_path: Path, reason: str) -> None:
        log.warning("skill archive %s set aside: %s", zip_path.name, reason)
        self.problems[zip_path.name] = reason
        try:
            set_aside(zip_path, reason)
        except OSError as exc:
            log.error("skill archive %s could not be set aside: %s", zip_path.name, exc)

    def set_aside_archives(self) -> list[SetAside]:
        """The `.zip.bad` files in the user folder, with the reasons from their notes."""
        found = []
        for entry in _listing(self.dirs["user"]):
            if entry.name.endswith(".zip.bad") and not entry.name.startswith("."):
                note = _read_note(Path(entry.path + ".txt"))
                found.append(SetAside(entry.name, note or "no reason was recorded"))
        return found

    # -- structured ------------------------------------------------------------------------

    def list(self) -> list[SkillEntry]:
        """Every skill, public first, each sorted by name; `refresh()` runs first."""
        self.refresh()
        public = [self._entry("public", path) for path in _names(self.dirs["public"])]
        taken = {entry.name for entry in public}
        user = []
        for path in _names(self.dirs["user"]):
            entry = self._entry("user", path)
            if entry.name in taken:
                shadowed = "a public skill has the same name, so this one is hidden; rename it"
                entry = _with_problem(entry, shadowed)
            user.append(entry)
        return public + user

    def listing(self) -> SkillListing:
        """`list()`, then the archives it set aside (`set_aside_archives()`)."""
        return SkillListing(tuple(self.list()), tuple(self.set_aside_archives()))

    def info(self, name: str) -> SkillInfo:
        """The skill's listing entry and its SKILL.md text."""
        source, path = self._find(name)
        entry = self._entry(source, path)
        return SkillInfo(entry, self._read_text(source, name, SKILL_MD))

    def text_file(self, name: str, filename: str) -> SkillFile:
        """`filename` of skill `name` as UTF-8 text, with where the sandbox sees it."""
        source, _ = self._find(name)
        content = self._read_text(source, name, filename)
        location = f"{self._location(source, name)}/{filename}"
        return SkillFile(name, source, filename, location, content)

    def file(self, name: str, filename: str) -> bytes:
        """The bytes of `filename` in skill `name`, at most `max_file_bytes`."""
        source, _ = self._find(name)
        return self._read(source, name, _split_filename(filename, name))

    # -- helpers -----------------------------------------------------------------------------

    def _location(self, source: Source, name: str) -> str:
        return f"{self.sandbox_root}/{source}/{name}"

    def _find(self, name: str) -> tuple[Source, Path]:
        """Which folder holds skill `name` (public first, so a user skill cannot shadow it)."""
        _check_name(name)
        for source in SOURCES:
            path = self.dirs[source] / name
            if os.path.lexists(path):
                return source, path
        raise NotFound(f"Skill '{name}' not found.")

    def _entry(self, source: Source, path: Path) -> SkillEntry:
        name = path.name
        location = self._location(source, name)
        try:
            meta = parse_front_matter(self._read_text(source, name, SKILL_MD))
        except (CorralError, FrontMatterError) as exc:
            return SkillEntry(name, "", source, path, location, _problem(exc))
        description = meta.get("description")
        description = description.strip() if isinstance(description, str) else ""
        problem = _name_problem(name) or _meta_problem(meta, name, description)
        return SkillEntry(name, description, source, path, location, problem)

    def _read_text(self, source: Source, name: str, filename: str) -> str:
        data = self._read(source, name, _split_filename(filename, name))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(
                f"File '{filename}' in skill '{name}' is not UTF-8 text; read it inside the "
                f"sandbox at {self._location(source, name)}/{filename}."
            ) from None

    def _read(self, source: Source, name: str, parts: tuple[str, ...]) -> bytes:
        """Read `parts` under skill `name`, no link followed; raises corral errors."""
        filename = "/".join(parts)
        try:
            return _read_regular(self.dirs[source], (name, *parts), self.max_file_bytes)
        except UnsafePath as blocked:
            raise _blocked_error(blocked, name, filename) from None
        except _Oversized as large:
            raise TooLarge(
                f"File '{filename}' in skill '{name}' is {large.size_bytes} bytes, over the "
                f"{self.max_file_bytes} bytes returned here; read it inside the sandbox at "
                f"{self._location(source, name)}/{filename}."
            ) from None
        except FileNotFoundError:
            if filename == SKILL_MD:
                raise NotFound(f"Skill '{name}' has no {SKILL_MD}.") from None
            raise NotFound(f"File '{filename}' not found in skill '{name}'.") from None
        except NotADirectoryError:
            raise NotFound(f"File '{filename}' not found in skill '{name}'.") from None


# -- names -------------------------------------------------------------------------------------


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not SKILL_NAME.fullmatch(name):
        raise InvalidInput(
            f"Invalid skill name {name!r}: use letters, digits, '-', '_' and '.', not starting "
            "with '.', at most 128 characters."
        )


def _split_filename(filename: object, skill: str) -> tuple[str, ...]:
    """The parts of a file name relative to the skill folder; raises `InvalidInput`."""
    if not isinstance(filename, str) or not filename:
        raise InvalidInput(f"Invalid file name {filename!r}: it must be a non-empty string.")
    reason = None
    parts = filename.split("/")
    if "\0" in filename:
        reason = "it contains a NUL byte"
    elif len(filename.encode("utf-8", "surrogateescape")) > MAX_FILE_NAME_BYTES:
        reason = f"it is longer than {MAX_FILE_NAME_BYTES} bytes"
    elif filename.startswith("/"):
        reason = f"it is absolute; give a path relative to the skill folder of '{skill}'"
    elif ".." in parts:
        reason = "'..' parts are refused"
    elif any(part in ("", ".") for part in parts):
        reason = "it has an empty or '.' part"
    if reason:
        raise InvalidInput(f"Invalid file name {filename!r}: {reason}.")
    return tuple(parts)


def _name_problem(name: str) -> str | None:
    if SKILL_NAME.fullmatch(name):
        return None
    return "its folder name is not a valid skill name (letters, digits, '-', '_', '.')"


def _meta_problem(meta: dict[str, Any], folder: str, description: str) -> str | None:
    declared = meta.get("name")
    if declared is None:
        return "SKILL.md front matter has no 'name'"
    if declared != folder:
        return (
            f"SKILL.md front matter says name: {declared!r}, but the folder is {folder!r}; "
            "they must be the same"
        )
    if not isinstance(meta.get("description"), str):
        return "SKILL.md front matter has no 'description' text"
    if not description:
        return "SKILL.md front matter has an empty 'description'"
    return None


def _problem(exc: Exception) -> str:
    return str(exc).rstrip(".")


def _with_problem(entry: SkillEntry, problem: str) -> SkillEntry:
    return SkillEntry(
        entry.name, entry.description, entry.source, entry.path, entry.location, problem
    )


# -- the file system -----------------------------------------------------------------------


def _listing(folder: Path) -> list[os.DirEntry[str]]:
    """The entries of `folder` sorted by name; none when it does not exist."""
    try:
        return sorted(os.scandir(folder), key=lambda entry: entry.name)
    except FileNotFoundError:
        return []


def _names(folder: Path) -> list[Path]:
    """Skill folders and links posing as one; neither hidden names nor set-aside archives."""
    return [
        Path(entry.path)
        for entry in _listing(folder)
        if not entry.name.startswith(".")
        and not entry.name.endswith(".zip.bad")
        and (entry.is_dir(follow_symlinks=False) or entry.is_symlink())
    ]


def _pending_archives(folder: Path) -> list[Path]:
    return [
        Path(entry.path)
        for entry in _listing(folder)
        if entry.name.lower().endswith(".zip") and not entry.name.startswith(".")
    ]


def _read_note(path: Path) -> str | None:
    try:
        data = _read_regular(path.parent, (path.name,), MAX_REASON_BYTES, truncate=True)
    except (UnsafePath, OSError):
        return None
    text = data.decode("utf-8", "replace").strip()
    return " ".join(text.split()) or None


def _blocked_error(blocked: UnsafePath, name: str, filename: str) -> CorralError:
    """The catalog's words for a link, a folder or a special file met on the way."""
    where = "/".join(blocked.parts[1:])
    subject = f"Skill '{name}'" if not where else f"'{where}' in skill '{name}'"
    if isinstance(blocked, LinkRefused):
        return InvalidInput(
            f"{subject} is a symbolic link; links in skills are refused, never followed."
        )
    if isinstance(blocked, NotRegular) and blocked.is_dir:
        return InvalidInput(f"'{filename}' in skill '{name}' is a folder, not a file.")
    if isinstance(blocked, NotRegular):
        return InvalidInput(
            f"{subject} is not a regular file (a FIFO, socket or device); it is not read."
        )
    return InvalidInput(f"Invalid file name {filename!r}.")


class _Oversized(Exception):
    """A file longer than could be returned; `size_bytes` is what was seen of it."""

    def __init__(self, size_bytes: int) -> None:
        super().__init__(size_bytes)
        self.size_bytes = size_bytes


def _read_regular(
    root: Path, parts: tuple[str, ...], max_bytes: int, *, truncate: bool = False
) -> bytes:
    """The bytes of regular file `root/parts...`, no link followed on the way (`fsafe`).

    Raises `fsafe.UnsafePath`, `_Oversized`, or FileNotFoundError / NotADirectoryError when a
    part is missing or a file stands where a folder should. With `truncate`, a longer file is
    cut at `max_bytes`.
    """
    with os.fdopen(open_file_beneath(root, parts), "rb") as src:
        size = os.fstat(src.fileno()).st_size
        if size > max_bytes and not truncate:
            raise _Oversized(size)
        data = src.read(max_bytes + 1)
    if len(data) > max_bytes and not truncate:
        raise _Oversized(len(data))
    return data[:max_bytes]
