"""Skill archives: good layouts unpack; hostile ones are refused and nothing is written."""

from __future__ import annotations

import io
import logging
import stat
import warnings
import zipfile
from pathlib import Path

import pytest

from corral.skills.archive import ArchiveRefused, set_aside, unpack_skill_zip
from corral.skills.catalog import SkillCatalog
from corral.texts import skills_text

MIB = 1024 * 1024
SKILL_MD = "---\nname: {name}\ndescription: A test skill.\n---\n\nUse it.\n"


def write_zip(path: Path, members: dict[str, bytes | str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def skill_zip(path: Path, name: str = "hello", top: bool = True) -> Path:
    prefix = f"{name}/" if top else ""
    return write_zip(
        path,
        {
            f"{prefix}SKILL.md": SKILL_MD.format(name=name),
            f"{prefix}scripts/run.py": "print('hello')\n",
            f"{prefix}data/": "",
        },
    )


def special_member(path: Path, name: str, kind: int, data: bytes) -> Path:
    """A zip with SKILL.md and one member whose unix mode (external_attr) has file type `kind`."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("s/SKILL.md", SKILL_MD.format(name="s"))
        info = zipfile.ZipInfo(f"s/{name}")
        info.create_system = 3  # unix, so the mode bits mean what they say
        info.external_attr = (kind | 0o777) << 16
        archive.writestr(info, data)
    return path


@pytest.fixture
def user(tmp_path: Path) -> Path:
    folder = tmp_path / "user"
    folder.mkdir()
    return folder


def assert_refused(zip_path: Path, user: Path, reason: str, **limits: int) -> None:
    """Refused with `reason`, and the user folder is exactly as it was (nothing half-written)."""
    before = sorted(p.name for p in user.iterdir())
    with pytest.raises(ArchiveRefused, match=reason):
        unpack_skill_zip(zip_path, user, **limits)
    assert sorted(p.name for p in user.iterdir()) == before


# -- good archives ------------------------------------------------------------------------


def test_a_skill_in_one_top_folder_unpacks_under_that_name(tmp_path: Path, user: Path) -> None:
    folder = unpack_skill_zip(skill_zip(tmp_path / "whatever.zip", "hello"), user)
    assert folder == user / "hello"
    assert (folder / "SKILL.md").read_text() == SKILL_MD.format(name="hello")
    assert (folder / "scripts" / "run.py").read_text() == "print('hello')\n"
    assert (folder / "data").is_dir()
    assert sorted(p.name for p in user.iterdir()) == ["hello"]  # no temporary folder left


def test_a_skill_at_the_root_is_named_after_the_archive(tmp_path: Path, user: Path) -> None:
    folder = unpack_skill_zip(skill_zip(tmp_path / "rooted.zip", "rooted", top=False), user)
    assert folder == user / "rooted"
    assert (folder / "scripts" / "run.py").is_file()


def test_macos_resource_forks_are_left_out(tmp_path: Path, user: Path) -> None:
    path = write_zip(
        tmp_path / "mac.zip",
        {"mac/SKILL.md": SKILL_MD.format(name="mac"), "__MACOSX/mac/._SKILL.md": b"\0\5junk"},
    )
    assert sorted(p.name for p in unpack_skill_zip(path, user).iterdir()) == ["SKILL.md"]


def test_an_existing_skill_is_not_replaced(tmp_path: Path, user: Path) -> None:
    (user / "hello").mkdir()
    (user / "hello" / "mine.txt").write_text("keep")
    assert_refused(skill_zip(tmp_path / "h.zip"), user, "a skill named 'hello' already exists")
    assert (user / "hello" / "mine.txt").read_text() == "keep"


# -- layout and SKILL.md ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ({"a/readme.txt": "x"}, "must hold SKILL.md at its root, or one folder"),
        ({"a/SKILL.md": SKILL_MD.format(name="a"), "b/x": "y"}, "one folder with SKILL.md"),
        ({"a/SKILL.md": "no front matter"}, "SKILL.md has no front matter"),
        ({"a/SKILL.md": "---\nname: [\n---\n"}, "front matter is not valid YAML"),
        ({"a/SKILL.md": b"---\nname: \xff\n---\n"}, "SKILL.md is not UTF-8"),
        ({"a b/SKILL.md": SKILL_MD.format(name="a b")}, "not a valid skill name"),
    ],
)
def test_a_bad_layout_or_skill_md_is_refused(
    tmp_path: Path, user: Path, members: dict[str, bytes | str], reason: str
) -> None:
    assert_refused(write_zip(tmp_path / "x.zip", members), user, reason)


# -- zip slip and friends -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        ("../evil", "climbs out with '..'"),
        ("s/../../evil", "climbs out with '..'"),
        ("a/../../b", "climbs out with '..'"),
        ("/abs/evil", "is an absolute path"),
        ("s\\..\\..\\evil", "contains a backslash"),
        ("C:/evil", "starts with a drive letter"),
        ("s/./x", "has an empty or '.' part"),
        ("s//x", "has an empty or '.' part"),
        ("s/new\nline", "control character"),
        ("s/" + "x" * 256, "longer than 255 bytes"),
    ],
)
def test_member_names_that_could_escape_are_refused(
    tmp_path: Path, user: Path, member: str, reason: str
) -> None:
    path = write_zip(tmp_path / "slip.zip", {"s/SKILL.md": SKILL_MD.format(name="s"), member: "x"})
    assert_refused(path, user, reason)
    assert not (tmp_path / "evil").exists()


def test_a_symlink_member_is_refused(tmp_path: Path, user: Path) -> None:
    path = special_member(tmp_path / "link.zip", "passwd", stat.S_IFLNK, b"/etc/passwd")
    assert_refused(path, user, "'s/passwd' is a symbolic link")


def test_a_fifo_member_is_refused(tmp_path: Path, user: Path) -> None:
    path = special_member(tmp_path / "fifo.zip", "pipe", stat.S_IFIFO, b"")
    assert_refused(path, user, "'s/pipe' is a special file")


def test_a_name_twice_is_refused(tmp_path: Path, user: Path) -> None:
    path = tmp_path / "twice.zip"
    with zipfile.ZipFile(path, "w") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate it is told to write
        archive.writestr("s/SKILL.md", SKILL_MD.format(name="s"))
        archive.writestr("s/x", "one")
        archive.writestr("s/x", "two")
    assert_refused(path, user, "'s/x' appears twice")


def test_a_file_where_a_folder_is_needed_is_refused(tmp_path: Path, user: Path) -> None:
    members = {"s/SKILL.md": SKILL_MD.format(name="s"), "s/a": "file", "s/a/b": "x"}
    assert_refused(write_zip(tmp_path / "clash.zip", members), user, "'a' is both a file")


# -- bounds ---------------------------------------------------------------------------------


def zip_bomb(path: Path, size_bytes: int) -> Path:
    """One member of `size_bytes` zeros, deflated while it is written (never all in memory)."""
    chunk = bytes(MIB)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/SKILL.md", SKILL_MD.format(name="bomb"))
        with archive.open("bomb/zeros.bin", "w", force_zip64=True) as out:
            for _ in range(size_bytes // MIB):
                out.write(chunk)
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = zip_bomb(tmp_path_factory.mktemp("bomb") / "bomb.zip", 300 * MIB)
    assert path.stat().st_size < 2 * MIB  # 300 MB of zeros deflate to about 300 KB
    return path


def test_a_zip_bomb_is_refused_by_its_ratio(bomb: Path, user: Path) -> None:
    assert_refused(bomb, user, "expands 1\\d\\d\\d times .*zip bomb")


def test_a_zip_bomb_is_refused_by_the_size_cap_too(bomb: Path, user: Path) -> None:
    assert_refused(bomb, user, "more than 200 MiB", max_ratio=10_000)


def test_many_small_members_past_the_size_cap_are_refused(tmp_path: Path, user: Path) -> None:
    members: dict[str, bytes | str] = {"s/SKILL.md": SKILL_MD.format(name="s")}
    members.update({f"s/{i}.txt": bytes(400_000) for i in range(3)})
    assert_refused(
        write_zip(tmp_path / "big.zip", members), user, "more than 1 MiB", max_total_bytes=MIB
    )


def test_too_many_files_are_refused_before_the_directory_is_read(
    tmp_path: Path, user: Path
) -> None:
    members: dict[str, bytes | str] = {"s/SKILL.md": SKILL_MD.format(name="s")}
    members.update({f"s/{i}": "" for i in range(2000)})
    assert_refused(write_zip(tmp_path / "many.zip", members), user, "2001 members; at most 2000")
    assert_refused(write_zip(tmp_path / "few.zip", members), user, "at most 5", max_files=5)


def encrypted_zip(path: Path) -> Path:
    """A zip whose second member is marked password-protected.

    Python's zipfile cannot write encrypted members, so a normal member is crafted instead:
    bit 0x1 (encrypted) is set in its general purpose flag, both in its local header (offset 6
    after the PK\\x03\\x04 signature) and in its central directory entry (offset 8 after
    PK\\x01\\x02). That flag is all a reader goes by to ask for a password.
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("s/SKILL.md", SKILL_MD.format(name="s"))
        archive.writestr("s/secret.txt", "hidden")
    data = bytearray(buffer.getvalue())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        secret = archive.getinfo("s/secret.txt")
    data[secret.header_offset + 6] |= 0x1
    central = data.rfind(b"PK\x01\x02")  # the last central entry is the secret's
    data[central + 8] |= 0x1
    path.write_bytes(bytes(data))
    return path


def test_an_encrypted_member_is_refused_as_password_protected(tmp_path: Path, user: Path) -> None:
    path = encrypted_zip(tmp_path / "locked.zip")
    with zipfile.ZipFile(path) as archive:
        assert archive.getinfo("s/secret.txt").flag_bits & 0x1
    assert_refused(path, user, "'s/secret.txt' is password-protected")


def test_something_that_is_not_a_zip_is_refused(tmp_path: Path, user: Path) -> None:
    path = tmp_path / "fake.zip"
    path.write_text("just text")
    assert_refused(path, user, "not a readable zip archive")


def test_a_truncated_zip_is_refused(tmp_path: Path, user: Path) -> None:
    data = skill_zip(tmp_path / "whole.zip").read_bytes()
    path = tmp_path / "cut.zip"
    path.write_bytes(data[: len(data) // 2])
    assert_refused(path, user, "not a readable zip archive")


def test_a_damaged_member_is_refused_and_its_partial_file_removed(
    tmp_path: Path, user: Path
) -> None:
    path = tmp_path / "damaged.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("s/SKILL.md", SKILL_MD.format(name="s"))
        archive.writestr("s/data.txt", "some text " * 10_000)
        data_info = archive.getinfo("s/data.txt")
    raw = bytearray(path.read_bytes())
    start = data_info.header_offset + 30 + len(data_info.filename)
    raw[start + 10 : start + 40] = bytes(30)  # corrupt the deflate stream
    path.write_bytes(bytes(raw))
    assert_refused(path, user, "'s/data.txt' is damaged")


# -- set aside, and the catalog's refresh -----------------------------------------------------


def test_set_aside_renames_and_writes_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "x.zip"
    path.write_text("junk")
    bad = set_aside(path, "it is junk")
    assert bad == tmp_path / "x.zip.bad"
    assert not path.exists() and bad.read_text() == "junk"
    assert (tmp_path / "x.zip.bad.txt").read_text() == "it is junk\n"


def test_refresh_sets_bad_archives_aside_and_still_lists_the_good_ones(
    tmp_path: Path, user: Path, caplog: pytest.LogCaptureFixture
) -> None:
    public = tmp_path / "public"
    public.mkdir()
    skill_zip(user / "good.zip", "good")
    write_zip(user / "slip.zip", {"s/SKILL.md": SKILL_MD.format(name="s"), "../evil": "x"})
    encrypted_zip(user / "locked.zip")
    (user / "fake.zip").write_text("not a zip")
    catalog = SkillCatalog(public, user)

    with caplog.at_level(logging.WARNING, logger="corral.skills.catalog"):
        entries = catalog.list()

    assert [(e.name, e.problem) for e in entries] == [("good", None)]
    assert not (user / "good.zip").exists()  # unpacked, so removed
    assert set(catalog.problems) == {"fake.zip", "locked.zip", "slip.zip"}
    for name, reason in [
        ("slip", "climbs out with '..'"),
        ("locked", "password-protected"),
        ("fake", "not a readable zip archive"),
    ]:
        assert (user / f"{name}.zip.bad").is_file() and not (user / f"{name}.zip").exists()
        assert reason in (user / f"{name}.zip.bad.txt").read_text()
        assert any(f"{name}.zip set aside" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "evil").exists()

    text = skills_text(catalog.listing())
    assert "User Skills (1):\n  - good: A test skill.\n" in text
    assert "Archives set aside in the user skills folder (3):\n" in text
    assert "  - locked.zip.bad: skill archive refused: member 's/secret.txt' is password" in text
    assert text.endswith(
        "Use get_skill_info(skill_name) to read documentation for a specific skill."
    )
    assert catalog.list() == entries  # a second refresh finds nothing new to do


def test_refresh_sets_aside_a_link_posing_as_an_archive(tmp_path: Path, user: Path) -> None:
    target = skill_zip(tmp_path / "real.zip", "real")
    (user / "real.zip").symlink_to(target)
    catalog = SkillCatalog(tmp_path / "public", user)
    assert catalog.list() == []
    assert (user / "real.zip.bad").is_symlink()
    assert "symbolic link" in (user / "real.zip.bad.txt").read_text()
    assert target.is_file() and not (user / "real").exists()
