from __future__ import annotations

import os

from corral.sandbox.seccomp import DENIED_SYSCALLS, compiled_filter, filter_fd


def test_filter_compiles_to_whole_bpf_instructions() -> None:
    program = compiled_filter()
    assert len(program) > 8 * len(DENIED_SYSCALLS)
    assert len(program) % 8 == 0


def test_filter_fd_holds_the_program_from_its_start() -> None:
    fd = filter_fd()
    try:
        assert os.read(fd, 1 << 20) == compiled_filter()
    finally:
        os.close(fd)


def test_dangerous_calls_are_listed() -> None:
    for name in (
        "ptrace",
        "mount",
        "unshare",
        "setns",
        "bpf",
        "keyctl",
        "io_uring_setup",
        "open_tree",
        "move_mount",
        "fsopen",
        "perf_event_open",
        "userfaultfd",
    ):
        assert name in DENIED_SYSCALLS
