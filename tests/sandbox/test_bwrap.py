"""build_argv is pure: these tests spawn nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from corral.sandbox.bwrap import HARDENING_FLAGS, build_argv, find_bwrap
from corral.sandbox.policy import SANDBOX_RUN_DIR, Bind, SandboxPolicy, Tmpfs


def _policy(**overrides: object) -> SandboxPolicy:
    base: dict[str, object] = dict(
        system=(Bind(Path("/usr"), "/usr"),),
        symlinks=(),
        tmpfs=(Tmpfs("/tmp", 1024, 0o1777),),
        binds=(Bind(Path("/srv/ws"), "/workspace", writable=True),),
        env=(("PATH", "/usr/bin"),),
    )
    base.update(overrides)
    return SandboxPolicy(**base)  # type: ignore[arg-type]


def test_every_hardening_flag_is_present() -> None:
    argv = build_argv(_policy(), ["true"], seccomp_fd=3)
    joined = " ".join(argv)
    assert " ".join(HARDENING_FLAGS) in joined
    for flag in (
        "--unshare-all",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"


def test_command_comes_last_after_double_dash() -> None:
    argv = build_argv(_policy(), ["python", "-c", "print(1)"], seccomp_fd=3)
    assert argv[-4:] == ["--", "python", "-c", "print(1)"]


def test_system_paths_are_read_only_and_workspace_writable() -> None:
    argv = build_argv(_policy(), ["true"], seccomp_fd=3)
    assert argv[argv.index("/usr") - 1] == "--ro-bind"
    assert argv[argv.index("/workspace") - 2] == "--bind"


def test_tmpfs_has_a_size_and_mode() -> None:
    argv = build_argv(_policy(), ["true"], seccomp_fd=3)
    i = argv.index("--tmpfs")
    assert argv[i - 4 : i + 2] == ["--perms", "1777", "--size", "1024", "--tmpfs", "/tmp"]


def test_environment_is_only_what_the_policy_lists() -> None:
    argv = build_argv(_policy(), ["true"], seccomp_fd=3)
    assert argv.count("--setenv") == 1
    assert argv[argv.index("--setenv") + 1 : argv.index("--setenv") + 3] == ["PATH", "/usr/bin"]


def test_root_and_proc_are_remounted_read_only() -> None:
    argv = build_argv(_policy(), ["true"], seccomp_fd=3)
    remounted = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--remount-ro"]
    assert remounted == ["/proc", "/"]
    assert argv.index("--remount-ro") > argv.index("--proc")


def test_masked_proc_entries_come_before_proc_is_made_read_only() -> None:
    policy = replace(
        _policy(),
        proc_masked_files=("kcore",),
        proc_masked_dirs=("acpi",),
        empty_dir=Path("/srv/empty"),
    )
    argv = build_argv(policy, ["true"], seccomp_fd=3)
    at = argv.index("--remount-ro")
    assert argv[at - 6 : at] == [
        "--ro-bind", "/dev/null", "/proc/kcore", "--ro-bind", "/srv/empty", "/proc/acpi",
    ]  # fmt: skip


def test_seccomp_descriptor_is_required_when_policy_wants_it() -> None:
    with pytest.raises(ValueError, match="seccomp"):
        build_argv(_policy(), ["true"])
    assert "--seccomp" not in build_argv(_policy(seccomp=False), ["true"])
    argv = build_argv(_policy(), ["true"], seccomp_fd=7)
    assert argv[argv.index("--seccomp") + 1] == "7"


def test_same_policy_gives_same_argv() -> None:
    assert build_argv(_policy(), ["x"], seccomp_fd=3) == build_argv(_policy(), ["x"], seccomp_fd=3)


def test_run_dir_is_added_writable_at_its_sandbox_path() -> None:
    policy = _policy().with_run_dir(Path("/tmp/corral-0/abc"))
    argv = build_argv(policy, ["true"], seccomp_fd=3)
    i = argv.index(SANDBOX_RUN_DIR)
    assert argv[i - 2 : i] == ["--bind", "/tmp/corral-0/abc"]


def test_configured_bwrap_must_be_executable(tmp_path: Path) -> None:
    from corral.errors import SandboxUnavailable

    with pytest.raises(SandboxUnavailable, match="not an executable"):
        find_bwrap(str(tmp_path / "missing"))
    assert Path(find_bwrap()).name == "bwrap"
