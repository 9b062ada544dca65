"""What a read-write project may pass to the host: the trusted-path verdicts and the sync.

`verdict` is checked as a table. `OverlaySync` is checked on plain folders standing in for an
overlay's upper layer (files, folders, links; whiteouts and opaque folders need a real
overlay and are checked through real sessions in tests/kernels/test_project_mounts.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.errors import InvalidInput
from corral.protect import (
    OverlaySync,
    escape_name,
    remove_layers,
    validate_protected_names,
    verdict,
)
from corral.protect.sync import MAX_DEPTH


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return tmp_path.resolve()


@pytest.fixture
def host(base: Path) -> Path:
    path = base / "proj"
    (path / "src").mkdir(parents=True)
    (path / "src" / "main.py").write_text("print('hi')\n")
    (path / ".git" / "objects" / "ab").mkdir(parents=True)
    (path / ".git" / "objects" / "ab" / "cdef").write_bytes(b"host object")
    (path / ".git" / "config").write_text("[core]\n")
    return path


@pytest.fixture
def upper(base: Path) -> Path:
    path = base / "upper"
    path.mkdir()
    return path


class Sync:
    """An `OverlaySync` whose reports are kept in `reports`."""

    def __init__(self, host: Path, upper: Path, extra: tuple[str, ...] = ()) -> None:
        self.reports: list[list[str]] = []
        self.sync = OverlaySync(host, upper, extra, self.reports.append)

    def __call__(self) -> list[list[str]]:
        self.sync.sync()
        return self.reports


def write(root: Path, rel: str, text: str = "x", mode: int = 0o644) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


# -- verdict -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "kind", "expected"),
    [
        ("src/main.py", "file", "apply"),
        ("out/deep", "dir", "apply"),
        ("link", "link", "apply"),
        ("gone.txt", "gone", "apply"),
        (".git", "dir", "apply"),
        (".git", "file", "drop"),  # a .git file points at another git directory
        (".git", "link", "drop"),
        (".git", "gone", "drop"),
        (".git/objects/ab/cdef", "file", "apply"),
        (".git/refs/heads/main", "file", "apply"),
        (".git/logs/HEAD", "file", "apply"),
        (".git/index", "file", "apply"),
        (".git/HEAD", "file", "apply"),
        (".git/COMMIT_EDITMSG", "file", "apply"),
        (".git/packed-refs", "file", "apply"),
        (".git/index.lock", "file", "ignore"),
        (".git/refs/heads/main.lock", "file", "ignore"),
        (".git/refs/heads/main", "link", "drop"),
        (".git/HEAD", "dir", "drop"),
        (".git/config", "file", "drop"),
        (".git/config.worktree", "link", "drop"),
        (".git/commondir", "file", "drop"),
        (".git/hooks/pre-commit", "file", "drop"),
        (".git/info/attributes", "file", "drop"),
        (".git/modules/lib/config", "file", "drop"),
        (".git/worktrees/w/commondir", "file", "drop"),
        (".git/objects/.git/config", "file", "drop"),
        ("sub/.git", "dir", "apply"),
        ("sub/.git/config", "file", "drop"),
        ("sub/.git/hooks/pre-commit", "file", "drop"),
        ("sub/deep/.git/HEAD", "file", "apply"),
        (".claude/settings.local.json", "file", "drop"),
        ("tools/.claude/agents/a.md", "file", "drop"),
        (".vscode/tasks.json", "file", "drop"),
        (".vscode", "dir", "drop"),
        (".idea/workspace.xml", "file", "drop"),
        (".cursor/mcp.json", "file", "drop"),
        (".gemini/settings.json", "file", "drop"),
        (".devcontainer/devcontainer.json", "file", "drop"),
        (".husky/pre-commit", "file", "drop"),
        (".mcp.json", "file", "drop"),
        ("sub/.envrc", "file", "drop"),
        (".bashrc", "file", "drop"),
        (".gitmodules", "file", "drop"),
        (".pre-commit-config.yaml", "file", "drop"),
        ("docs/vscode.md", "file", "apply"),
        ("notes.envrc.txt", "file", "apply"),
    ],
)
def test_verdict(rel: str, kind: str, expected: str) -> None:
    assert verdict(rel, kind) == expected


def test_the_operators_names_and_what_they_hold_are_dropped() -> None:
    extra = ("notes/trusted.txt", "tools")
    assert verdict("notes/trusted.txt", "file", extra) == "drop"
    assert verdict("tools/run.sh", "file", extra) == "drop"
    assert verdict("notes/other.txt", "file", extra) == "apply"
    assert verdict("toolsmith/x", "file", extra) == "apply"


@pytest.mark.parametrize("name", ["", "/etc/x", "a/../b", "a//b", "./a", "a/", "a\0b", ".git/x"])
def test_a_bad_extra_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match="protected name"):
        validate_protected_names([name])


# -- the sync on plain folders -------------------------------------------------------------------


def test_new_and_changed_files_and_folders_reach_the_host(host: Path, upper: Path) -> None:
    sync = Sync(host, upper)
    write(upper, "src/main.py", "changed\n")
    write(upper, "out/deep/result.txt", "made\n", 0o640)
    assert sync() == []
    assert (host / "src" / "main.py").read_text() == "changed\n"
    assert (host / "out" / "deep" / "result.txt").read_text() == "made\n"
    assert stat.S_IMODE((host / "out" / "deep" / "result.txt").stat().st_mode) == 0o640
    write(upper, "src/main.py", "changed again\n")
    sync()
    assert (host / "src" / "main.py").read_text() == "changed again\n"
    assert not [p for p in host.rglob(".corral-sync-*")]  # no draft left


def test_set_id_bits_never_reach_the_host(host: Path, upper: Path) -> None:
    path = write(upper, "tool", "#!/bin/sh\n", 0o755)
    os.chmod(path, 0o6755)  # noqa: S103 - the bits under test
    Sync(host, upper)()
    assert stat.S_IMODE((host / "tool").stat().st_mode) == 0o755


def test_a_link_is_made_as_a_link_and_never_followed(host: Path, upper: Path, base: Path) -> None:
    outside = write(base, "outside/secret.txt", "secret\n")
    (upper / "out").symlink_to(outside.parent)
    Sync(host, upper)()
    assert os.readlink(host / "out") == str(outside.parent)
    assert outside.read_text() == "secret\n"


def test_a_host_link_in_the_way_is_replaced_not_followed(
    host: Path, upper: Path, base: Path
) -> None:
    outside = base / "outside"
    outside.mkdir()
    (host / "out").symlink_to(outside)
    write(upper, "out/result.txt", "made\n")
    Sync(host, upper)()
    assert list(outside.iterdir()) == []  # nothing written through the host's link
    assert not (host / "out").is_symlink()  # the sandbox replaced the link with a folder
    assert (host / "out" / "result.txt").read_text() == "made\n"


def test_trusted_paths_are_reported_once_and_never_applied(host: Path, upper: Path) -> None:
    sync = Sync(host, upper, ("notes/trusted.txt",))
    write(upper, ".git/config", "[core]\n\tfsmonitor = touch /tmp/x\n")
    write(upper, ".git/commondir", "../elsewhere\n")
    write(upper, ".git/hooks/pre-commit", "#!/bin/sh\n", 0o755)
    write(upper, ".git/hooks/post-commit", "#!/bin/sh\n", 0o755)
    write(upper, ".vscode/tasks.json", "{}")
    write(upper, "notes/trusted.txt", "changed")
    write(upper, ".git/refs/heads/topic", "0" * 40 + "\n")
    reports = sync()
    assert reports == [
        [
            ".git/commondir",
            ".git/config",
            ".git/hooks",  # the folder, once, for all the hooks in it
            ".vscode",
            "notes/trusted.txt",
        ]
    ]
    assert (host / ".git" / "config").read_text() == "[core]\n"
    assert not (host / ".git" / "commondir").exists()
    assert not (host / ".git" / "hooks").exists()
    assert not (host / ".vscode").exists()
    assert not (host / "notes" / "trusted.txt").exists()
    assert (host / ".git" / "refs" / "heads" / "topic").read_text() == "0" * 40 + "\n"
    write(upper, ".git/config", "[core]\n\tfsmonitor = again\n")
    assert sync() == reports  # changed again: kept again, reported once


def test_an_object_the_host_has_is_never_replaced(host: Path, upper: Path) -> None:
    write(upper, ".git/objects/ab/cdef", "rewritten")
    write(upper, ".git/objects/ab/0123", "new object")
    Sync(host, upper)()
    assert (host / ".git" / "objects" / "ab" / "cdef").read_bytes() == b"host object"
    assert (host / ".git" / "objects" / "ab" / "0123").read_text() == "new object"


def test_a_git_file_on_the_host_is_never_replaced_by_a_folder(
    host: Path, upper: Path, base: Path
) -> None:
    worktree = base / "worktree"
    worktree.mkdir()
    (worktree / ".git").write_text("gitdir: /elsewhere\n")
    write(upper, ".git/HEAD", "ref: refs/heads/x\n")
    assert Sync(worktree, upper)() == [[".git"]]
    assert (worktree / ".git").read_text() == "gitdir: /elsewhere\n"


def test_folders_deeper_than_the_bound_are_left_out(host: Path, upper: Path) -> None:
    deep = "/".join(["d"] * (MAX_DEPTH + 2))
    write(upper, f"{deep}/x.txt")
    Sync(host, upper)()
    assert (host / "/".join(["d"] * (MAX_DEPTH - 1))).is_dir()
    assert not (host / deep / "x.txt").exists()


def test_a_missing_upper_layer_is_nothing_to_apply(host: Path, base: Path) -> None:
    assert Sync(host, base / "missing")() == []


# -- escape_name -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("plain/name.txt", "plain/name.txt"),
        ("a\nb", "a\\x0ab"),
        ("tab\there", "tab\\x09here"),
        ("del\x7f", "del\\x7f"),
        ("back\\slash", "back\\\\slash"),
        (b"\xff", "\\xff"),
        ("\udcff", "\\xff"),
        ("\ud800", "\\ud800"),
        ("café", "café"),
        ("日本語", "日本語"),
        ("\u202eexe.txt", "\\u202eexe.txt"),
        ("\x85", "\\u0085"),
        ("\u00a0", "\\u00a0"),
        ("\U0001f600", "\\U0001f600"),
    ],
)
def test_escape_name(name: str | bytes, shown: str) -> None:
    assert escape_name(name) == shown


def test_escaping_is_one_to_one_for_lookalikes() -> None:
    assert escape_name("\n") != escape_name("\\x0a")
    assert escape_name(b"\x85") != escape_name("\x85")


def test_layers_are_removed_even_where_nobody_may_read(base: Path) -> None:
    layers = base / "layers"
    (layers / "work" / "work").mkdir(parents=True)
    (layers / "upper" / "locked").mkdir(parents=True)
    write(layers, "upper/locked/file.txt")
    outside = base / "outside"
    outside.mkdir(mode=0o755)
    (layers / "upper" / "link").symlink_to(outside)
    (layers / "work" / "work").chmod(0)
    (layers / "upper" / "locked").chmod(0)
    remove_layers(layers)
    assert not layers.exists()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755  # a link is never followed
