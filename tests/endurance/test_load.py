"""Load: many sessions at once over the real REST API, then a count of what is left behind.

A real `corral serve` process runs 32 sessions with real sandboxed kernels. Each session runs
a short mixed sequence: prints to stdout and stderr, a picture, an exception, a sleep, a file
written by the kernel and read back by the kernel and through the files route, a file
uploaded and read by the kernel, a return value. Every result must come back exactly as
expected. The session's marker is kept in the kernel (so a result from another kernel cannot
pass) and a counter there numbers the steps (so order shows); no other session's marker may
appear anywhere in a result.

Afterwards the server's file descriptors and child processes (the sandboxes are its
children) are counted against a baseline taken after a warm-up session, and no kernel run
directory, session directory or session cgroup may remain. Only the server is counted: the
other tests of this worker process keep services of their own.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from corral.kernels.records import TRASH
from corral.sandbox.limits import own_cgroup1
from tests.endurance.served import Served, served

pytestmark = pytest.mark.bwrap

SESSIONS = 32
CREATE_CONCURRENCY = 8  # kernel starts at once: 32 together would only crowd two cores
PAIRED_EVERY = 4  # every 4th session sends its sleep and the step after it at once
REQUEST_TIMEOUT_S = 180.0  # per HTTP call; the machine may be busy with other work
EXEC_TIMEOUT_S = 120.0
KERNEL_START_TIMEOUT_S = 120.0
SETTLE_S = 10.0  # after the last delete, for descriptors and processes to go
FD_TOLERANCE = 5
FONT_LIST_WAIT_S = 120.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# The first step, run as each session is created: it keeps the marker in the kernel, and
# pays for the matplotlib import (about 2 CPU seconds) before the sessions run all at once.
# Only every MATPLOTLIB_EVERY-th session plots with matplotlib: in all 32 the import would
# double the test's time on two cores. The others display a PNG made in the kernel that
# carries the session's marker, so that an image can be traced to the session that made it.
MATPLOTLIB_EVERY = 4
SETUP = 'me, n = {sid!r}, 1\nimport sys, time\n{imports}print(f"{{me}}|{{n}}|ready")\n'
MATPLOTLIB = "import matplotlib.pyplot as plt\n"
PNG_MAKER = """\
import struct, zlib
from IPython.display import Image, display

def png(text):
    def chunk(kind, data):
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return b"\\x89PNG\\r\\n\\x1a\\n" + b"".join([
        chunk(b"IHDR", header),
        chunk(b"tEXt", b"Comment\\x00" + text.encode()),
        chunk(b"IDAT", zlib.compress(b"\\x00\\x80")),
        chunk(b"IEND", b""),
    ])
"""
STEPS = {
    "streams": 'n += 1\nprint(f"{me}|{n}|out")\nprint(f"{me}|{n}|err", file=sys.stderr)\n',
    "plot": (
        "n += 1\n"
        "plt.figure(figsize=(2, 2))\n"
        "plt.plot([1, 2, 3], [n, 2 * n, 3 * n])\n"
        "plt.title(me)\n"
        "plt.show()\n"
        'print(f"{me}|{n}|picture")\n'
    ),
    "image": 'n += 1\ndisplay(Image(data=png(f"{me}|{n}|image")))\nprint(f"{me}|{n}|picture")\n',
    "raise": 'n += 1\nprint(f"{me}|{n}|raise")\nraise ValueError(f"{me}|{n}|boom")\n',
    "sleep": 'n += 1\ntime.sleep(DELAY_S)\nprint(f"{me}|{n}|slept")\n',
    "pair": 'n += 1\nprint(f"{me}|{n}|pair")\n',
    "write": (
        "n += 1\n"
        'with open("notes.txt", "w") as out:\n'
        '    out.write(f"{me}|notes\\n" * 3)\n'
        'print(f"{me}|{n}|wrote")\n'
    ),
    "read": (
        "n += 1\n"
        'print(open("notes.txt").read(), end="")\n'
        'print(open("upload.txt").read(), end="")\n'
        'print(f"{me}|{n}|read")\n'
    ),
    "value": 'n += 1\nf"{me}|{n}|value"\n',
}
STEPS_AFTER_SETUP = 8


@dataclass(frozen=True)
class Plan:
    """What session number `index` runs."""

    sid: str
    index: int

    @property
    def matplotlib(self) -> bool:
        return self.index % MATPLOTLIB_EVERY == 0

    @property
    def paired(self) -> bool:
        return self.index % PAIRED_EVERY == PAIRED_EVERY - 1

    @property
    def picture(self) -> str:
        return "plot" if self.matplotlib else "image"

    def setup(self) -> str:
        return SETUP.format(sid=self.sid, imports=MATPLOTLIB if self.matplotlib else PNG_MAKER)

    def code(self, step: str) -> str:
        delay_s = 0.05 + 0.05 * (self.index % 6)  # 0.05 to 0.3 s
        return STEPS[step].replace("DELAY_S", str(delay_s))


def _notes(sid: str) -> str:
    return f"{sid}|notes\n" * 3


def _upload(sid: str) -> str:
    return f"{sid}|from the host\n"


def _expected(step: str, sid: str, n: int) -> dict[str, Any]:
    """The fields step `step` must return in session `sid` as its `n`-th execution."""
    tag = f"{sid}|{n}|"
    words = {"plot": "picture", "image": "picture", "sleep": "slept", "write": "wrote"}
    stdout = {
        "ready": tag + "ready\n",
        "streams": tag + "out\n",
        "read": _notes(sid) + _upload(sid) + tag + "read\n",
        "value": "",
    }.get(step, tag + words.get(step, step) + "\n")
    return {
        "status": "error" if step == "raise" else "ok",
        "stdout": stdout,
        "stderr": tag + "err\n" if step == "streams" else "",
        "error": {"ename": "ValueError", "evalue": tag + "boom"} if step == "raise" else None,
        "session_id": sid,
        "execution_count": n,
        "output_truncated": False,
    }


def _problems(result: dict[str, Any], step: str, sid: str, n: int, others: list[str]) -> list[str]:
    """How `result` differs from what step `step` must return; empty when it is right."""
    where = f"{sid} step {n} ({step})"
    problems = []
    for key, value in _expected(step, sid, n).items():
        got = result[key]
        if key == "error" and got is not None:
            got = {"ename": got["ename"], "evalue": got["evalue"]}
        if got != value:
            problems.append(f"{where}: {key} is {got!r}, expected {value!r}")
    problems += [f"{where}: {p}" for p in _results_problems(result["results"], step, sid, n)]
    dump = json.dumps(result)
    problems += [f"{where}: {other}'s marker is in it" for other in others if f"{other}|" in dump]
    return problems


def _results_problems(bundles: list[dict[str, Any]], step: str, sid: str, n: int) -> list[str]:
    """The displayed and returned values: one PNG for a picture, the string for 'value'."""
    if step == "value":
        want = [{"text/plain": repr(f"{sid}|{n}|value")}]
        return [] if bundles == want else [f"results are {bundles!r}, expected {want!r}"]
    if step not in ("plot", "image"):
        return [] if bundles == [] else [f"unexpected results {bundles!r}"]
    images = [base64.b64decode(bundle["image/png"]) for bundle in bundles if "image/png" in bundle]
    if len(images) != 1 or not images[0].startswith(PNG_MAGIC):
        return [f"expected one PNG, got {len(images)} images in {len(bundles)} results"]
    if step == "image" and f"{sid}|{n}|image".encode() not in images[0]:
        return ["the PNG does not carry the session's marker"]
    return []


@dataclass
class Tally:
    """What the load sent and what came back wrong."""

    ids: list[str]
    executions: int = 0
    file_calls: int = 0
    problems: list[str] = field(default_factory=list)

    def check(self, result: dict[str, Any], step: str, sid: str, n: int) -> None:
        self.executions += 1
        others = [other for other in self.ids if other != sid]
        self.problems += _problems(result, step, sid, n, others)


@dataclass(frozen=True)
class Census:
    """What the server process holds, counted from outside its own bookkeeping."""

    fds: int
    children: frozenset[int]
    threads: int
    run_entries: frozenset[str]
    session_dirs: frozenset[str]

    @classmethod
    def take(cls, server: Served) -> Census:
        process = psutil.Process(server.pid)
        return cls(
            fds=len(os.listdir(f"/proc/{server.pid}/fd")),
            children=frozenset(p.pid for p in process.children(recursive=True)),
            threads=process.num_threads(),
            run_entries=frozenset(_names(server.run_root)),
            session_dirs=frozenset(_names(server.state_dir / "sessions")),
        )


def _names(folder: Path) -> list[str]:
    return os.listdir(folder) if folder.is_dir() else []


def _session_cgroups(ids: list[str], server_pid: int) -> list[str]:
    """Cgroups still named after one of `ids` (only the cgroup v1 boxes make them here)."""
    left = []
    for controller in ("memory", "pids", "cpu", "freezer"):
        parent = own_cgroup1(Path("/sys/fs/cgroup"), controller) / f"corral-{server_pid}"
        left += [f"{controller}/{name}" for name in _names(parent) if name in ids]
    return left


async def _settled(server: Served, baseline: Census) -> Census:
    """The census once descriptors and children are back near the baseline, or at SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        census = Census.take(server)
        back = census.fds <= baseline.fds + FD_TOLERANCE and census.children <= baseline.children
        if back or time.monotonic() > deadline:
            return census
        await asyncio.sleep(0.2)


def _describe(pids: frozenset[int]) -> str:
    described = []
    for pid in sorted(pids):
        try:
            process = psutil.Process(pid)
            described.append(f"{pid} {process.status()} {process.cmdline()[:4]}")
        except psutil.NoSuchProcess:
            described.append(f"{pid} (gone)")
    return "processes left: " + "; ".join(described)


@pytest.fixture(scope="module")
def load_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`corral serve` of its own, as a process whose descriptors and children are counted,
    with room for every load session at once. No warm pool: its spare kernels come and go
    (tests/kernels/test_pool.py covers it)."""
    with served(
        tmp_path_factory.mktemp("load"),
        max_sessions=str(SESSIONS + 8),
        pool_size="0",
        exec_timeout_s=str(EXEC_TIMEOUT_S),
        kernel_start_timeout_s=str(KERNEL_START_TIMEOUT_S),
    ) as server:
        yield server


def _client(server: Served) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {server.token('agent')}"},
        timeout=REQUEST_TIMEOUT_S,
        limits=httpx.Limits(max_connections=4 * SESSIONS, max_keepalive_connections=SESSIONS),
    )


async def _execute(http: httpx.AsyncClient, sid: str, code: str) -> dict[str, Any]:
    response = await http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert response.status_code == 200, f"{sid}: {response.status_code} {response.text}"
    result: dict[str, Any] = response.json()
    return result


async def _create(http: httpx.AsyncClient, sid: str) -> None:
    response = await http.post("/v1/sessions", json={"id": sid})
    assert response.status_code == 201, f"{sid}: {response.status_code} {response.text}"


async def _delete(http: httpx.AsyncClient, sid: str) -> None:
    response = await http.delete(f"/v1/sessions/{sid}")
    assert response.status_code == 204, f"{sid}: {response.status_code} {response.text}"


async def _open_session(
    http: httpx.AsyncClient, plan: Plan, gate: asyncio.Semaphore, tally: Tally
) -> None:
    async with gate:
        await _create(http, plan.sid)
        tally.check(await _execute(http, plan.sid, plan.setup()), "ready", plan.sid, 1)


async def _run_sequence(http: httpx.AsyncClient, plan: Plan, tally: Tally) -> None:
    """The steps after setup, in order; a paired session sends 'sleep' and 'pair' at once."""
    sid, n = plan.sid, 1
    for step in ("streams", plan.picture, "raise"):
        n += 1
        tally.check(await _execute(http, sid, plan.code(step)), step, sid, n)
    if plan.paired:
        pair = ("sleep", "pair")
        sent = await asyncio.gather(*(_execute(http, sid, plan.code(step)) for step in pair))
        # Sent at once, they may arrive in either order; the kernel numbers them as they run.
        ran = sorted(zip(sent, pair, strict=True), key=lambda done: done[0]["started_at"])
        for offset, (result, step) in enumerate(ran, start=1):
            tally.check(result, step, sid, n + offset)
        n += 2
    else:
        for step in ("sleep", "pair"):
            n += 1
            tally.check(await _execute(http, sid, plan.code(step)), step, sid, n)
    n += 1
    tally.check(await _execute(http, sid, plan.code("write")), "write", sid, n)
    await _exchange_files(http, sid, tally)
    for step in ("read", "value"):
        n += 1
        tally.check(await _execute(http, sid, plan.code(step)), step, sid, n)


async def _exchange_files(http: httpx.AsyncClient, sid: str, tally: Tally) -> None:
    """The kernel's file, read through the files route; a file uploaded for the kernel."""
    url = f"/v1/sessions/{sid}/files/content"
    notes = await http.get(url, params={"path": "notes.txt"})
    upload = await http.put(url, params={"path": "upload.txt"}, content=_upload(sid).encode())
    tally.file_calls += 2
    if notes.status_code != 200 or notes.text != _notes(sid):
        tally.problems.append(f"{sid}: notes.txt read {notes.status_code} {notes.text!r}")
    if upload.status_code != 201:
        tally.problems.append(f"{sid}: upload.txt written {upload.status_code} {upload.text!r}")


async def _warm_up(http: httpx.AsyncClient, server: Served) -> None:
    """One session through every kind of step, so that one-time setup is in the baseline,
    and the server's matplotlib font list in place (its first kernel started the build)."""
    plan = Plan("warm", 1)
    tally = Tally([plan.sid])
    await _open_session(http, plan, asyncio.Semaphore(1), tally)
    await _run_sequence(http, plan, tally)
    await _delete(http, plan.sid)
    assert not tally.problems, "\n".join(tally.problems)
    await _font_list_kept(server)


async def _font_list_kept(server: Served) -> None:
    """Wait for the kept font list: sessions made before it would build their own, which says
    "Matplotlib is building the font cache" on stderr when that takes 5 s on a busy host, and
    the build's sandbox would count as a child in the baseline."""
    deadline = time.monotonic() + FONT_LIST_WAIT_S
    while not list(server.state_dir.glob("mpl-fonts/mpl-*/fontlist-v*.json")):
        assert time.monotonic() < deadline, "the server's matplotlib font list never appeared"
        await asyncio.sleep(0.2)


@pytest.mark.timeout(300)
async def test_concurrent_sessions_get_every_result_in_order_and_leak_nothing(
    load_server: Served,
) -> None:
    async with _client(load_server) as http:
        await _warm_up(http, load_server)
    before = Census.take(load_server)
    plans = [Plan(f"load-{i:02d}", i) for i in range(SESSIONS)]
    ids = [plan.sid for plan in plans]
    tally = Tally(ids)
    started = time.monotonic()
    async with _client(load_server) as http:
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)
        await asyncio.gather(*(_open_session(http, plan, gate, tally) for plan in plans))
        created_s = time.monotonic() - started
        listed = (await http.get("/v1/sessions")).json()["sessions"]
        running = sorted(s["id"] for s in listed if s["kernels"] == ["python"])
        assert running == ids, f"not every session is running at once: {running}"
        peak = len(psutil.Process(load_server.pid).children(recursive=True))
        await asyncio.gather(*(_run_sequence(http, plan, tally) for plan in plans))
        ran_s = time.monotonic() - started - created_s
        await asyncio.gather(*(_delete(http, sid) for sid in ids))
        assert (await http.get("/v1/sessions")).json()["sessions"] == []
    wall_s = time.monotonic() - started
    after = await _settled(load_server, before)
    cgroups = _session_cgroups(ids, load_server.pid)

    print(
        f"\nload: {SESSIONS} sessions, {tally.executions} executions, {tally.file_calls} file "
        f"calls, {len(tally.problems)} problems; wall {wall_s:.1f} s (create and set up "
        f"{created_s:.1f} s, run {ran_s:.1f} s)\n"
        f"load: fds {before.fds} -> {after.fds}; child processes {len(before.children)} -> "
        f"{len(after.children)} (peak {peak}); threads {before.threads} -> {after.threads}; "
        f"run root entries {len(before.run_entries)} -> {len(after.run_entries)}; session "
        f"dirs {len(before.session_dirs)} -> {len(after.session_dirs)}; session cgroups left "
        f"{len(cgroups)}"
    )
    assert not tally.problems, "\n".join(tally.problems[:30])
    assert tally.executions == SESSIONS * (1 + STEPS_AFTER_SETUP)
    assert peak >= len(before.children) + SESSIONS
    assert after.fds <= before.fds + FD_TOLERANCE, f"fds {before.fds} -> {after.fds}"
    assert after.children == before.children, _describe(after.children - before.children)
    assert after.run_entries == before.run_entries
    assert after.session_dirs <= {TRASH}  # every session's folder left its place
    assert _names(load_server.state_dir / "sessions" / TRASH) == []  # and was removed
    assert cgroups == []


# -- order within one session --------------------------------------------------------------

ORDER_SESSIONS = 4
ORDER_CALLS = 8


def _order_code(tag: str, sleep_s: float) -> str:
    return f'n += 1\nimport time\ntime.sleep({sleep_s})\nprint(f"{{me}}|{{n}}|{tag}")\n'


# The first staggered call holds the session until the test has seen every other call
# queued behind it and writes this file (bounded: it gives up after a minute).
HOLD_CODE = (
    "n += 1\nimport os, time\nfor _ in range(6000):\n"
    "    if os.path.exists('go'): break\n    time.sleep(0.01)\n"
    'print(f"{me}|{n}|s0")\n'
)


def _counter(stdout: str) -> int:
    return int(stdout.split("|")[1]) if stdout.count("|") == 2 else -1


async def _submit_staggered(http: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    """ORDER_CALLS executions, each sent once the one before is seen waiting in the session's
    queue (the first holds the session meanwhile), so their arrival order is known."""
    calls = []
    for k in range(ORDER_CALLS):
        code = HOLD_CODE if k == 0 else _order_code(f"s{k}", 0.0)
        calls.append(asyncio.ensure_future(_execute(http, sid, code)))
        await _until_queued(http, sid, k)
    response = await http.put(f"/v1/sessions/{sid}/files/content?path=go", content=b"")
    assert response.status_code in (200, 201), response.text
    return list(await asyncio.gather(*calls))


async def _until_queued(http: httpx.AsyncClient, sid: str, waiting: int) -> None:
    """Until the session is busy with `waiting` calls behind the running one."""
    deadline = time.monotonic() + 30
    while True:
        info = (await http.get(f"/v1/sessions/{sid}")).json()
        if info["state"] == "busy" and info["queued"] == waiting:
            return
        assert time.monotonic() < deadline, f"{sid}: never saw {waiting} queued: {info}"
        await asyncio.sleep(0.01)


async def _submit_burst(http: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    """ORDER_CALLS executions sent all at once (their arrival order is unknown)."""
    codes = [_order_code(f"b{k}", 0.02) for k in range(ORDER_CALLS)]
    return list(await asyncio.gather(*(_execute(http, sid, code) for code in codes)))


def _order_problems(
    sid: str, results: list[dict[str, Any]], tags: list[str], first_n: int
) -> list[str]:
    """Each result is its own call's (its tag) from this session's kernel (its marker), none
    is lost (the counters are consecutive), and the counter follows the start order."""
    problems = []
    for tag, result in zip(tags, results, strict=True):
        stdout = result["stdout"]
        if result["status"] != "ok" or not (
            stdout.startswith(f"{sid}|") and stdout.endswith(f"|{tag}\n")
        ):
            problems.append(f"{sid} {tag}: {result['status']} {stdout!r}")
    counters = sorted(_counter(result["stdout"]) for result in results)
    if counters != list(range(first_n, first_n + len(tags))):
        problems.append(f"{sid}: counters {counters}, expected {first_n} to {counters[-1]}")
    by_start = sorted(results, key=lambda result: result["started_at"])
    in_start_order = [_counter(result["stdout"]) for result in by_start]
    if in_start_order != sorted(in_start_order):
        problems.append(f"{sid}: the counter does not follow the start order: {in_start_order}")
    return problems


@pytest.mark.timeout(180)
async def test_executions_submitted_together_run_in_arrival_order_without_loss(
    load_server: Served,
) -> None:
    ids = [f"order-{i}" for i in range(ORDER_SESSIONS)]
    async with _client(load_server) as http:
        await asyncio.gather(*(_create(http, sid) for sid in ids))
        for sid in ids:
            await _execute(http, sid, f"me, n = {sid!r}, 0\n")
        staggered = await asyncio.gather(*(_submit_staggered(http, sid) for sid in ids))
        burst = await asyncio.gather(*(_submit_burst(http, sid) for sid in ids))
        await asyncio.gather(*(_delete(http, sid) for sid in ids))

    problems = []
    tags = [f"s{k}" for k in range(ORDER_CALLS)]
    for sid, results in zip(ids, staggered, strict=True):
        problems += _order_problems(sid, results, tags, 1)
        counters = [_counter(result["stdout"]) for result in results]
        if counters != list(range(1, ORDER_CALLS + 1)):
            problems.append(f"{sid}: staggered calls ran as {counters}, not as submitted")
        if results[1]["queued_s"] <= 0:
            problems.append(f"{sid}: the second call did not wait ({results[1]['queued_s']} s)")
    tags = [f"b{k}" for k in range(ORDER_CALLS)]
    for sid, results in zip(ids, burst, strict=True):
        problems += _order_problems(sid, results, tags, ORDER_CALLS + 1)
    print(
        f"\norder: {ORDER_SESSIONS} sessions x {2 * ORDER_CALLS} calls, {len(problems)} "
        f"problems; second staggered call queued "
        f"{[round(results[1]['queued_s'], 2) for results in staggered]} s"
    )
    assert not problems, "\n".join(problems)
