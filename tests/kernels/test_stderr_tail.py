"""The kernel's stderr pipe: drained as it is written, only its tail kept."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from corral.kernels.stderr_tail import StderrTail


async def wait_exit(process: subprocess.Popen[bytes]) -> int:
    while (code := process.poll()) is None:
        await asyncio.sleep(0.01)
    return code


async def test_a_writer_past_the_pipe_size_is_never_blocked_and_only_the_tail_is_kept() -> None:
    tail = StderrTail(keep_bytes=1000)
    writer = "import sys\nfor i in range(300):\n    sys.stderr.write(f'{i:08d}' * 128)\n"
    process = subprocess.Popen([sys.executable, "-c", writer], stderr=tail.write_fd)
    tail.spawned()
    assert await asyncio.wait_for(wait_exit(process), 60) == 0  # 300 KiB through a 64 KiB pipe
    text = tail.text(max_bytes=1000)
    assert len(text) == 1000 and text.endswith("00000299")
    tail.close()
    assert tail.text().endswith("00000299")  # the tail outlives the pipe


async def test_what_is_still_in_the_pipe_is_read_when_asked() -> None:
    tail = StderrTail()
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stderr.write('bwrap: no permission')"],
        stderr=tail.write_fd,
    )
    tail.spawned()
    process.wait(30)  # blocking: the loop has not drained anything yet
    assert tail.text() == "bwrap: no permission"
    tail.close()
