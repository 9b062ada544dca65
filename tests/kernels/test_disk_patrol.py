"""The disk patrol's decisions for an idle session, on a real sandbox with hits made up.

The looks themselves are tested on real directories (tests/sandbox/test_disk_watch.py) and
the whole patrol by the escape battery; here the hits are given, so which looks find a
writer, which the battery cannot choose, is chosen.
"""

from __future__ import annotations

import contextlib
import time

import psutil

from corral.sandbox.disk import Hit
from corral.sandbox.writers import name_of
from corral.service import Service
from tests.waiting import until

BACKGROUND_SLEEP = (
    "import subprocess\n"
    "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
    "print('started')\n"
)


def live_sleep(service: Service, sid: str) -> int | None:
    for pid in service.sessions.session(sid).disk.processes():
        with contextlib.suppress(psutil.Error):
            if name_of(pid) == "sleep" and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return pid
    return None


async def test_a_look_that_names_no_writer_is_not_a_strike_against_the_kernel(
    service: Service,
) -> None:
    # CI (unprivileged, beside a CPU hog): the first look past the limit named nothing (the
    # shell filling it with empty files had too little CPU to be called busy), the next one
    # named the shell; the kernel that had started it was then stopped as well, for a
    # "second" strike, though only one thing had been stopped.
    await service.create_session("idle")
    assert (await service.executions.run(BACKGROUND_SLEEP, session_id="idle")).stdout == "started\n"
    await until(lambda: live_sleep(service, "idle"), "the background sleep to start")
    pid = live_sleep(service, "idle")
    assert pid is not None
    session = service.sessions.session("idle")
    patrol = service.sessions.disk_patrol
    patrol.stop_writers(session, Hit(usage=1, files=1, writers=()))
    assert not session.notes
    patrol.stop_writers(session, Hit(usage=1, files=1, writers=(pid,)))
    await until(lambda: live_sleep(service, "idle") is None, "the sleep to be killed")
    after = await service.executions.run("1 + 1", session_id="idle")
    assert not after.kernel_restarted
    assert after.message is not None
    assert "processes that kept writing were killed: sleep" in after.message
    assert "kernel kept writing" not in after.message


async def test_growth_below_noise_that_no_process_wrote_stops_no_running_code(
    service: Service,
) -> None:
    # CI, beside other tests: a session the host had put past its limit grew by a few KiB
    # while its code slept (the host file's blocks written back: st_blocks grew), and the
    # code that wrote nothing was stopped and reported as past the disk limit.
    await service.create_session("settle")
    execution = service.executions.start(
        "import time; time.sleep(1.5); 'slept'", session_id="settle"
    )
    await until(lambda: execution.running, "the code to be sent")
    session = service.sessions.session("settle")
    hit = Hit(usage=1, files=1, writers=(), grown=(4096, 0), at=time.monotonic())
    service.sessions.disk_patrol.stop_writers(session, hit)
    result = await execution.result()
    assert (result.status, result.limit) == ("ok", None), result.text()
