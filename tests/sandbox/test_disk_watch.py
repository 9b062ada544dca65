"""`DiskWatch` on a real directory (no sandbox): when a look is a hit, and what it says grew."""

from __future__ import annotations

from pathlib import Path

from corral.sandbox.disk import FILES_NOISE, DiskWatch

MIB = 1024 * 1024


def add_empty_files(root: Path, start: int, count: int) -> None:
    for i in range(start, start + count):
        (root / f"f{i}").touch()


def test_a_look_past_the_limit_says_how_much_was_added_since_the_one_before(
    tmp_path: Path,
) -> None:
    watch = DiskWatch(lambda: [tmp_path], lambda: 64 * MIB, lambda: 10)
    assert watch.look() is None  # the baseline
    add_empty_files(tmp_path, 0, 20)
    hit = watch.look()
    assert hit is not None and hit.files == 20 and hit.grown == (0, 20)
    assert not hit.grew_past_noise()  # as few as a kernel may add on its own
    add_empty_files(tmp_path, 20, FILES_NOISE)
    hit = watch.look()
    assert hit is not None and hit.grown == (0, FILES_NOISE)
    assert hit.grew_past_noise()
    assert watch.look() is None  # past the limit, not growing: left alone


def test_bytes_past_the_floor_are_growth_past_noise(tmp_path: Path) -> None:
    watch = DiskWatch(lambda: [tmp_path], lambda: MIB, lambda: 1000)
    assert watch.look() is None
    (tmp_path / "big").write_bytes(b"x" * 2 * MIB)
    hit = watch.look()
    assert hit is not None and hit.grown[0] >= 2 * MIB and hit.grew_past_noise()


def test_after_a_rebase_the_next_look_is_a_baseline(tmp_path: Path) -> None:
    watch = DiskWatch(lambda: [tmp_path], lambda: 64 * MIB, lambda: 10)
    assert watch.look() is None
    watch.rebase()
    add_empty_files(tmp_path, 0, 20)
    assert watch.look() is None
    add_empty_files(tmp_path, 20, 5)
    hit = watch.look()
    assert hit is not None and hit.grown == (0, 5)


def test_a_look_begun_before_the_execution_does_not_stop_it(tmp_path: Path) -> None:
    # CI, root, rlimit mode: a host write put the session past its limit; the look that
    # judged it had begun when the next execution started, and stopped that execution,
    # which had written nothing.
    watch = DiskWatch(lambda: [tmp_path], lambda: MIB, lambda: 1000)
    assert watch.look() is None
    (tmp_path / "upload").write_bytes(b"x" * 2 * MIB)
    hit = watch.look()
    assert hit is not None
    watch.begin()
    assert not watch.stop_running_code(hit)
    assert watch.stopped() is None
    (tmp_path / "more").write_bytes(b"x" * MIB)
    later = watch.look()
    assert later is not None
    assert watch.stop_running_code(later)
    assert watch.stopped() == "disk"
