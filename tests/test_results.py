"""What a result keeps of a long traceback (`bound_traceback`)."""

from __future__ import annotations

from corral.kernels.results import bound_traceback


def test_a_short_traceback_is_kept_whole() -> None:
    blocks = ["Traceback", "frame 1", "ValueError: bad"]
    assert bound_traceback(blocks, max_chars=1000) == blocks


def test_a_long_traceback_keeps_its_root_and_its_end_and_says_what_was_cut() -> None:
    cause = "The above exception was the direct cause of the following exception:"
    blocks = ["ValueError: root"]
    for level in range(200):
        blocks += [cause, f"RuntimeError  level {level}\n" + "x" * 100]
    kept = bound_traceback(blocks, max_chars=4000)
    assert kept[0] == "ValueError: root"
    assert kept[-1].startswith("RuntimeError  level 199")
    assert sum(len(block) + 1 for block in kept) <= 4000 + 200
    (note,) = [block for block in kept if block.startswith("[corral:")]
    assert "more chained exceptions and" in note and "the error raised is last" in note


def test_one_block_past_the_room_keeps_its_end() -> None:
    kept = bound_traceback(["start", "y" * 10_000 + "ValueError: end"], max_chars=1000)
    assert kept[-1].endswith("ValueError: end") and len(kept[-1]) <= 1000
