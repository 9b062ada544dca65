"""What a cell prints, shows and returns reaches the host whole and in order.

The python kernel sends the main thread's messages itself and everything else through
ipykernel's IOPub thread (`python_kernel.py`); these tests hold it to ipykernel's order:
nothing the cell made is overtaken by the end of its call, and no message is broken by two
threads sending on one socket.
"""

from __future__ import annotations

from typing import Any

from corral.service import Service

SESSION = "order"


async def _run_seen(service: Service, code: str) -> tuple[Any, list[tuple[str, Any]]]:
    """Run `code` in the shared order session; its result and each output message in turn."""
    if not service.sessions.exists(SESSION):
        await service.create_session(SESSION)
    seen: list[tuple[str, Any]] = []

    async def note(kind: str, content: Any) -> None:
        seen.append((kind, content))

    session = service.sessions.session_for(SESSION)
    result = await service.sessions.calls.execute(session, code, on_output=note)
    return result, seen


def _shape(seen: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """Each message as (kind, its text): stream text, or the bundle's text/plain."""
    shaped = []
    for kind, content in seen:
        if kind == "stream":
            shaped.append((kind, str(content["text"])))
        else:
            shaped.append((kind, str(content.get("data", {}).get("text/plain", ""))))
    return shaped


async def test_prints_displays_and_the_value_arrive_in_the_order_made(sandbox: Service) -> None:
    code = "print('one')\ndisplay('two')\nprint('three')\n'four'\n"
    result, seen = await _run_seen(sandbox, code)
    assert result.status == "ok", result.text()
    assert _shape(seen) == [
        ("stream", "one\n"),
        ("display_data", "'two'"),
        ("stream", "three\n"),
        ("execute_result", "'four'"),
    ]


async def test_a_threads_output_and_the_cells_all_arrive_before_the_call_ends(
    sandbox: Service,
) -> None:
    code = (
        "import sys, threading\n"
        "def chatter():\n"
        "    for i in range(300):\n"
        "        sys.stdout.write(f't{i}\\n')\n"
        "worker = threading.Thread(target=chatter)\n"
        "worker.start()\n"
        "for i in range(300):\n"
        "    sys.stdout.write(f'm{i}\\n')\n"
        "worker.join()\n"
        "print('end')\n"
    )
    result, _ = await _run_seen(sandbox, code)
    assert result.status == "ok", result.text()
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("m")] == [f"m{i}" for i in range(300)]
    assert [line for line in lines if line.startswith("t")] == [f"t{i}" for i in range(300)]
    assert lines[-1] == "end"


async def test_text_left_to_the_timed_flush_is_never_overtaken_by_the_calls_end(
    sandbox: Service,
) -> None:
    """Unflushed text goes out on ipykernel's 0.2 s timer; cells that end around that moment
    (whichever of the timer and the cell's own end comes first) each keep their text."""
    for step in range(12):
        pause = 0.17 + step * 0.006
        code = f"import time\nprint('tick {step}', end='')\ntime.sleep({pause})\n{step}\n"
        result, _ = await _run_seen(sandbox, code)
        assert result.status == "ok", result.text()
        assert result.stdout == f"tick {step}"
        assert result.results == [{"text/plain": str(step)}]


async def test_a_thread_printing_through_many_calls_breaks_none_of_them(
    sandbox: Service,
) -> None:
    start = (
        "import sys, threading, time\n"
        "stop_chatter = threading.Event()\n"
        "def chatter():\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not stop_chatter.is_set() and time.monotonic() < deadline:\n"
        "        sys.stdout.write('background\\n')\n"
        "        time.sleep(0.0005)\n"
        "threading.Thread(target=chatter, daemon=True).start()\n"
    )
    result, _ = await _run_seen(sandbox, start)
    assert result.status == "ok", result.text()
    try:
        for step in range(40):
            code = f"import sys\nsys.stdout.write('cell {step}\\n')\n{step}\n"
            result, seen = await _run_seen(sandbox, code)
            assert result.status == "ok", result.text()
            assert f"cell {step}\n" in result.stdout
            assert result.results == [{"text/plain": str(step)}]
            kinds = [
                kind for kind, content in seen if kind != "stream" or "cell" in content["text"]
            ]
            assert kinds == ["stream", "execute_result"]
    finally:
        await _run_seen(sandbox, "stop_chatter.set()\n")


async def test_output_of_forked_children_reaches_the_cell(sandbox: Service) -> None:
    code = (
        "import multiprocessing, os, sys\n"
        "def shout(n):\n"
        "    sys.stdout.write(f'child {n}\\n')\n"
        "    sys.stdout.flush()\n"
        "    return n * n\n"
        "with multiprocessing.get_context('fork').Pool(2) as pool:\n"
        "    squares = pool.map(shout, range(6))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('forked', flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "squares\n"
    )
    result, _ = await _run_seen(sandbox, code)
    assert result.status == "ok", result.text()
    assert result.results == [{"text/plain": "[0, 1, 4, 9, 16, 25]"}]
    for n in range(6):
        assert f"child {n}\n" in result.stdout
    assert "forked\n" in result.stdout
