"""The workspace file API against a real directory the sandbox could have filled with traps."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.errors import Conflict, FileNotFoundInWorkspace, PathRefused, TooLarge
from corral.files import MAX_LIST_DEPTH, Workspace
from corral.server.operation import wire
from corral.server.schemas import FileListing


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def ws(root: Path) -> Workspace:
    return Workspace(root, max_file_bytes=1024)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A host file outside the workspace that nothing may read or change."""
    path = tmp_path / "secret"
    path.write_bytes(b"host secret")
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory outside the workspace, holding one file."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "x").write_bytes(b"outside x")
    return path


# -- round trips -----------------------------------------------------------------------------


def test_write_then_read_returns_the_same_bytes(ws: Workspace) -> None:
    ws.write("data.bin", b"\x00\x01hello")
    assert ws.read("data.bin") == b"\x00\x01hello"


def test_write_returns_the_entry_of_the_new_file(ws: Workspace) -> None:
    entry = ws.write("a.txt", b"abc")
    assert (entry.path, entry.kind, entry.size_bytes) == ("a.txt", "file", 3)


def test_write_creates_missing_parents_with_fixed_modes(ws: Workspace, root: Path) -> None:
    ws.write("a/b/c.txt", b"deep")
    assert (root / "a" / "b" / "c.txt").read_bytes() == b"deep"
    assert stat.S_IMODE((root / "a" / "b").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "a" / "b" / "c.txt").stat().st_mode) == 0o644


def test_write_without_make_parents_needs_the_parent(ws: Workspace, root: Path) -> None:
    with pytest.raises(FileNotFoundInWorkspace):
        ws.write("missing/c.txt", b"x", make_parents=False)
    assert not (root / "missing").exists()


def test_overwrite_replaces_the_content(ws: Workspace) -> None:
    ws.write("a.txt", b"old content")
    ws.write("a.txt", b"new")
    assert ws.read("a.txt") == b"new"


def test_write_leaves_no_temporary_file(ws: Workspace, root: Path) -> None:
    ws.write("a.txt", b"x")
    assert sorted(p.name for p in root.iterdir()) == ["a.txt"]


def test_write_with_overwrite_false_keeps_an_existing_file(ws: Workspace) -> None:
    ws.write("a.txt", b"old")
    with pytest.raises(Conflict, match="already exists"):
        ws.write("a.txt", b"new", overwrite=False)
    assert ws.read("a.txt") == b"old"


def test_write_does_not_change_a_hard_linked_host_file(
    ws: Workspace, root: Path, secret: Path
) -> None:
    os.link(secret, root / "hard")
    ws.write("hard", b"replaced")
    assert secret.read_bytes() == b"host secret"
    assert ws.read("hard") == b"replaced"


# -- listing and stat ------------------------------------------------------------------------


def test_list_is_flat_sorted_and_names_every_kind(ws: Workspace, root: Path) -> None:
    (root / "b.txt").write_bytes(b"12345")
    (root / "a_dir").mkdir()
    (root / "a_dir" / "inner.txt").write_bytes(b"")
    os.symlink("/etc", root / "c_link")
    os.mkfifo(root / "d_fifo")
    listing = ws.list(".")
    assert [(e.path, e.kind) for e in listing.entries] == [
        ("a_dir", "dir"),
        ("b.txt", "file"),
        ("c_link", "link"),
        ("d_fifo", "other"),
    ]
    assert listing.entries[1].size_bytes == 5
    assert not listing.truncated


def test_list_recursive_walks_nested_directories(ws: Workspace) -> None:
    ws.write("a/b/c.txt", b"x")
    ws.write("top.txt", b"y")
    paths = [e.path for e in ws.list("", recursive=True).entries]
    assert paths == ["a", "a/b", "a/b/c.txt", "top.txt"]


def test_list_of_a_subdirectory_gives_paths_from_the_root(ws: Workspace) -> None:
    ws.write("a/b/c.txt", b"x")
    assert [e.path for e in ws.list("a/b").entries] == ["a/b/c.txt"]


def test_list_recursive_does_not_enter_links(ws: Workspace, root: Path, outside: Path) -> None:
    os.symlink(outside, root / "d")
    entries = ws.list(".", recursive=True).entries
    assert [(e.path, e.kind) for e in entries] == [("d", "link")]


def test_list_stops_at_max_entries_and_says_so(ws: Workspace) -> None:
    for i in range(5):
        ws.write(f"f{i}.txt", b"")
    listing = ws.list(".", max_entries=3)
    assert len(listing.entries) == 3
    assert listing.truncated


def test_list_recursive_does_not_enter_past_max_depth(ws: Workspace, root: Path) -> None:
    (root / "/".join(["n"] * (MAX_LIST_DEPTH + 5))).mkdir(parents=True)
    listing = ws.list(".", recursive=True)
    assert len(listing.entries) == MAX_LIST_DEPTH + 1
    assert listing.truncated


def test_a_listing_on_the_wire_is_plain_data(ws: Workspace) -> None:
    ws.write("a.txt", b"abc")
    data = wire(FileListing, ws.list())
    assert data["truncated"] is False
    assert data["entries"][0]["path"] == "a.txt"
    assert data["entries"][0]["kind"] == "file"
    assert data["entries"][0]["size_bytes"] == 3


def test_list_of_a_file_is_a_conflict(ws: Workspace) -> None:
    ws.write("a.txt", b"")
    with pytest.raises(Conflict, match="not a directory"):
        ws.list("a.txt")


def test_stat_describes_a_link_without_following_it(ws: Workspace, root: Path) -> None:
    os.symlink("/etc/passwd", root / "l")
    assert ws.stat("l").kind == "link"


def test_stat_of_the_root(ws: Workspace) -> None:
    assert (ws.stat(".").path, ws.stat(".").kind) == (".", "dir")


# -- path rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["..", "../secret", "a/../../secret", "a/.."])
def test_dotdot_is_refused(ws: Workspace, path: str) -> None:
    with pytest.raises(PathRefused, match=r"'\.\.'"):
        ws.read(path)


def test_absolute_path_is_refused(ws: Workspace, secret: Path) -> None:
    with pytest.raises(PathRefused, match="absolute"):
        ws.read(str(secret))


def test_workspace_prefix_is_stripped(ws: Workspace) -> None:
    ws.write("/workspace/a.txt", b"seen inside as /workspace")
    assert ws.read("a.txt") == b"seen inside as /workspace"
    assert [e.path for e in ws.list("/workspace").entries] == ["a.txt"]


def test_leading_dot_slash_is_accepted(ws: Workspace) -> None:
    ws.write("./a.txt", b"x")
    assert ws.read("a.txt") == b"x"


def test_nul_byte_is_refused(ws: Workspace) -> None:
    with pytest.raises(PathRefused, match="NUL"):
        ws.write("a\0b", b"x")


def test_empty_path_is_refused_for_read(ws: Workspace) -> None:
    with pytest.raises(PathRefused, match="empty"):
        ws.read("")


def test_path_over_4096_bytes_is_refused(ws: Workspace) -> None:
    with pytest.raises(PathRefused, match="4096"):
        ws.write("a/" * 2049, b"x")


def test_component_over_255_bytes_is_refused(ws: Workspace) -> None:
    with pytest.raises(PathRefused, match="255"):
        ws.write("a" * 256, b"x")


# -- links pointing out ----------------------------------------------------------------------


def test_link_to_a_host_file_is_refused_for_read(ws: Workspace, root: Path, secret: Path) -> None:
    os.symlink(secret, root / "l")
    with pytest.raises(PathRefused, match="symbolic link"):
        ws.read("l")


def test_write_through_a_link_is_refused_and_the_target_survives(
    ws: Workspace, root: Path, secret: Path
) -> None:
    os.symlink(secret, root / "l")
    with pytest.raises(PathRefused, match="symbolic link"):
        ws.write("l", b"overwritten")
    assert secret.read_bytes() == b"host secret"


def test_delete_of_a_link_removes_the_link_only(ws: Workspace, root: Path, secret: Path) -> None:
    os.symlink(secret, root / "l")
    ws.delete("l")
    assert not os.path.lexists(root / "l")
    assert secret.read_bytes() == b"host secret"


def test_link_as_parent_is_refused_for_read(ws: Workspace, root: Path, outside: Path) -> None:
    os.symlink(outside, root / "d")
    with pytest.raises(PathRefused, match="'d' is a symbolic link"):
        ws.read("d/x")


def test_link_as_parent_is_refused_for_write_and_creates_nothing_outside(
    ws: Workspace, root: Path, outside: Path
) -> None:
    os.symlink(outside, root / "d")
    with pytest.raises(PathRefused):
        ws.write("d/new.txt", b"x")
    with pytest.raises(PathRefused):
        ws.write("d/sub/new.txt", b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["x"]


def test_link_as_parent_is_refused_for_delete(ws: Workspace, root: Path, outside: Path) -> None:
    os.symlink(outside, root / "d")
    with pytest.raises(PathRefused):
        ws.delete("d/x")
    assert (outside / "x").read_bytes() == b"outside x"


def test_link_as_listed_directory_is_refused(ws: Workspace, root: Path, outside: Path) -> None:
    os.symlink(outside, root / "d")
    with pytest.raises(PathRefused):
        ws.list("d")


# -- special files and types -----------------------------------------------------------------


@pytest.mark.timeout(10)
def test_fifo_is_refused_for_read_without_blocking(ws: Workspace, root: Path) -> None:
    os.mkfifo(root / "pipe")
    with pytest.raises(PathRefused, match="FIFO"):
        ws.read("pipe")


def test_write_over_a_fifo_is_refused(ws: Workspace, root: Path) -> None:
    os.mkfifo(root / "pipe")
    with pytest.raises(PathRefused, match="FIFO"):
        ws.write("pipe", b"x")
    assert stat.S_ISFIFO((root / "pipe").lstat().st_mode)


def test_read_of_a_directory_is_a_conflict(ws: Workspace) -> None:
    ws.write("d/x", b"")
    with pytest.raises(Conflict, match="directory"):
        ws.read("d")


def test_write_over_a_directory_is_a_conflict(ws: Workspace, root: Path) -> None:
    (root / "d").mkdir()
    with pytest.raises(Conflict, match="directory"):
        ws.write("d", b"x")
    assert (root / "d").is_dir()


def test_write_below_a_file_is_a_conflict(ws: Workspace) -> None:
    ws.write("f", b"")
    with pytest.raises(Conflict, match="not a directory"):
        ws.write("f/x", b"")


# -- size caps -------------------------------------------------------------------------------


def test_read_past_the_cap_is_too_large(ws: Workspace, root: Path) -> None:
    (root / "big").write_bytes(b"x" * 2000)
    with pytest.raises(TooLarge, match="1024 bytes"):
        ws.read("big")


def test_read_with_a_smaller_max_bytes_is_too_large(ws: Workspace) -> None:
    ws.write("a.txt", b"0123456789")
    with pytest.raises(TooLarge, match="cap of 4 bytes"):
        ws.read("a.txt", max_bytes=4)


def test_write_past_the_cap_is_too_large_and_writes_nothing(ws: Workspace, root: Path) -> None:
    with pytest.raises(TooLarge, match="1024 bytes"):
        ws.write("sub/big", b"x" * 1025)
    assert list(root.iterdir()) == []


# -- deleting --------------------------------------------------------------------------------


def test_delete_removes_a_file(ws: Workspace, root: Path) -> None:
    ws.write("a.txt", b"x")
    ws.delete("a.txt")
    assert not (root / "a.txt").exists()


def test_delete_removes_an_empty_directory(ws: Workspace, root: Path) -> None:
    (root / "d").mkdir()
    ws.delete("d")
    assert not (root / "d").exists()


def test_delete_of_a_non_empty_directory_needs_recursive(ws: Workspace, root: Path) -> None:
    ws.write("d/x", b"x")
    with pytest.raises(Conflict, match="not empty"):
        ws.delete("d")
    assert (root / "d" / "x").exists()


def test_recursive_delete_removes_the_tree(ws: Workspace, root: Path) -> None:
    ws.write("d/a/b/c.txt", b"x")
    ws.write("d/top.txt", b"y")
    ws.delete("d", recursive=True)
    assert list(root.iterdir()) == []


def test_recursive_delete_does_not_follow_links_out(
    ws: Workspace, root: Path, outside: Path, secret: Path
) -> None:
    ws.write("d/sub/keep.txt", b"x")
    os.symlink(outside, root / "d" / "to_dir")
    os.symlink(secret, root / "d" / "sub" / "to_file")
    ws.delete("d", recursive=True)
    assert not (root / "d").exists()
    assert (outside / "x").read_bytes() == b"outside x"
    assert secret.read_bytes() == b"host secret"


def test_recursive_delete_handles_deep_nesting(ws: Workspace, root: Path) -> None:
    deep = root / "d" / "/".join(["n"] * 300)
    deep.mkdir(parents=True)
    (deep / "leaf").write_bytes(b"x")
    ws.delete("d", recursive=True)
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("path", [".", "", "/workspace", "/workspace/"])
def test_deleting_the_root_is_refused(ws: Workspace, root: Path, path: str) -> None:
    ws.write("a.txt", b"x")
    with pytest.raises(PathRefused, match="root"):
        ws.delete(path, recursive=True)
    assert (root / "a.txt").exists()


# -- missing ---------------------------------------------------------------------------------


def test_read_of_a_missing_file_is_not_found(ws: Workspace) -> None:
    with pytest.raises(FileNotFoundInWorkspace, match="nope"):
        ws.read("nope.txt")


def test_delete_of_a_missing_file_is_not_found(ws: Workspace) -> None:
    with pytest.raises(FileNotFoundInWorkspace):
        ws.delete("dir/nope.txt")


def test_stat_of_a_missing_file_is_not_found(ws: Workspace) -> None:
    with pytest.raises(FileNotFoundInWorkspace):
        ws.stat("nope.txt")
