"""Security properties, each checked from inside a real session's sandbox.

One property per test, named for it. The code runs in the kernel exactly as an agent's would.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.service import Service


async def _py(service: Service, code: str, session: str = "probe") -> str:
    result = await service.executions.run(code, session_id=session)
    assert result.status == "ok", result.text()
    return result.stdout.strip()


async def _errno_of(service: Service, code: str) -> str:
    """Run `code` that should fail; return the exception name and errno it raised."""
    wrapped = (
        "try:\n" + "".join(f"    {line}\n" for line in code.splitlines()) + "    print('ALLOWED')\n"
        "except OSError as e:\n    print('OSError', e.errno)\n"
        "except Exception as e:\n    print(type(e).__name__)\n"
    )
    return await _py(service, wrapped)


@pytest.fixture
def host_secret(tmp_path: Path) -> Iterator[Path]:
    secret = tmp_path / "secret.txt"
    secret.write_text("host-only")
    yield secret


async def test_host_home_is_invisible(sandbox: Service) -> None:
    home = os.path.expanduser("~")
    out = await _py(
        sandbox, f"import os; print(os.path.exists({home!r}) and bool(os.listdir({home!r})))"
    )
    assert out == "False"


async def test_root_home_is_invisible(sandbox: Service) -> None:
    assert await _py(sandbox, "import os; print(os.path.exists('/root'))") == "False"


async def test_etc_shadow_is_invisible(sandbox: Service) -> None:
    out = await _py(
        sandbox, "import os; print(os.path.exists('/etc/shadow'), sorted(os.listdir('/etc')))"
    )
    assert out.startswith("False")
    assert "shadow" not in out and "sudoers" not in out


async def test_run_holds_only_the_kernel_run_directory_and_egress_socket(
    sandbox: Service,
) -> None:
    out = await _py(
        sandbox, "import os; print(sorted(os.listdir('/run')), os.listdir('/run/corral-egress'))"
    )
    assert out == "['corral', 'corral-egress'] ['egress.sock']"


async def test_the_kernel_runs_without_the_debugger_or_a_history_file(sandbox: Service) -> None:
    """Left out to save memory and a write per cell; the agent can still import debugpy."""
    out = await _py(
        sandbox,
        "import sys; loaded = 'debugpy' in sys.modules or '_pydevd_bundle' in sys.modules\n"
        "import debugpy; hm = get_ipython().history_manager\n"
        "print(loaded, hm.enabled, bool(debugpy.__version__), '/opt/corral/bin' in sys.path)",
    )
    assert out == "False False True False"


async def test_host_tmp_is_invisible(sandbox: Service, host_secret: Path) -> None:
    out = await _py(
        sandbox, f"import os; print(os.path.exists({str(host_secret)!r}), os.listdir('/tmp'))"
    )
    assert out == "False []"


async def test_usr_is_read_only(sandbox: Service) -> None:
    out = await _errno_of(sandbox, "open('/usr/corral-test', 'w')")
    assert out == "OSError 30"  # EROFS


async def test_writes_outside_workspace_and_tmpfs_fail(sandbox: Service) -> None:
    for path in (
        "/corral-test",
        "/etc/corral-test",
        "/opt/corral/runtime/x.py",
        "/opt/corral/python/x",
    ):
        out = await _errno_of(sandbox, f"open({path!r}, 'w')")
        assert out.startswith("OSError"), (path, out)
    ok = await _py(
        sandbox,
        "for p in ('/workspace/w', '/tmp/w', '/home/sandbox/w'):\n"
        "    open(p, 'w').write('x')\nprint('written')",
    )
    assert ok == "written"


async def test_only_loopback_interface_exists(sandbox: Service) -> None:
    out = await _py(sandbox, "import socket; print([n for _, n in socket.if_nameindex()])")
    assert out == "['lo']"


async def test_host_loopback_services_are_unreachable(sandbox: Service) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    accepted: list[object] = []
    thread = threading.Thread(target=lambda: accepted.append(_accept_once(listener)))
    thread.start()
    try:
        out = await _errno_of(
            sandbox, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
        )
    finally:
        listener.close()
        thread.join(5)
    assert out == "OSError 111"  # ECONNREFUSED: the sandbox's own, empty loopback
    assert accepted in ([None], [])


def _accept_once(listener: socket.socket) -> object:
    listener.settimeout(3)
    try:
        return listener.accept()
    except OSError:
        return None


async def test_ptrace_is_refused(sandbox: Service) -> None:
    out = await _py(
        sandbox,
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())",
    )
    assert out == "-1 1"  # EPERM


async def test_mount_is_refused(sandbox: Service) -> None:
    out = await _py(
        sandbox,
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), "
        "ctypes.get_errno())",
    )
    assert out == "-1 1"


async def test_unshare_is_refused(sandbox: Service) -> None:
    out = await _py(
        sandbox,
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x00020000), ctypes.get_errno())",
    )  # NEWNS
    assert out == "-1 1"


async def test_new_user_namespace_is_refused(sandbox: Service) -> None:
    result = await sandbox.executions.run(
        "unshare --user --map-root-user true; echo rc=$?", session_id="probe", language="bash"
    )
    assert "rc=0" not in result.stdout
    out = await _py(
        sandbox,
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())",
    )
    assert out == "-1 1"


async def test_tiocsti_is_refused(sandbox: Service) -> None:
    code = (
        "import fcntl, os, pty, termios\n"
        "master, slave = pty.openpty()\n"
        "try:\n"
        "    fcntl.ioctl(slave, termios.TIOCSTI, b'x')\n"
        "    print('ALLOWED')\n"
        "except OSError as e:\n"
        "    print('OSError', e.errno)\n"
    )
    assert await _py(sandbox, code) == "OSError 1"


async def test_tiocsti_with_high_bits_set_is_refused(sandbox: Service) -> None:
    code = (
        "import ctypes, pty\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "master, slave = pty.openpty()\n"
        "c = ctypes.c_char(b'x')\n"
        "r = libc.ioctl(slave, ctypes.c_ulong(0x100005412), ctypes.byref(c))\n"
        "print(r, ctypes.get_errno())\n"
    )
    assert await _py(sandbox, code) == "-1 1"


async def test_host_processes_are_invisible(sandbox: Service) -> None:
    out = await _py(
        sandbox,
        "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        f"print(str({os.getpid()}) in pids, len(pids) < 10)",
    )
    assert out == "False True"


async def test_environment_holds_no_host_variables(sandbox: Service) -> None:
    os.environ.setdefault("CORRAL_TEST_SECRET", "leak")
    out = await _py(sandbox, "import os; print(sorted(os.environ))")
    assert "CORRAL_TEST_SECRET" not in out
    assert "JPY_PARENT_PID" not in out


async def test_capabilities_are_all_dropped(sandbox: Service) -> None:
    out = await _py(
        sandbox,
        "print([l for l in open('/proc/self/status') "
        "if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))])",
    )
    assert out.count("0000000000000000") == 3


async def test_two_sessions_cannot_see_each_other(sandbox: Service) -> None:
    await sandbox.create_session("neighbour")
    await _py(sandbox, "open('/workspace/mine.txt','w').write('a')\nimport os\nprint(os.getpid())")
    other = await _py(
        sandbox,
        "import os\nprint(os.listdir('/workspace'), "
        "sorted(p for p in os.listdir('/proc') if p.isdigit()))",
        session="neighbour",
    )
    assert "mine.txt" not in other
    probe_kernel = sandbox.sessions.session("probe").kernels["python"].pid
    assert str(probe_kernel) not in other.split("]", 1)[1]


async def test_kernel_runs_the_servers_own_interpreter(sandbox: Service) -> None:
    import sys

    out = await _py(sandbox, "import sys; print(sys.version)")
    assert out == sys.version
