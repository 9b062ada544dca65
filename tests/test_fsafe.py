"""corral.fsafe against the real filesystem: no link is followed, no special file is read."""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import InvalidInput
from corral.fsafe import (
    READ_FLAGS,
    BadComponent,
    LinkRefused,
    NotPrivate,
    NotRegular,
    closing,
    lstat_kind,
    open_file_at,
    open_file_beneath,
    parts_of,
    private_dir,
    remove_tree,
    walk,
)

OPEN_DEADLINE_S = 10.0


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/a/b/file.txt beside an outside/secret.txt a link could point at."""
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "file.txt").write_text("inside")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    return root


def read_beneath(root: Path | int, parts: tuple[str, ...]) -> bytes:
    with closing(open_file_beneath(root, parts)) as fd:
        return os.read(fd, 100)


@pytest.fixture
def unix_socket(tree: Path) -> Iterator[Path]:
    path = tree / "a" / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        yield path
    finally:
        server.close()


def test_a_regular_file_beneath_a_directory_is_read(tree: Path) -> None:
    assert read_beneath(tree, ("a", "b", "file.txt")) == b"inside"


def test_a_link_as_the_last_component_is_refused(tree: Path) -> None:
    os.symlink(tree.parent / "outside" / "secret.txt", tree / "a" / "b" / "link.txt")
    with pytest.raises(LinkRefused) as caught:
        read_beneath(tree, ("a", "b", "link.txt"))
    assert caught.value.parts == ("a", "b", "link.txt")


def test_a_link_as_a_middle_component_is_refused(tree: Path) -> None:
    os.symlink(tree.parent / "outside", tree / "a" / "hop")
    with pytest.raises(LinkRefused) as caught:
        read_beneath(tree, ("a", "hop", "secret.txt"))
    assert caught.value.parts == ("a", "hop")


def test_a_link_to_a_directory_is_never_walked_into(tree: Path) -> None:
    os.symlink(tree.parent / "outside", tree / "hop")
    with pytest.raises(LinkRefused), walk(tree, ("hop",)):
        pass


@pytest.mark.parametrize("bad", ["..", "", ".", "a/b", "nul\0byte"])
def test_a_component_that_is_not_one_plain_name_is_refused(tree: Path, bad: str) -> None:
    with pytest.raises(BadComponent):
        read_beneath(tree, ("a", bad, "file.txt"))


def test_parent_components_are_refused_in_a_path(tree: Path) -> None:
    with pytest.raises(BadComponent):
        parts_of("a/../../outside/secret.txt")


def test_an_absolute_path_is_refused(tree: Path) -> None:
    with pytest.raises(BadComponent):
        parts_of(str(tree.parent / "outside" / "secret.txt"))


def test_refusals_are_corral_input_errors(tree: Path) -> None:
    os.symlink("b", tree / "a" / "link")
    with pytest.raises(InvalidInput):
        read_beneath(tree, ("a", "link", "file.txt"))


def test_a_fifo_is_refused_where_a_file_is_wanted_without_blocking(tree: Path) -> None:
    os.mkfifo(tree / "a" / "fifo")
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            read_beneath(tree, ("a", "fifo"))
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(OPEN_DEADLINE_S)
    assert not worker.is_alive(), "opening a FIFO blocked"
    assert len(outcome) == 1 and isinstance(outcome[0], NotRegular)


def test_the_read_flags_open_a_fifo_without_blocking(tree: Path) -> None:
    """The check on the open descriptor is the last word; opening must not wait for a writer."""
    fifo = tree / "a" / "fifo"
    os.mkfifo(fifo)
    opened: list[int] = []
    worker = threading.Thread(target=lambda: opened.append(os.open(fifo, READ_FLAGS)))
    worker.start()
    worker.join(OPEN_DEADLINE_S)
    assert not worker.is_alive(), "opening a FIFO blocked"
    os.close(opened[0])


def test_a_socket_is_refused_where_a_file_is_wanted(tree: Path, unix_socket: Path) -> None:
    with pytest.raises(NotRegular) as caught:
        read_beneath(tree, ("a", unix_socket.name))
    assert stat.S_ISSOCK(caught.value.mode)


def test_a_device_is_refused_where_a_file_is_wanted() -> None:
    with pytest.raises(NotRegular) as caught:
        read_beneath(Path("/dev"), ("null",))
    assert stat.S_ISCHR(caught.value.mode)


def test_a_directory_is_refused_where_a_file_is_wanted(tree: Path) -> None:
    with pytest.raises(NotRegular) as caught:
        read_beneath(tree, ("a", "b"))
    assert caught.value.is_dir


def test_a_file_where_a_directory_is_wanted_is_not_a_directory(tree: Path) -> None:
    with pytest.raises(NotADirectoryError):
        read_beneath(tree, ("a", "b", "file.txt", "more"))


def test_a_directory_swapped_for_a_link_between_calls_is_not_followed(tree: Path) -> None:
    with closing(os.open(tree, os.O_RDONLY | os.O_DIRECTORY)) as root_fd:
        assert read_beneath(root_fd, ("a", "b", "file.txt")) == b"inside"
        os.rename(tree / "a", tree / "a-moved")
        os.symlink(tree.parent / "outside", tree / "a")
        with pytest.raises(LinkRefused):
            read_beneath(root_fd, ("a", "secret.txt"))


def test_a_file_swapped_for_a_link_in_an_open_directory_is_not_followed(tree: Path) -> None:
    with walk(tree, ("a", "b")) as parent:
        os.unlink(tree / "a" / "b" / "file.txt")
        os.symlink(tree.parent / "outside" / "secret.txt", tree / "a" / "b" / "file.txt")
        with pytest.raises(LinkRefused):
            open_file_at(parent, "file.txt")


def test_walk_makes_missing_directories_with_the_exact_mode(tree: Path) -> None:
    old = os.umask(0o077)
    try:
        with walk(tree, ("new", "deeper"), create_mode=0o755):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((tree / "new" / "deeper").stat().st_mode) == 0o755


def test_removing_a_tree_unlinks_links_and_never_enters_them(tree: Path) -> None:
    os.symlink(tree.parent / "outside", tree / "a" / "b" / "hop")
    (tree / "a" / "b" / "c" / "d").mkdir(parents=True)
    with closing(os.open(tree, os.O_RDONLY | os.O_DIRECTORY)) as root_fd:
        remove_tree(root_fd, "a")
    assert not (tree / "a").exists()
    assert (tree.parent / "outside" / "secret.txt").read_text() == "secret"


def test_lstat_kind_describes_a_link_itself(tree: Path) -> None:
    os.symlink("a", tree / "link")
    assert lstat_kind(tree / "link") == "link"
    assert lstat_kind(tree / "a") == "dir"
    assert lstat_kind(tree / "missing") is None


def test_a_private_directory_is_created_owner_only(tmp_path: Path) -> None:
    private_dir(tmp_path / "one" / "two")
    assert stat.S_IMODE((tmp_path / "one" / "two").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "one").stat().st_mode) == 0o700


def test_a_private_directory_loses_group_and_other_read_bits(tmp_path: Path) -> None:
    path = tmp_path / "readable"
    path.mkdir()
    path.chmod(0o755)
    private_dir(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777], ids=["group", "other", "world"])
def test_a_writable_by_others_directory_is_not_private(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "shared"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(NotPrivate, match="writable by its group or others"):
        private_dir(path)
    assert stat.S_IMODE(path.stat().st_mode) == mode  # refused, not silently repaired


def test_a_directory_owned_by_another_uid_is_not_private(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another uid needs root")
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(NotPrivate, match="owned by uid 65534"):
        private_dir(path)


def test_a_link_is_not_a_private_directory(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    os.symlink(target, tmp_path / "link")
    with pytest.raises(NotPrivate, match="symbolic link"):
        private_dir(tmp_path / "link")


def test_a_file_is_not_a_private_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NotPrivate, match="not a directory"):
        private_dir(tmp_path / "file")
