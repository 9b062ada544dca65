"""Operator mounts: parsing `NAME=PATH[:ro|rw]` and checking the folders on a real disk."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from corral.errors import InvalidInput
from corral.mounts import MountSpec, overlapping, parse_mount, parse_mount_list, validate_mounts


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """tmp_path by its real name, so the only links in a test are the ones it makes."""
    return tmp_path.resolve()


@pytest.fixture
def home(base: Path) -> Path:
    path = base / "home" / "dev"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def own_dirs(base: Path) -> list[Path]:
    """corral's state dir, the config dir holding the tokens, and the run root."""
    dirs = [base / "state", base / "config" / "corral", base / "run"]
    for path in dirs:
        path.mkdir(parents=True)
    return dirs


@pytest.fixture
def project(home: Path) -> Path:
    path = home / "proj"
    path.mkdir()
    return path


def check(
    specs: Sequence[MountSpec], home: Path, own: Sequence[Path], *, allow_home: bool = False
) -> dict[str, MountSpec]:
    return validate_mounts(specs, home=home, protected=own, allow_home=allow_home)


# -- parsing ---------------------------------------------------------------------------------


def test_a_mount_is_read_only_by_default() -> None:
    assert parse_mount("proj=/src/proj") == MountSpec("proj", Path("/src/proj"), False)


@pytest.mark.parametrize(("suffix", "writable"), [(":ro", False), (":rw", True)])
def test_an_explicit_suffix_sets_the_access(suffix: str, writable: bool) -> None:
    assert parse_mount(f"proj=/src/proj{suffix}") == MountSpec("proj", Path("/src/proj"), writable)


def test_only_the_last_suffix_is_parsed_so_a_path_may_hold_a_colon() -> None:
    assert parse_mount("a=/x:y:rw") == MountSpec("a", Path("/x:y"), True)
    assert parse_mount("a=/x:ro:rw") == MountSpec("a", Path("/x:ro"), True)
    assert parse_mount("a=/x:rw:ro") == MountSpec("a", Path("/x:rw"), False)


@pytest.mark.parametrize("text", ["a=/x:y", "a=/x:RW", "a=/x:rwx", "a=/x:"])
def test_a_path_with_a_colon_and_no_explicit_suffix_is_refused(text: str) -> None:
    with pytest.raises(InvalidInput, match="':ro' or ':rw'"):
        parse_mount(text)


def test_a_relative_path_is_made_absolute_against_cwd(base: Path) -> None:
    assert parse_mount("p=src/p:rw", cwd=base) == MountSpec("p", base / "src" / "p", True)


@pytest.mark.parametrize(
    "name", ["", ".", "..", "-a", "_a", ".a", "a/b", "a b", "a:b", "é", "a" * 65, "a\nb"]
)
def test_a_bad_mount_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match="mount name"):
        parse_mount(f"{name}=/x")


def test_the_longest_name_is_accepted() -> None:
    name = "A" + "b_.-9" * 12 + "xyz"
    assert len(name) == 64
    assert parse_mount(f"{name}=/x").name == name


@pytest.mark.parametrize("text", ["proj", "proj=", "proj=:rw", "proj=/a\0b"])
def test_a_spec_without_a_usable_path_is_refused(text: str) -> None:
    with pytest.raises(InvalidInput, match="proj"):
        parse_mount(text)


def test_a_leading_tilde_is_the_home_directory(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(base / "somebody"))
    assert parse_mount("p=~/src/p").path == base / "somebody" / "src" / "p"


def test_the_environment_form_is_a_comma_separated_list() -> None:
    specs = parse_mount_list(" a=/x:rw, b=/y ,,")
    assert specs == [MountSpec("a", Path("/x"), True), MountSpec("b", Path("/y"), False)]
    assert parse_mount_list("") == []


# -- validating on disk ----------------------------------------------------------------------


def test_valid_mounts_come_back_by_name_with_the_normalised_path(
    project: Path, home: Path, own_dirs: list[Path]
) -> None:
    other = home / "other"
    other.mkdir()
    specs = [MountSpec("p", Path(f"{project}/./"), True), MountSpec("o", other, False)]
    result = check(specs, home, own_dirs)
    assert result == {"p": MountSpec("p", project, True), "o": MountSpec("o", other, False)}


def test_a_missing_path_is_refused(home: Path, own_dirs: list[Path]) -> None:
    with pytest.raises(InvalidInput, match=r"mount 'p': .*/nothing does not exist"):
        check([MountSpec("p", home / "nothing", False)], home, own_dirs)


def test_a_file_is_refused(home: Path, own_dirs: list[Path]) -> None:
    (home / "notes.txt").write_text("x")
    with pytest.raises(InvalidInput, match="is not a directory"):
        check([MountSpec("p", home / "notes.txt", False)], home, own_dirs)


def test_a_relative_spec_path_is_refused(home: Path, own_dirs: list[Path]) -> None:
    with pytest.raises(InvalidInput, match="not an absolute path"):
        check([MountSpec("p", Path("proj"), False)], home, own_dirs)


def test_a_path_through_a_link_is_refused_naming_the_link_and_the_real_path(
    base: Path, home: Path, own_dirs: list[Path]
) -> None:
    real = base / "real"
    (real / "proj").mkdir(parents=True)
    (base / "link").symlink_to(real)
    with pytest.raises(InvalidInput) as caught:
        check([MountSpec("x", base / "link" / "proj", True)], home, own_dirs)
    assert str(caught.value) == (
        f"mount 'x': {base}/link/proj goes through a symbolic link "
        f"({base}/link -> {real}); name the real path {real}/proj"
    )


def test_a_link_as_the_last_component_is_refused(
    project: Path, home: Path, own_dirs: list[Path]
) -> None:
    (home / "shortcut").symlink_to("proj")
    with pytest.raises(InvalidInput, match=r"\(.*/shortcut -> proj\); name the real path"):
        check([MountSpec("x", home / "shortcut", False)], home, own_dirs)


def test_dot_dot_after_a_link_is_refused(base: Path, home: Path, own_dirs: list[Path]) -> None:
    (base / "deep" / "er").mkdir(parents=True)
    (base / "deep" / "proj").mkdir()
    (home / "jump").symlink_to(base / "deep" / "er")
    with pytest.raises(InvalidInput, match="goes through a symbolic link"):
        check([MountSpec("x", Path(f"{home}/jump/../proj"), False)], home, own_dirs)


def test_root_is_refused(home: Path, own_dirs: list[Path]) -> None:
    with pytest.raises(InvalidInput, match="whole host"):
        check([MountSpec("all", Path("/"), False)], home, own_dirs, allow_home=True)


def test_the_home_directory_is_refused(home: Path, own_dirs: list[Path]) -> None:
    with pytest.raises(InvalidInput, match="is the home directory or contains it"):
        check([MountSpec("h", home, False)], home, own_dirs)


def test_an_ancestor_of_home_is_refused(home: Path, own_dirs: list[Path]) -> None:
    with pytest.raises(InvalidInput, match="is the home directory or contains it"):
        check([MountSpec("h", home.parent, False)], home, own_dirs)


def test_home_and_its_ancestors_are_allowed_when_asked(home: Path, own_dirs: list[Path]) -> None:
    specs = [MountSpec("h", home, False), MountSpec("all", home.parent, False)]
    assert set(check(specs, home, own_dirs, allow_home=True)) == {"h", "all"}


def test_a_folder_inside_home_is_allowed(project: Path, home: Path, own_dirs: list[Path]) -> None:
    assert check([MountSpec("p", project, True)], home, own_dirs)["p"].path == project


def test_the_state_dir_is_refused(home: Path, own_dirs: list[Path]) -> None:
    with pytest.raises(InvalidInput, match="is corral's own directory"):
        check([MountSpec("s", own_dirs[0], False)], home, own_dirs)


def test_a_folder_inside_the_state_dir_is_refused(home: Path, own_dirs: list[Path]) -> None:
    session = own_dirs[0] / "sessions" / "abc"
    session.mkdir(parents=True)
    with pytest.raises(InvalidInput, match="is inside corral's own directory"):
        check([MountSpec("s", session, True)], home, own_dirs)


def test_an_ancestor_of_the_token_dir_is_refused(
    base: Path, home: Path, own_dirs: list[Path]
) -> None:
    with pytest.raises(InvalidInput, match=r"contains corral's own directory .*/config/corral"):
        check([MountSpec("c", base / "config", False)], home, own_dirs)


def test_the_real_state_dir_is_refused_when_corral_names_it_through_a_link(
    base: Path, home: Path, own_dirs: list[Path]
) -> None:
    (base / "state-link").symlink_to(own_dirs[0])
    with pytest.raises(InvalidInput, match="corral's own directory"):
        check([MountSpec("s", own_dirs[0], False)], home, [base / "state-link"])


def test_a_name_given_twice_is_refused(project: Path, home: Path, own_dirs: list[Path]) -> None:
    specs = [MountSpec("p", project, False), MountSpec("p", project, True)]
    with pytest.raises(InvalidInput, match="named twice"):
        check(specs, home, own_dirs)


def test_a_control_character_in_a_path_is_escaped_in_the_message(
    home: Path, own_dirs: list[Path]
) -> None:
    with pytest.raises(InvalidInput) as caught:
        check([MountSpec("p", home / "a\x1b[2Jb", False)], home, own_dirs)
    assert "a\\x1b[2Jb does not exist" in str(caught.value)
    assert "\x1b" not in str(caught.value)


# -- overlap ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("/src/p", "/src/p", True),
        ("/src/p", "/src/p/", True),
        ("/src", "/src/p/sub", True),
        ("/src/p/sub", "/src", True),
        ("/src/p", "/src/q", False),
        ("/src/p", "/src/pq", False),
        ("/", "/anything", True),
    ],
)
def test_overlapping(a: str, b: str, expected: bool) -> None:
    assert overlapping(Path(a), Path(b)) is expected
    assert overlapping(Path(b), Path(a)) is expected
