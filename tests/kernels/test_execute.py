"""Execution against real sandboxed kernels: results, errors, caps, timeouts and faults."""

from __future__ import annotations

import ast
import asyncio
import base64
import os
import signal

import psutil
import pytest

from corral.kernels.results import MAX_TRACEBACK_CHARS
from corral.sandbox import scripts
from corral.service import Service

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


async def test_expression_value_comes_back_as_text_plain(sandbox: Service) -> None:
    result = await sandbox.executions.run("1 + 1", session_id="probe")
    assert result.status == "ok"
    assert result.results == [{"text/plain": "2"}]
    assert result.execution_count is not None
    assert result.duration_s > 0


async def test_stdout_and_stderr_are_separate_and_in_order(sandbox: Service) -> None:
    code = "import sys\nprint('a')\nprint('x', file=sys.stderr)\nprint('b')\n"
    result = await sandbox.executions.run(code, session_id="probe")
    assert result.stdout == "a\nb\n"
    assert result.stderr == "x\n"


async def test_matplotlib_figure_comes_back_as_png(sandbox: Service) -> None:
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\n"
    result = await sandbox.executions.run(code, session_id="probe")
    assert result.status == "ok", result.text()
    pngs = [bundle["image/png"] for bundle in result.results if "image/png" in bundle]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0]).startswith(PNG_MAGIC)


async def test_exception_is_a_structured_error_without_ansi(sandbox: Service) -> None:
    result = await sandbox.executions.run(
        "def f():\n    raise ValueError('bad')\nf()", session_id="probe"
    )
    assert result.status == "error"
    assert result.error is not None
    assert (result.error.ename, result.error.evalue) == ("ValueError", "bad")
    joined = "\n".join(result.error.traceback)
    assert "\x1b[" not in joined
    assert "ValueError" in joined


DEEP_CHAIN = """
def chain(n):
    try:
        if n == 0:
            raise ValueError('the root cause')
        chain(n - 1)
    except Exception as exc:
        raise RuntimeError(f'level {n}') from exc
chain(500)
"""


async def test_a_500_deep_exception_chain_reports_the_error_raised(sandbox: Service) -> None:
    result = await sandbox.executions.run(DEEP_CHAIN, session_id="probe")
    assert result.status == "error", result.text()
    assert result.error is not None
    assert (result.error.ename, result.error.evalue) == ("RuntimeError", "level 500")
    joined = "\n".join(result.error.traceback)
    assert "level 500" in joined
    assert "RecursionError" not in joined
    # The root cause and the innermost frames that fit are there, and the cut is said.
    assert "ValueError: the root cause" in joined
    assert "chain(n - 1)" in joined
    assert "more chained exceptions and" in joined
    assert len(joined) <= MAX_TRACEBACK_CHARS + 200


async def test_state_persists_between_calls(sandbox: Service) -> None:
    await sandbox.executions.run("kept = 41", session_id="probe")
    result = await sandbox.executions.run("kept + 1", session_id="probe")
    assert result.results == [{"text/plain": "42"}]


async def test_code_imports_jupyter_client_whole_though_the_kernel_deferred_it(
    sandbox: Service,
) -> None:
    """The kernel starts without running jupyter_client's package `__init__`
    (`python_kernel.py`); code that uses the package gets all of it."""
    code = (
        "import jupyter_client\n"
        "from jupyter_client import BlockingKernelClient, write_connection_file\n"
        "(jupyter_client.__version__ > '', callable(write_connection_file),\n"
        " BlockingKernelClient.__name__, callable(jupyter_client.find_connection_file))"
    )
    result = await sandbox.executions.run(code, session_id="probe")
    assert result.status == "ok", result.text()
    assert result.results == [{"text/plain": "(True, True, 'BlockingKernelClient', True)"}]


async def test_a_fresh_kernel_has_not_loaded_jupyter_clients_client_side(
    sandbox: Service,
) -> None:
    """Nothing at start runs jupyter_client's package `__init__`: its managers, clients and
    kernel specs (with importlib.metadata) are about 1.8 MiB of every idle kernel."""
    await sandbox.create_session("fresh-imports")
    code = (
        "import sys\n"
        "sorted(m for m in ('jupyter_client.manager', 'jupyter_client.blocking',\n"
        "    'jupyter_client.kernelspec', 'importlib.metadata') if m in sys.modules)"
    )
    result = await sandbox.executions.run(code, session_id="fresh-imports")
    assert result.results == [{"text/plain": "[]"}], result.text()


PDB_IS_IPYTHONS = (
    "import IPython.core.debugger as debugger\n"
    "(pdb.Pdb is debugger.Pdb is debugger.InterruptiblePdb, pdb.set_trace is debugger.set_trace)"
)


@pytest.mark.parametrize(
    ("session_id", "first"),
    [("pdb-first", "import pdb"), ("debugger-first", "from IPython.core import debugger")],
)
async def test_pdb_is_ipythons_interruptible_debugger_once_imported(
    sandbox: Service, session_id: str, first: str
) -> None:
    """ipykernel's change to pdb is made when pdb is first imported, not at start, in
    whichever order pdb and IPython's debugger load."""
    await sandbox.create_session(session_id)
    before = await sandbox.executions.run(
        "import sys\n'pdb' in sys.modules, 'IPython.core.debugger' in sys.modules",
        session_id=session_id,
    )
    assert before.results == [{"text/plain": "(False, False)"}], before.text()
    result = await sandbox.executions.run(
        f"{first}\nimport pdb\n{PDB_IS_IPYTHONS}", session_id=session_id
    )
    assert result.results == [{"text/plain": "(True, True)"}], result.text()


async def test_bash_kernel_shares_the_workspace(sandbox: Service) -> None:
    await sandbox.executions.run(
        "open('/workspace/from_py.txt', 'w').write('hi')", session_id="probe"
    )
    result = await sandbox.executions.run(
        "cat /workspace/from_py.txt; echo; pwd", session_id="probe", language="bash"
    )
    assert result.status == "ok", result.text()
    assert result.stdout.split() == ["hi", "/workspace"]


async def test_coderunners_upload_folder_is_the_workspace(sandbox: Service) -> None:
    # coderunner's prompts and test scripts name /app/uploads; here it is the workspace.
    await sandbox.executions.run("open('/app/uploads/from-python.txt', 'w').write('p')")
    shell = await sandbox.executions.run(
        "cat /workspace/from-python.txt; echo; echo x > /app/uploads/from-bash.txt\n"
        "readlink /app/uploads",
        language="bash",
    )
    assert shell.stdout.split() == ["p", "/workspace"], shell.text()
    back = await sandbox.executions.run("open('/workspace/from-bash.txt').read()")
    assert back.results == [{"text/plain": "'x\\n'"}]


async def test_a_pipe_whose_reader_left_ends_its_writer_by_sigpipe(sandbox: Service) -> None:
    """Pipes in the bash kernel behave as in a terminal: `yes` ends by SIGPIPE (141), without
    an error (a shell started with SIGPIPE ignored could never take it back)."""
    result = await sandbox.executions.run(
        "yes | head -n 1; echo ${PIPESTATUS[0]}", session_id="probe", language="bash"
    )
    assert result.status == "ok" and result.stdout == "y\n141\n", result.text()
    assert "Broken pipe" not in result.text()


async def test_bash_failure_is_an_error_result(sandbox: Service) -> None:
    result = await sandbox.executions.run("ls /does-not-exist", session_id="probe", language="bash")
    assert result.status == "error"
    assert "No such file" in result.stdout + result.stderr


async def test_a_failed_bash_command_says_its_exit_status(sandbox: Service) -> None:
    result = await sandbox.executions.run("ls /nonexistent", session_id="probe", language="bash")
    assert result.status == "error"
    assert result.error is not None
    assert (result.error.ename, result.error.evalue) == ("exit status", "2")
    assert result.error.traceback == ["exit status 2"]


async def test_bash_exiting_is_an_error_with_its_status_and_a_new_bash(service: Service) -> None:
    await service.create_session("exits")
    result = await service.executions.run("echo hi; exit 3", session_id="exits", language="bash")
    assert result.status == "error", result.text()
    assert result.error is not None and result.error.evalue == "3"
    assert result.stdout == "hi\n"
    assert "Restarting" not in result.text()
    assert result.error.traceback == ["bash exited with status 3; a new bash was started"]
    # A line `exit` the user prints is kept: only bash's own, when it ends, is dropped.
    after = await service.executions.run(
        "echo again; echo exit", session_id="exits", language="bash"
    )
    assert (after.status, after.stdout) == ("ok", "again\nexit\n")


async def test_flood_of_100_mb_is_cut_and_the_kernel_survives(service: Service) -> None:
    await service.create_session("flood")
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)\n"
    result = await service.executions.run(code, session_id="flood")
    assert result.output_truncated
    assert len(result.stdout) <= service.settings.max_output_bytes
    assert result.output_cut_bytes > 0
    assert result.message is not None and "output cut" in result.message
    after = await service.executions.run("'alive'", session_id="flood")
    assert after.results == [{"text/plain": "'alive'"}]


async def test_single_huge_print_is_cut(service: Service) -> None:
    await service.create_session("huge")
    result = await service.executions.run("print('y' * 20_000_000)", session_id="huge")
    assert result.output_truncated
    assert result.output_bytes <= service.settings.max_output_bytes
    assert result.output_cut_bytes >= 20_000_000 - service.settings.max_output_bytes


async def test_code_that_never_returns_times_out_and_is_interrupted(service: Service) -> None:
    await service.create_session("loop")
    await service.executions.run("before = 'kept'", session_id="loop")
    result = await service.executions.run("while True:\n    pass", session_id="loop", timeout_s=1.5)
    assert result.status == "timeout"
    assert not result.kernel_restarted
    assert "1.5 s" in (result.message or "")
    after = await service.executions.run("before", session_id="loop")
    assert after.results == [{"text/plain": "'kept'"}]


async def test_code_that_ignores_interrupts_gets_its_kernel_restarted(service: Service) -> None:
    await service.create_session("stubborn")
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "while True:\n    time.sleep(0.1)\n"
    )
    result = await service.executions.run(code, session_id="stubborn", timeout_s=1)
    assert result.status == "timeout"
    assert result.kernel_restarted
    after = await service.executions.run("1", session_id="stubborn")
    assert after.status == "ok"


async def test_os_exit_is_a_died_result_and_the_next_call_gets_a_new_kernel(
    service: Service,
) -> None:
    await service.create_session("exit")
    await service.executions.run("open('/workspace/keep.txt','w').write('safe')", session_id="exit")
    result = await service.executions.run("import os; os._exit(3)", session_id="exit")
    assert result.status == "died"
    after = await service.executions.run("open('/workspace/keep.txt').read()", session_id="exit")
    assert after.status == "ok"
    assert after.kernel_restarted
    assert after.results == [{"text/plain": "'safe'"}]


async def test_kill_9_of_itself_is_a_died_result(service: Service) -> None:
    await service.create_session("self-kill")
    result = await service.executions.run(
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", session_id="self-kill"
    )
    assert result.status == "died"
    assert (await service.executions.run("2", session_id="self-kill")).status == "ok"


async def test_a_died_result_keeps_what_was_printed_before_the_kernel_died(
    service: Service,
) -> None:
    """Output that reached the host before the kernel died is in the result, even when the
    host had not read it yet when it noticed the death (here a slow output hook holds the
    reader until the kernel is gone)."""
    await service.create_session("last-words")
    await service.executions.run("1", session_id="last-words")
    kernel = service.sessions.session_for("last-words").kernels["python"]
    code = (
        "import os, signal, time\n"
        "print('first', flush=True)\n"
        "time.sleep(0.2)\n"
        "print('second', flush=True)\n"
        "time.sleep(0.5)\n"  # lets 'second' reach the host's socket
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    held = False

    async def slow_reader(kind: str, content: object) -> None:
        nonlocal held
        if held:
            return
        held = True
        deadline = asyncio.get_running_loop().time() + 20
        while await kernel.is_alive():
            assert asyncio.get_running_loop().time() < deadline, "the kernel did not die"
            await asyncio.sleep(0.05)

    session = service.sessions.session_for("last-words")
    result = await service.sessions.calls.execute(session, code, on_output=slow_reader)
    assert held
    assert result.status == "died"
    assert result.stdout == "first\nsecond\n"


async def test_kernel_killed_from_outside_mid_execution(service: Service) -> None:
    await service.create_session("victim")
    await service.create_session("bystander")
    task = asyncio.create_task(
        service.executions.run(
            "import time\nprint('start', flush=True)\ntime.sleep(30)", session_id="victim"
        )
    )
    await asyncio.sleep(1.0)
    kernel_pid = service.sessions.session("victim").kernels["python"].pid
    assert kernel_pid is not None
    assert psutil.Process(kernel_pid).cmdline()[1:2] == [scripts.run_path("python_kernel.py")]
    os.kill(kernel_pid, signal.SIGKILL)
    result = await asyncio.wait_for(task, 20)
    assert result.status == "died"
    assert (await service.executions.run("'still here'", session_id="bystander")).status == "ok"
    assert (await service.executions.run("3", session_id="victim")).results == [{"text/plain": "3"}]


async def test_executions_in_one_session_run_in_arrival_order(service: Service) -> None:
    await service.create_session("queue")
    await service.executions.run("order = []", session_id="queue")
    calls = [
        service.executions.run(
            f"import time; time.sleep(0.05); order.append({i})", session_id="queue"
        )
        for i in range(5)
    ]
    results = await asyncio.gather(*calls)
    assert all(r.status == "ok" for r in results)
    assert (await service.executions.run("order", session_id="queue")).results == [
        {"text/plain": "[0, 1, 2, 3, 4]"}
    ]
    assert max(r.queued_s for r in results) > 0


async def test_sessions_run_in_parallel(service: Service) -> None:
    await asyncio.gather(service.create_session("p1"), service.create_session("p2"))
    code = "import time\nstart = time.time()\ntime.sleep(1.5)\n(start, time.time())"
    results = await asyncio.gather(
        service.executions.run(code, session_id="p1"), service.executions.run(code, session_id="p2")
    )
    assert all(r.status == "ok" for r in results)
    (start1, end1), (start2, end2) = (ast.literal_eval(r.results[0]["text/plain"]) for r in results)
    # The two executions overlapped in time: neither waited for the other to finish.
    assert start1 < end2 and start2 < end1


# The kernel's control thread made slow: an interrupt request is acted on (SIGINT raised,
# then the reply sent) a second after it arrives, as on a host too busy to schedule it.
SLOW_INTERRUPTS = (
    "import time as _time\n"
    "_kernel = get_ipython().kernel\n"
    "_handle = _kernel.control_handlers['interrupt_request']\n"
    "def _slow(*args):\n"
    "    _time.sleep(1.0)\n"
    "    return _handle(*args)\n"
    "_kernel.control_handlers['interrupt_request'] = _slow\n"
)
NEXT_CALL = "import time\ntime.sleep(2)\nprint('next')"


async def test_a_late_flood_interrupt_never_lands_in_the_next_call(service: Service) -> None:
    await service.create_session("late-flood")
    assert (await service.executions.run(SLOW_INTERRUPTS, session_id="late-flood")).status == "ok"
    # Done before the kernel acts on the interrupt the cut sends.
    flood = "import sys\nfor _ in range(20):\n    sys.stdout.write('x' * 100_000)\n"
    flooded = await service.executions.run(flood, session_id="late-flood")
    assert flooded.limit == "output", flooded.text()
    after = await service.executions.run(NEXT_CALL, session_id="late-flood")
    assert (after.status, after.stdout) == ("ok", "next\n"), after.text()


async def test_a_late_cancel_interrupt_never_lands_in_the_next_call(service: Service) -> None:
    await service.create_session("late-cancel")
    assert (await service.executions.run(SLOW_INTERRUPTS, session_id="late-cancel")).status == "ok"
    code = "import time\nprint('started', flush=True)\ntime.sleep(0.3)"
    execution = service.executions.start(code, session_id="late-cancel")
    async for _, event in execution.events():
        if event.text == "started\n":
            break
    await execution.cancel()
    await execution.result()
    after = await service.executions.run(NEXT_CALL, session_id="late-cancel")
    assert (after.status, after.stdout) == ("ok", "next\n"), after.text()


async def test_a_call_the_kernel_ends_without_a_reply_says_it_may_not_have_finished(
    service: Service,
) -> None:
    await service.create_session("no-reply")
    drop_reply = (
        "_kernel = get_ipython().kernel\n"
        "_send = _kernel.session.send\n"
        "def _drop(stream, msg_or_type, *args, **kwargs):\n"
        "    if msg_or_type == 'execute_reply':\n"
        "        _kernel.session.send = _send\n"
        "        return None\n"
        "    return _send(stream, msg_or_type, *args, **kwargs)\n"
        "_kernel.session.send = _drop\n"
        "print('ran')"
    )
    result = await service.executions.run(drop_reply, session_id="no-reply")
    assert result.status == "error", result.text()
    assert result.stdout == "ran\n"
    assert result.message is not None and "no reply" in result.message
    after = await service.executions.run("1 + 1", session_id="no-reply")
    assert after.results == [{"text/plain": "2"}]


async def test_a_call_the_kernel_aborts_says_the_code_did_not_run(service: Service) -> None:
    await service.create_session("aborted")
    # What ipykernel does to the calls queued behind one that failed with stop_on_error.
    await service.executions.run("get_ipython().kernel._aborting = True", session_id="aborted")
    result = await service.executions.run("print('never')", session_id="aborted")
    assert result.status == "error", result.text()
    assert result.stdout == ""
    assert result.message is not None and "did not run" in result.message


async def test_a_message_the_kernel_forges_is_dropped_and_the_result_stands(
    sandbox: Service,
) -> None:
    """The agent's code can write anything on its kernel's sockets (it has the key too): a
    message that cannot be read (here a bad signature on iopub) is dropped, not a failure."""
    code = (
        "k = get_ipython().kernel\n"
        "frames = [b'x', b'<IDS|MSG>', b'not-a-signature', b'{}', b'{}', b'{}', b'{}']\n"
        "k.iopub_socket.send_multipart(frames)\n"
        "import sys; sys.stdout.flush()\n"
        "print('still here')\n"
    )
    result = await sandbox.executions.run(code, session_id="probe")
    assert result.status == "ok", result.text()
    assert result.stdout == "still here\n"
