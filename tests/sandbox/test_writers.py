"""Naming the processes that wrote, or were busy, between two looks of the disk patrol."""

from __future__ import annotations

import os

from corral.sandbox import writers
from corral.sandbox.writers import KERNEL_WRITE_FLOOR, writers_since

MIB = 1024 * 1024
KERNEL = 100  # a kernel's pid: counted by its threads (101, 102)
SHELL = 200  # a process: counted whole (tid 0)


def test_a_process_that_wrote_is_named_and_one_that_did_not_is_not() -> None:
    before = {(SHELL, 0): 5, (300, 0): 7}
    assert writers_since(before, {(SHELL, 0): 6, (300, 0): 7}) == (SHELL,)


def test_a_new_process_counts_all_it_ever_wrote() -> None:
    assert writers_since({}, {(SHELL, 0): 1}) == (SHELL,)


def test_a_kernel_thread_counts_from_its_second_look() -> None:
    # A thread not seen before (new, or unreadable at the last look) has a total, not a
    # delta: the startup writes of a kernel must not make it a writer.
    before = {(KERNEL, 101): 0}
    now = {(KERNEL, 101): 0, (KERNEL, 102): 50 * MIB}
    assert writers_since(before, now) == ()
    later = {(KERNEL, 101): 0, (KERNEL, 102): 60 * MIB}
    assert writers_since(now, later) == (KERNEL,)


def test_a_kernel_counts_only_past_the_floor() -> None:
    before = {(KERNEL, 101): 0, (KERNEL, 102): 0}
    small = {(KERNEL, 101): KERNEL_WRITE_FLOOR // 2, (KERNEL, 102): KERNEL_WRITE_FLOOR // 4}
    assert writers_since(before, small) == ()
    big = {(KERNEL, 101): KERNEL_WRITE_FLOOR // 2, (KERNEL, 102): KERNEL_WRITE_FLOOR // 2}
    assert writers_since(before, big) == (KERNEL,)


def test_a_process_is_busy_past_a_share_of_the_time_between_two_looks() -> None:
    before = {10: 1.0, 20: 5.0}
    now = {10: 1.3, 20: 5.01, 30: 0.5}  # 30 is new: all it used counts
    assert writers.busy_since(before, now, elapsed_s=1.0) == (10, 30)
    assert writers.busy_since(before, now, elapsed_s=1.5) == (30,)  # 0.3 s of 1.5 s is idle
    assert writers.busy_since({}, {40: 0.01}, elapsed_s=0.01) == ()  # under the floor


def test_cpu_times_are_read_for_live_processes_only() -> None:
    times = writers.cpu_times([os.getpid(), 2**22 + 7])
    assert set(times) == {os.getpid()} and times[os.getpid()] > 0
