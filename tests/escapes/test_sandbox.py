"""Escape attempts from code running inside a session's sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import stat
from dataclasses import asdict
from pathlib import Path

import httpx
import psutil
import pytest

from corral.errors import PathRefused
from corral.kernels.results import ExecutionResult
from corral.sandbox.writers import name_of
from corral.server.operation import wire
from corral.server.schemas import NetworkPolicyModel
from corral.tokens import load_tokens
from tests.conftest import disk_looked_at_again
from tests.escapes.battery import (
    FILES,
    HOST_VAR,
    MIB,
    SECRET,
    SSH_KEY,
    TASKS,
    TMP,
    TOKEN,
    WEB_HOST,
    A,
    B,
    Host,
    P,
    answers,
    command,
    execute,
    outcomes,
    pending_connections,
    py,
    unix_listener,
)
from tests.snippets import fork_loop, snapshot
from tests.waiting import until

# -- host secrets through /proc ----------------------------------------------------------------


async def test_read_host_secret_through_proc_1_root(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "secret": f"open('/proc/1/root{host.secret}').read()",
            "ssh key": f"open('/proc/1/root{host.ssh_key}').read()",
            "shadow": "open('/proc/1/root/etc/shadow').read()",
            "host home": f"os.listdir('/proc/1/root{Path.home()}')",
        },
    )
    assert got == {
        "secret": "ENOENT",
        "ssh key": "ENOENT",
        "shadow": "ENOENT",
        "host home": "ENOENT",
    }


async def test_read_host_secret_through_the_host_servers_proc_root(host: Host) -> None:
    pid = os.getpid()
    got = await outcomes(
        host,
        {
            "root": f"open('/proc/{pid}/root{host.secret}').read()",
            "cwd": f"os.listdir('/proc/{pid}/cwd')",
            "environ": f"open('/proc/{pid}/environ').read()",
            "fd": f"os.listdir('/proc/{pid}/fd')",
            "kill": f"os.kill({pid}, 0)",
        },
    )
    assert got == {
        "root": "ENOENT",
        "cwd": "ENOENT",
        "environ": "ENOENT",
        "fd": "ENOENT",
        "kill": "ESRCH",  # the host's processes do not exist in the sandbox's pid namespace
    }


async def test_climb_out_through_proc_self_root_dotdot(host: Host) -> None:
    seen = await py(
        host,
        "import json, os\n"
        "print(json.dumps({\n"
        "    'same': sorted(os.listdir('/proc/self/root/..')) == sorted(os.listdir('/')),\n"
        "    'deep': sorted(os.listdir('/proc/self/root/../../..')) == sorted(os.listdir('/')),\n"
        f"    'secret': os.path.exists('/proc/self/root/../..{host.secret}'),\n"
        "    'inode': os.stat('/proc/self/root/..').st_ino == os.stat('/').st_ino,\n"
        "}))",
    )
    assert seen == {"same": True, "deep": True, "secret": False, "inode": True}


FD_WALK = """
import errno, json, os, stat
contents = []
mine = {int(line.split()[0]) for line in open('/proc/self/mountinfo')}
null = os.makedev(1, 3)
found = []
for pid in sorted(p for p in os.listdir('/proc') if p.isdigit()):
    for fd in os.listdir(f'/proc/{pid}/fd'):
        link = f'/proc/{pid}/fd/{fd}'
        try:
            target = os.readlink(link)
            info = os.stat(link)
            fdinfo = open(f'/proc/{pid}/fdinfo/{fd}').read()
        except OSError:
            continue  # closed while we looked (the listing's own descriptor)
        mnt = int(fdinfo.split('mnt_id:')[1].split()[0])
        entry = {'pid': pid, 'fd': fd, 'target': target, 'mine': mnt in mine,
                 'null': stat.S_ISCHR(info.st_mode) and info.st_rdev == null,
                 'ino': info.st_ino, 'regular': stat.S_ISREG(info.st_mode), 'read': None}
        if entry['regular']:
            try:
                with open(link, 'rb') as f:
                    contents.append(f.read(1 << 20))
                entry['read'] = True
            except OSError as e:
                entry['read'] = errno.errorcode[e.errno]
        found.append(entry)
# What the descriptors hold goes to the workspace, for the host to search.
open('/workspace/fd-contents.bin', 'wb').write(b'\\0'.join(contents))
print(json.dumps(found))
"""


async def test_follow_inherited_descriptors_to_host_paths(host: Host) -> None:
    """Every descriptor of every process inside names a pipe, a socket, an anonymous inode
    or a file on the sandbox's own mounts; the one exception is the host's /dev/null (the
    kernel's stderr is a pipe the server drains, not a host file)."""
    found = await py(host, FD_WALK)
    paths = [entry for entry in found if entry["target"].startswith("/")]
    assert paths, found
    outside = [e for e in paths if not e["mine"] and not e["null"]]
    assert outside == []
    assert [e for e in found if e["regular"] and e["read"] is not True] == []
    # What the open regular files hold (nothing, when none is open) names no host secret.
    contents = host.service.files.read(A, "fd-contents.bin")
    assert SECRET.encode() not in contents and SSH_KEY.encode() not in contents
    assert not [e for e in paths if str(host.secret.parent) in e["target"]]


async def test_read_host_home_paths_in_mountinfo(host: Host) -> None:
    """The mount table names no host secret path, not the home itself, and below the home
    only the read-only interpreter prefix the design binds at /opt/corral."""
    mounts = await py(
        host,
        "import json\nprint(json.dumps([l.split() for l in open('/proc/self/mountinfo')]))",
    )
    home = str(Path.home())
    text = json.dumps(mounts)
    assert str(host.secret.parent) not in text and str(host.ssh_key.parent) not in text
    for fields in mounts:
        root, point, options = fields[3], fields[4], fields[5]
        assert root != home and point != home, fields
        if root.startswith(home + "/"):
            assert point.startswith("/opt/corral/"), fields
            assert options.split(",")[0] == "ro", fields


async def test_read_host_variables_from_proc_environ(host: Host) -> None:
    assert os.environ[HOST_VAR] == SECRET
    environs = await py(
        host,
        "import json, os\n"
        "print(json.dumps({p: open(f'/proc/{p}/environ', 'rb').read().decode('latin-1')\n"
        "    for p in os.listdir('/proc') if p.isdigit()}))",
    )
    assert len(environs) >= 2, environs  # bwrap (pid 1) and the kernel at least
    for environ in environs.values():
        assert HOST_VAR not in environ
        assert "JPY_PARENT_PID" not in environ and "CORRAL_STATE_DIR" not in environ


# -- links in the workspace ------------------------------------------------------------------


async def test_follow_a_workspace_symlink_to_the_host_secret_inside(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "read": "open('/workspace/to-secret').read()",
            "stat": "os.stat('/workspace/to-secret')",
            "dir": "os.listdir('/workspace/to-secret-dir')",
        },
        setup=(
            f"os.symlink({str(host.secret)!r}, '/workspace/to-secret')\n"
            f"os.symlink({str(host.secret.parent)!r}, '/workspace/to-secret-dir')"
        ),
    )
    assert got == {"read": "ENOENT", "stat": "ENOENT", "dir": "ENOENT"}


async def test_read_a_workspace_symlink_to_the_host_secret_with_the_file_api(host: Host) -> None:
    await py(
        host,
        f"import os\nos.symlink({str(host.secret)!r}, '/workspace/leak')\nprint('null')",
    )
    with pytest.raises(PathRefused, match="'leak' is a symbolic link, and links are never"):
        host.service.files.read(A, "leak")
    with pytest.raises(PathRefused, match="is a symbolic link"):
        host.service.files.read(A, "/workspace/leak")
    before = len(host.server_hits)
    tokens = load_tokens(host.settings.config_dir, env={})
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{host.server_port}",
        headers={"Authorization": f"Bearer {tokens.agent}"},
    ) as http:
        response = await http.get(f"/v1/sessions/{A}/files/content", params={"path": "leak"})
    assert len(host.server_hits) == before + 1  # the real server answered this one
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "path_refused"
    assert SECRET not in response.text
    assert host.secret.read_text() == SECRET + "\n"


async def test_read_through_a_symlinked_parent_directory_with_the_file_api(host: Host) -> None:
    await py(
        host,
        f"import os\nos.symlink({str(host.secret.parent)!r}, '/workspace/secret-dir')\n"
        f"os.symlink({str(host.ssh_key.parent.parent)!r}, '/workspace/fake-home')\n"
        "print('null')",
    )
    for path in ("secret-dir/host-secret.txt", "fake-home/.ssh/id_ed25519"):
        with pytest.raises(PathRefused, match="is a symbolic link, and links are never followed"):
            host.service.files.read(A, path)
    with pytest.raises(PathRefused, match="is a symbolic link"):
        host.service.files.list(A, "secret-dir")
    with pytest.raises(PathRefused, match="is a symbolic link"):
        host.service.files.write(A, "secret-dir/host-secret.txt", b"overwritten")
    assert host.secret.read_text() == SECRET + "\n"
    listing = asdict(host.service.files.list(A, ".", recursive=True))
    assert {e["kind"] for e in listing["entries"] if e["path"] == "secret-dir"} == {"link"}


async def test_hard_link_across_filesystems(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "from tmp": "os.link('/tmp/mine', '/workspace/hard-tmp')",
            "from etc": "os.link('/etc/passwd', '/workspace/hard-passwd')",
            "from usr": "os.link('/usr/bin/env', '/workspace/hard-env')",
            "from runtime": "os.link('/opt/corral/python/bin/python3', '/workspace/hard-py')",
        },
        setup="open('/tmp/mine', 'w').write('x')",
    )
    # Every one crosses a mount: EXDEV (fs.protected_hardlinks would say EPERM after it).
    assert got == dict.fromkeys(("from tmp", "from etc", "from usr", "from runtime"), "EXDEV")


# -- the network -----------------------------------------------------------------------------


def policy_is_none(host: Host, sid: str) -> None:
    assert wire(NetworkPolicyModel, host.service.network.policy(sid))["mode"] == "none"


async def test_reach_the_server_and_host_ports_with_python_sockets(host: Host) -> None:
    policy_is_none(host, A)
    before = (len(host.server_hits), len(host.web_hits))
    got = await outcomes(
        host,
        {
            "server": f"socket.create_connection(('127.0.0.1', {host.server_port}), timeout=3)",
            "web": f"socket.create_connection(('{WEB_HOST}', {host.web_port}), timeout=3)",
            "web v6": f"socket.create_connection(('::ffff:{WEB_HOST}', {host.web_port}), 3)",
            "server by name": f"socket.create_connection(('localhost', {host.server_port}), 3)",
        },
    )
    # The sandbox's loopback is its own: nothing listens there.
    assert got["server"] == got["web"] == got["server by name"] == "ECONNREFUSED", got
    assert got["web v6"] in ("ECONNREFUSED", "ENETUNREACH", "EAFNOSUPPORT"), got
    assert (len(host.server_hits), len(host.web_hits)) == before


async def test_reach_the_server_and_host_ports_with_curl_directly(host: Host) -> None:
    before = (len(host.server_hits), len(host.web_hits))
    for url in (
        f"http://127.0.0.1:{host.server_port}/health",
        f"http://{WEB_HOST}:{host.web_port}/",
    ):
        rc, out = await command(host, ["curl", "-sS", "--max-time", "5", "--noproxy", "*", url])
        assert rc == 7, out  # CURLE_COULDNT_CONNECT
        assert "Could not connect" in out or "Failed to connect" in out, out
    assert (len(host.server_hits), len(host.web_hits)) == before


async def test_reach_the_server_and_host_ports_through_the_proxy_with_policy_none(
    host: Host,
) -> None:
    policy_is_none(host, A)
    before = (len(host.server_hits), len(host.web_hits))
    proxy = "http://127.0.0.1:3128"
    server = f"127.0.0.1:{host.server_port}"
    web = f"{WEB_HOST}:{host.web_port}"
    curl = ["curl", "-sS", "--max-time", "10", "-w", "\nHTTP %{http_code}"]
    for target, extra in (
        (web, []),  # HTTP_PROXY from the environment
        (server, ["--proxy", proxy, "--noproxy", ""]),  # 127.0.0.1 is in NO_PROXY
    ):
        rc, out = await command(host, [*curl, *extra, f"http://{target}/"])
        assert rc == 0 and out.endswith("HTTP 403"), out
        assert f"corral refused {target}: mode none" in out, out
        rc, out = await command(host, [*curl, *extra, "--proxytunnel", f"http://{target}/"])
        assert rc == 56 and "CONNECT tunnel failed, response 403" in out, out
    rc, out = await command(
        host,
        [
            "curl",
            "-sS",
            "--max-time",
            "10",
            "--socks5-hostname",
            "127.0.0.1:1080",
            f"http://{web}/",
        ],
    )
    assert rc == 97, out  # CURLE_PROXY: the SOCKS server refused the connection
    status = await py(
        host,
        "import json, requests\n"
        f"r = requests.get('http://{web}/', timeout=10)\n"
        "print(json.dumps([r.status_code, 'corral refused' in r.text]))",
    )
    assert status == [403, True]
    assert (len(host.server_hits), len(host.web_hits)) == before
    assert wire(NetworkPolicyModel, host.service.network.policy(A))["stats"]["refused"] >= 6


async def test_open_raw_and_packet_sockets(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "raw icmp": "socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)",
            "raw ipv6": "socket.socket(socket.AF_INET6, socket.SOCK_RAW, 58)",
            "raw tcp": "socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)",
            "packet": "socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300)",
            "packet dgram": "socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300)",
        },
    )
    assert got == dict.fromkeys(got, "EPERM") and len(got) == 5, got


async def test_change_routes_and_links_over_netlink(host: Host) -> None:
    for argv in (
        ["ip", "route", "add", "default", "dev", "lo"],
        ["ip", "link", "add", "esc0", "type", "dummy"],
        ["ip", "address", "add", "10.9.9.9/24", "dev", "lo"],
    ):
        rc, out = await command(host, argv)
        assert rc == 2 and "RTNETLINK answers: Operation not permitted" in out, (argv, out)
    interfaces = await py(
        host, "import json, socket\nprint(json.dumps([n for _, n in socket.if_nameindex()]))"
    )
    assert interfaces == ["lo"]


async def test_send_udp_and_tcp_to_a_public_address(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "udp sendto": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            ".sendto(b'x', ('8.8.8.8', 53))",
            "udp connect": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            ".connect(('8.8.8.8', 53))",
            "tcp": "socket.create_connection(('1.1.1.1', 443), timeout=3)",
            "udp v6": "socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)"
            ".sendto(b'x', ('2001:4860:4860::8888', 53))",
        },
    )
    assert got == dict.fromkeys(got, "ENETUNREACH") and len(got) == 4, got


async def test_connect_to_a_host_abstract_unix_socket(host: Host) -> None:
    name = f"\0corral-escape-{TOKEN}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen(8)
    try:
        got = await outcomes(host, {"abstract": f"socket.socket(socket.AF_UNIX).connect({name!r})"})
        assert got == {"abstract": "ECONNREFUSED"}  # abstract names belong to a net namespace
        assert pending_connections(listener) == 0
    finally:
        listener.close()


# -- tracing -------------------------------------------------------------------------------

SIBLING = "_child = subprocess.Popen(['sleep', '60'])\ntime.sleep(0.1)"
REAP = "_child.kill()\n_child.wait()"


async def test_ptrace_attach_a_sibling_process(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "attach": "_sys(101, 16, _child.pid, 0, 0)",  # PTRACE_ATTACH
            "seize": "_sys(101, 0x4206, _child.pid, 0, 0)",  # PTRACE_SEIZE
            "traceme": "_sys(101, 0, 0, 0, 0)",
            "tracer": "[l for l in open(f'/proc/{_child.pid}/status') "
            "if l.startswith('TracerPid:\\t0')][0]",
        },
        setup=SIBLING,
        cleanup=REAP,
    )
    assert got == {"attach": "EPERM", "seize": "EPERM", "traceme": "EPERM", "tracer": "ok"}


async def test_ptrace_attach_pid_1(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "attach": "_sys(101, 16, 1, 0, 0)",
            "peek": "_sys(101, 2, 1, 0, 0)",  # PTRACE_PEEKTEXT
            "mem": "open('/proc/1/mem', 'rb').read(1)",
        },
    )
    assert got["attach"] == got["peek"] == "EPERM", got
    assert got["mem"] in ("EACCES", "EPERM", "EIO"), got


async def test_take_pid_1s_descriptors_with_pidfd_getfd(host: Host) -> None:
    # pidfd_open(1), then pidfd_getfd(pidfd, fd, 0) for each of pid 1's descriptors; and
    # process_madvise, the other call that acts on another process through a pidfd.
    got = await outcomes(
        host,
        {f"getfd {fd}": f"_sys(438, _pidfd, {fd}, 0)" for fd in range(4)}
        | {"madvise": "_sys(440, _pidfd, 0, 0, 0, 0)"},
        setup="_pidfd = _sys(434, 1, 0)",
        cleanup="os.close(_pidfd)",
    )
    assert got == dict.fromkeys(got, "EPERM")


async def test_process_vm_readv_a_sibling(host: Host) -> None:
    read = (
        "_buf = ctypes.create_string_buffer(64)\n"
        "class _Iov(ctypes.Structure):\n"
        "    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "_local = _Iov(ctypes.cast(_buf, ctypes.c_void_p), 64)\n"
        "_remote = _Iov(0x400000, 64)\n"
        "def _vm(number):\n"
        "    return _sys(number, _child.pid, ctypes.addressof(_local), 1, "
        "ctypes.addressof(_remote), 1, 0)\n"
    )
    got = await outcomes(
        host,
        {"readv": "_vm(310)", "writev": "_vm(311)"},
        setup=SIBLING + "\n" + read,
        cleanup=REAP,
    )
    assert got == {"readv": "EPERM", "writev": "EPERM"}


# -- namespaces ------------------------------------------------------------------------------


async def test_create_a_user_namespace_with_the_unshare_command(host: Host) -> None:
    for argv in (
        ["unshare", "-U", "true"],
        ["unshare", "--user", "--map-root-user", "id", "-u"],
        ["unshare", "-m", "true"],
    ):
        rc, out = await command(host, argv)
        assert rc == 1 and "unshare failed: Operation not permitted" in out, (argv, out)


async def test_create_a_user_namespace_with_the_unshare_syscall(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "libc newuser": "_c('unshare', 0x10000000)",
            "syscall newuser": "_sys(272, 0x10000000)",
            "newuser|newns": "_sys(272, 0x10000000 | 0x20000)",
            "newnet": "_sys(272, 0x40000000)",
        },
    )
    assert got == dict.fromkeys(got, "EPERM") and len(got) == 4, got


async def test_clone_with_clone_newuser(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "clone newuser": "_sys(56, 0x10000000 | 17, 0, 0, 0, 0)",
            "clone newuser high bits": "_sys(56, 0x10000000 | 17 | (1 << 40), 0, 0, 0, 0)",
            "clone3": "_sys(435, 0, 0)",
        },
    )
    # clone3 passes its flags in memory seccomp cannot read: it says ENOSYS, libc falls back.
    assert got == {
        "clone newuser": "EPERM",
        "clone newuser high bits": "EPERM",
        "clone3": "ENOSYS",
    }


async def test_setns_into_pid_1_namespaces(host: Host) -> None:
    kinds = ("user", "mnt", "net", "pid", "ipc", "uts", "cgroup")
    got = await outcomes(
        host,
        {kind: f"_sys(308, os.open('/proc/1/ns/{kind}', os.O_RDONLY), 0)" for kind in kinds},
    )
    assert got == dict.fromkeys(kinds, "EPERM")
    rc, out = await command(host, ["nsenter", "-t", "1", "-m", "-U", "true"])
    assert rc == 1 and "Operation not permitted" in out, out


# -- mounting ---------------------------------------------------------------------------------


async def test_mount_tmpfs_with_the_mount_command(host: Host) -> None:
    rc, out = await command(host, ["mount", "-t", "tmpfs", "none", "/workspace"])
    assert rc == 32 and "must be superuser to use mount" in out, out
    rc, out = await command(host, ["umount", "-l", "/workspace"])
    assert rc == 32, out


async def test_mount_with_the_syscall(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "mount tmpfs": "_sys(165, _p(b'none'), _p(b'/tmp'), _p(b'tmpfs'), 0, 0)",
            "bind remount rw": "_sys(165, _p(b'/usr'), _p(b'/usr'), 0, 0x1000 | 0x20, 0)",
            "umount2": "_sys(166, _p(b'/workspace'), 2)",
            "pivot_root": "_sys(155, _p(b'/tmp'), _p(b'/tmp'))",
        },
    )
    assert got == dict.fromkeys(got, "EPERM") and len(got) == 4, got


async def test_mount_with_the_new_mount_api(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "fsopen": "_sys(430, _p(b'tmpfs'), 0)",
            "fsconfig": "_sys(431, 0, 6, 0, 0, 0)",
            "fsmount": "_sys(432, 0, 0, 0)",
            "open_tree": "_sys(428, -100, _p(b'/'), 1 | 0x80000)",
            "move_mount": "_sys(429, -100, _p(b'/tmp'), -100, _p(b'/workspace'), 0)",
            "fspick": "_sys(433, -100, _p(b'/'), 0)",
            "mount_setattr": "_sys(442, -100, _p(b'/'), 0, 0, 0)",
        },
    )
    assert got == dict.fromkeys(got, "EPERM") and len(got) == 7, got


async def test_chroot_to_escape(host: Host) -> None:
    got = await outcomes(
        host,
        {"chroot": "os.chroot('/tmp')", "chroot syscall": "_sys(161, _p(b'/workspace'))"},
    )
    assert got == {"chroot": "EPERM", "chroot syscall": "EPERM"}


# -- terminals --------------------------------------------------------------------------------

TTY_SETUP = "import fcntl, pty, termios\n_master, _slave = pty.openpty()"


async def test_inject_keystrokes_with_tiocsti(host: Host) -> None:
    ops = {f"fd {fd}": f"fcntl.ioctl({fd}, termios.TIOCSTI, b'x')" for fd in (0, 1, 2)}
    ops["pty"] = "fcntl.ioctl(_slave, termios.TIOCSTI, b'x')"
    ops["high bits"] = "_sys(16, _slave, 0x100005412, _bufp)"
    ops["dev tty"] = "os.open('/dev/tty', os.O_RDWR)"
    ops["take a terminal"] = "fcntl.ioctl(_slave, termios.TIOCSCTTY, 0)"
    got = await outcomes(host, ops, setup=TTY_SETUP)
    assert {k: got[k] for k in ("fd 0", "fd 1", "fd 2", "pty", "high bits")} == dict.fromkeys(
        ("fd 0", "fd 1", "fd 2", "pty", "high bits"), "EPERM"
    )
    assert got["dev tty"] == "ENXIO"  # --new-session: no controlling terminal
    assert got["take a terminal"] == "EPERM"  # not a session leader (and no CAP_SYS_ADMIN)


async def test_inject_console_input_with_tioclinux(host: Host) -> None:
    ops = {f"fd {fd}": f"fcntl.ioctl({fd}, 0x541C, b'\\x02')" for fd in (0, 1, 2)}
    ops["pty"] = "fcntl.ioctl(_slave, 0x541C, b'\\x02')"
    got = await outcomes(host, ops, setup=TTY_SETUP)
    assert got == dict.fromkeys(ops, "EPERM")


# -- trusted files in a read-write project ------------------------------------------------------
#
# The project is an overlay: each attempt below changes the session's own view, and the test
# checks that nothing of it reached the host once a later pass of the sync has run.


async def synced(host: Host) -> None:
    """Return once the overlay's sync has made a full pass after everything run so far: a
    fresh ordinary file written now reaches the host only through such a pass."""
    marker = f"synced-{secrets.token_hex(4)}"
    await py(host, f"import os\nopen('{P}/{marker}', 'w').write('x')\nprint('null')")
    await until(lambda: (host.repo / marker).exists(), "a pass of the overlay sync")
    await py(host, f"import os\nos.unlink('{P}/{marker}')\nprint('null')")
    await until(lambda: not (host.repo / marker).exists(), "another pass")


async def test_write_through_the_protected_git_config(host: Host) -> None:
    config = (host.repo / ".git" / "config").read_bytes()
    got = await outcomes(
        host,
        {
            "append": f"open('{P}/.git/config', 'a').write('[core]\\n\\tfsmonitor = x\\n')",
            "chmod": f"os.chmod('{P}/.git/config', 0o666)",
            "rename": f"os.rename('{P}/.git/config', '{P}/.git/config.old')",
            "replace": f"os.replace('{P}/evil-config', '{P}/.git/config')",
            "link over": f"os.replace('{P}/evil-link', '{P}/.git/config')",
            "commondir": f"open('{P}/.git/commondir', 'w').write('../evil\\n')",
        },
        setup=(
            f"open('{P}/evil-config', 'w').write('[core]\\n\\thooksPath = /tmp\\n')\n"
            f"os.symlink({str(host.ssh_key)!r}, '{P}/evil-link')"
        ),
    )
    assert set(got.values()) == {"ok"}, got  # all in the session's own view
    await synced(host)
    assert (host.repo / ".git" / "config").read_bytes() == config
    assert not (host.repo / ".git" / "config.old").exists()
    assert not (host.repo / ".git" / "commondir").exists()
    await py(
        host, f"import os\nos.unlink('{P}/.git/commondir')\nprint('null')"
    )  # for the next attempts


async def test_add_a_git_hook_that_the_host_would_run(host: Host) -> None:
    hooks = snapshot(host.repo / ".git" / "hooks")
    hook = f"{P}/.git/hooks/pre-commit"
    seen = await py(
        host,
        "import json, os\n"
        f"open('{hook}', 'w').write('#!/bin/sh\\ncat {host.ssh_key} > /tmp/stolen\\n')\n"
        f"os.chmod('{hook}', 0o755)\n"
        f"print(json.dumps(os.path.exists('{hook}')))",
    )
    assert seen is True  # written, into the session's own view
    await synced(host)
    assert not (host.repo / ".git" / "hooks" / "pre-commit").exists()
    assert snapshot(host.repo / ".git" / "hooks") == hooks


async def test_move_dot_git_aside(host: Host) -> None:
    before = snapshot(host.repo / ".git")
    await outcomes(
        host,
        {
            ".git": f"os.rename('{P}/.git', '{P}/git-aside')",
            ".git/hooks": f"os.rename('{P}/.git/hooks', '{P}/hooks-aside')",
            ".claude": f"os.rename('{P}/.claude', '{P}/claude-aside')",
        },
    )
    await synced(host)
    assert not (host.repo / "git-aside").exists()
    assert snapshot(host.repo / ".git") == before


async def test_plant_a_new_repository_whose_config_the_host_would_run(host: Host) -> None:
    await command(host, ["git", "init", "-q", f"{P}/planted"])
    await py(
        host,
        f"open('{P}/planted/.git/config', 'a').write('[core]\\n\\tfsmonitor = touch /tmp/x\\n')"
        "\nprint('null')",
    )
    await synced(host)
    assert not (host.repo / "planted" / ".git" / "config").exists()
    assert not (host.repo / "planted" / ".git" / "hooks").exists()


# -- exhausting the session's limits ------------------------------------------------------------

FORK_LOOP = fork_loop(1000)


async def test_exhaust_pids_with_a_fork_loop(host: Host) -> None:
    result = await execute(host, FORK_LOOP, B)
    assert result.limit == "tasks", result.text()
    assert result.message is not None and f"limit of {TASKS} tasks" in result.message
    if host.service.host.mechanism.name == "rlimit":
        assert result.status == "died"
    else:
        assert result.status == "error", result.text()
        assert result.error is not None and result.error.ename == "BlockingIOError"
        assert int(result.stdout.split()[-1]) < TASKS
    await answers(host, A)
    await host.service.restart_session(B)  # its sleeping children hold the tasks
    await answers(host, B)


async def test_exhaust_memory_with_a_bytearray(host: Host) -> None:
    bomb, beside = await asyncio.gather(
        execute(host, "hog = bytearray(1 << 30)", B), execute(host, "1 + 1", A)
    )
    assert bomb.limit == "memory", bomb.text()
    assert bomb.status == ("error" if host.service.host.mechanism.name == "rlimit" else "died")
    assert bomb.message is not None and "256 MiB memory limit" in bomb.message
    assert beside.results == [{"text/plain": "2"}]
    await answers(host, A)
    await answers(host, B)


WORKSPACE_FILLER = """
import os
os.makedirs('/workspace/fill', exist_ok=True)
chunk = b'x' * (1 << 20)
i = 0
while True:
    with open(f'/workspace/fill/{i}.bin', 'wb') as f:
        for _ in range(4):
            f.write(chunk)
    i += 1
"""


def assert_stopped_by_the_disk_watch(result: ExecutionResult, words: str) -> None:
    assert result.status == "interrupted", result.text()
    assert result.limit == "disk"
    assert result.message is not None and words in result.message


async def assert_answers_once_measured_again(host: Host, sid: str) -> None:
    """After its files were removed: once measured again, the session answers."""
    await disk_looked_at_again(host.service, sid)
    await answers(host, sid)


async def test_fill_the_workspace(host: Host, disk_sid: str) -> None:
    result = await execute(host, WORKSPACE_FILLER, disk_sid)
    assert_stopped_by_the_disk_watch(result, "the workspace holds at most 64 MiB")
    await answers(host, A)
    host.service.files.delete(disk_sid, "fill", recursive=True)
    await assert_answers_once_measured_again(host, disk_sid)


async def test_fill_the_workspace_with_empty_files(host: Host, disk_sid: str) -> None:
    # No bytes to speak of, but every file costs the host an inode and a directory entry.
    code = (
        "import os\n"
        "os.makedirs('/workspace/many', exist_ok=True)\n"
        "i = 0\n"
        "while True:\n"
        "    open(f'/workspace/many/{i}', 'w').close()\n"
        "    i += 1\n"
    )
    result = await execute(host, code, disk_sid)
    assert_stopped_by_the_disk_watch(result, f"{FILES} files")
    report = host.service.controls.limits(disk_sid)
    assert report.workspace_files_used is not None and report.workspace_files_used > FILES
    host.service.files.delete(disk_sid, "many", recursive=True)
    await assert_answers_once_measured_again(host, disk_sid)


async def test_fill_host_disk_through_the_run_directory(host: Host, disk_sid: str) -> None:
    # The kernel's run directory (its sockets, at /run/corral) is on the host's disk: what
    # the sandbox writes there counts toward the workspace limit.
    filler = WORKSPACE_FILLER.replace("/workspace/fill", "/run/corral/fill")
    result = await execute(host, filler, disk_sid)
    assert_stopped_by_the_disk_watch(result, "the workspace holds at most 64 MiB")
    shutil.rmtree(run_dir(host, disk_sid) / "fill")
    await assert_answers_once_measured_again(host, disk_sid)


async def test_fill_tmp(host: Host) -> None:
    result = await execute(
        host,
        "with open('/tmp/big.bin', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))",
        B,
    )
    assert result.status == "error", result.text()
    assert result.error is not None and "[Errno 28] No space left on device" in result.error.evalue
    assert result.limit == "disk"
    assert result.message is not None and "/tmp 32 MiB" in result.message
    await answers(host, A)
    size = await py(
        host,
        "import json, os\nn = os.path.getsize('/tmp/big.bin')\nos.unlink('/tmp/big.bin')\n"
        "print(json.dumps(n))",
        B,
    )
    assert size <= TMP


def sandbox_processes(host: Host, sid: str) -> set[str]:
    """The names of the session's live sandbox processes (ones not yet reaped left out)."""
    names = set()
    for pid in host.service.sessions.session(sid).disk.processes():
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                names.add(name_of(pid))
    return names


async def stopped_while_idle(host: Host, sid: str, what: str) -> ExecutionResult:
    """Wait until the disk patrol stopped something in the idle session; its next result."""
    session = host.service.sessions.session(sid)
    await until(lambda: session.notes, f"the disk patrol to stop {what}")
    return await execute(host, "1 + 1", sid)


BACKGROUND_DD = (
    "import subprocess\n"
    "subprocess.Popen(['bash', '-c', 'mkdir -p /workspace/bg; while true; do "
    "dd if=/dev/zero of=/workspace/bg/$RANDOM bs=1M count=4 status=none; done'],"
    " start_new_session=True)\n"
    "print('started')\n"
)


async def test_fill_the_workspace_from_a_process_left_running(host: Host, disk_sid: str) -> None:
    # The code ends at once; its shell loop goes on writing while nothing runs.
    assert (await execute(host, BACKGROUND_DD, disk_sid)).stdout == "started\n"
    after = await stopped_while_idle(host, disk_sid, "the shell loop")
    assert after.results == [{"text/plain": "2"}]
    assert not after.kernel_restarted
    assert after.message is not None
    assert "while no code ran, the session went past its workspace limit (64 MiB" in after.message
    assert "processes that kept writing were killed: bash" in after.message
    await until(lambda: not {"bash", "dd"} & sandbox_processes(host, disk_sid), "dd and bash gone")
    host.service.files.delete(disk_sid, "bg", recursive=True)
    await assert_answers_once_measured_again(host, disk_sid)


BACKGROUND_THREAD = (
    "import os, threading, time\n"
    "def fill():\n"
    "    time.sleep(0.5)\n"
    "    os.makedirs('/workspace/th', exist_ok=True)\n"
    "    for i in range(100000):\n"
    "        with open(f'/workspace/th/{i}', 'wb') as f:\n"
    "            f.write(b'x' * (1 << 20))\n"
    "threading.Thread(target=fill, daemon=True).start()\n"
    "print('started')\n"
)


async def test_fill_the_workspace_from_a_kernel_thread(host: Host, disk_sid: str) -> None:
    # Nothing to kill but the kernel itself: its next call starts a fresh one and says why.
    assert (await execute(host, BACKGROUND_THREAD, disk_sid)).stdout == "started\n"
    after = await stopped_while_idle(host, disk_sid, "the kernel's thread")
    assert after.results == [{"text/plain": "2"}]
    assert after.kernel_restarted
    assert after.message is not None
    assert "the python kernel kept writing while none of its code ran" in after.message
    host.service.files.delete(disk_sid, "th", recursive=True)
    await assert_answers_once_measured_again(host, disk_sid)


# Empty files dirty no data pages, so the write counters name no writer for them.
BACKGROUND_EMPTY_FILES = (
    "import subprocess\n"
    "subprocess.Popen(['bash', '-c', 'mkdir -p /workspace/ef; i=0; while true; do "
    ": > /workspace/ef/$i; i=$((i+1)); done'], start_new_session=True)\n"
    "print('started')\n"
)


async def test_fill_the_workspace_with_empty_files_from_a_process_left_running(
    host: Host, disk_sid: str
) -> None:
    # The shell dirties no data pages for them (or only a directory's, depending on the
    # filesystem), but it cannot hide the CPU it uses: it is named by that, and killed.
    assert (await execute(host, BACKGROUND_EMPTY_FILES, disk_sid)).stdout == "started\n"
    after = await stopped_while_idle(host, disk_sid, "the shell loop")
    assert after.results == [{"text/plain": "2"}]
    assert not after.kernel_restarted
    assert after.message is not None
    assert f"while no code ran, the session went past its workspace limit (64 MiB and {FILES}" in (
        after.message
    )
    assert "processes that kept writing were killed: bash" in after.message
    await until(lambda: "bash" not in sandbox_processes(host, disk_sid), "the shell loop gone")
    host.service.files.delete(disk_sid, "ef", recursive=True)
    await assert_answers_once_measured_again(host, disk_sid)


BACKGROUND_THREAD_EMPTY_FILES = (
    "import os, threading, time\n"
    "def fill():\n"
    "    time.sleep(0.5)\n"
    "    os.makedirs('/workspace/te', exist_ok=True)\n"
    "    for i in range(1000000):\n"
    "        open(f'/workspace/te/{i}', 'wb').close()\n"
    "threading.Thread(target=fill, daemon=True).start()\n"
    "print('started')\n"
)


async def test_fill_the_workspace_with_empty_files_from_a_kernel_thread(
    host: Host, disk_sid: str
) -> None:
    assert (await execute(host, BACKGROUND_THREAD_EMPTY_FILES, disk_sid)).stdout == "started\n"
    after = await stopped_while_idle(host, disk_sid, "the kernel's thread")
    assert after.results == [{"text/plain": "2"}]
    assert after.kernel_restarted
    assert after.message is not None
    assert "the python kernel kept writing while none of its code ran" in after.message
    report = host.service.controls.limits(disk_sid)
    assert report.workspace_files_used is not None and report.workspace_files_used > FILES
    host.service.files.delete(disk_sid, "te", recursive=True)
    await assert_answers_once_measured_again(host, disk_sid)


async def test_fill_the_workspace_with_a_new_writer_each_time_one_is_killed(
    host: Host, disk_sid: str
) -> None:
    # Killing each `dd` is not enough: the code that starts them is stopped too.
    code = (
        "import subprocess\n"
        "for i in range(1000):\n"
        "    subprocess.run(['dd', 'if=/dev/zero', f'of=/workspace/again{i}', 'bs=1M',"
        " 'count=16', 'status=none'])\n"
    )
    result = await execute(host, code, disk_sid)
    assert result.limit == "disk", result.text()
    assert result.status in ("interrupted", "died"), result.text()
    # Stopped long before its thousand writers (a dd may end before the patrol sees it, so
    # the code itself is interrupted at the second stop).
    workspace = host.service.sessions.session(disk_sid).paths.workspace
    written = list(workspace.glob("again*"))
    assert len(written) < 100, len(written)
    for leftover in written:
        leftover.unlink()
    await assert_answers_once_measured_again(host, disk_sid)


async def test_grow_the_kernels_inherited_stderr(host: Host) -> None:
    # fd 2 of the sandbox's first process is what the server gave the kernel as stderr: a
    # pipe it drains, keeping only a tail, never a host file the sandbox could grow.
    code = (
        "import json\n"
        "written = 0\n"
        "with open('/proc/1/fd/2', 'wb', buffering=0) as f:\n"
        "    for _ in range(64):\n"
        "        written += f.write(b'e' * (1 << 20))\n"
        "print(json.dumps(written))\n"
    )
    assert await py(host, code, sid=B) == 64 * MIB
    kernel = host.service.sessions.session(B).kernels["python"]
    assert kernel.pid is not None
    assert stat.S_ISFIFO(os.stat(f"/proc/{kernel.pid}/fd/2").st_mode)
    assert kernel.stderr_tail().endswith("e" * 1000)
    await answers(host, A)


# -- the kernel's sockets and run directory -------------------------------------------------------


def run_dir(host: Host, sid: str) -> Path:
    """The kernel's run directory, shown to it at /run/corral."""
    path: Path = host.service.sessions.session(sid).kernels["python"].run_dir
    return path


def host_dir(host: Host, sid: str) -> Path:
    """The host-only directory the kernel's sockets are moved to, and the client uses."""
    path: Path = host.service.sessions.session(sid).kernels["python"].manager.host_dir
    return path


async def test_connect_to_another_sessions_kernel_sockets(host: Host) -> None:
    await answers(host, B)
    other = run_dir(host, B)
    sockets = host_dir(host, B)
    names = sorted(p.name for p in sockets.iterdir())
    assert sum(name.startswith("python-") for name in names) == 5, names
    other_workspace = host.service.get_session(B).workspace
    (other_workspace / "b-only.txt").write_text("b")
    targets = {f"B {name}": sockets / name for name in names}
    targets.update({f"B run dir {p.name}": p for p in other.iterdir()})
    targets.update({f"egress {p.name}": p for p in (host.settings.run_root / "egress").iterdir()})
    ops = {
        label: f"socket.socket(socket.AF_UNIX).connect({str(path)!r})"
        for label, path in targets.items()
    }
    ops["B workspace"] = f"open({str(other_workspace / 'b-only.txt')!r}).read()"
    ops["B file in own workspace"] = "open('/workspace/b-only.txt').read()"
    got = await outcomes(host, ops)
    assert got == dict.fromkeys(ops, "ENOENT"), got
    own = await py(host, "import json, os\nprint(json.dumps(sorted(os.listdir('/run/corral'))))")
    assert own == sorted(p.name for p in run_dir(host, A).iterdir())
    assert not set(own) & {"b-only.txt", other.name}


async def test_restart_after_replacing_kernel_sockets_with_a_link_and_a_file(host: Host) -> None:
    await answers(host, B)
    old = run_dir(host, B)
    with unix_listener(host.secret.parent / "service.sock") as listener:
        listener_path = listener.getsockname()
        planted = await py(
            host,
            "import glob, json, os\n"
            "ports = json.load(open('/run/corral/python.json'))\n"
            "names = sorted(f\"{ports['ip']}-{ports[k]}\" for k in ports if k.endswith('_port'))\n"
            f"os.symlink({listener_path!r}, names[0])\n"
            f"os.symlink({str(host.secret)!r}, names[1])\n"
            "open(names[2], 'w').write('not a socket')\n"
            "print(json.dumps(names))",
            B,
        )
        assert len(planted) == 5
        await host.service.restart_session(B)
        await answers(host, B)
        new = run_dir(host, B)
        assert new != old and not old.exists()  # a fresh run directory; the old one removed
        assert all(p.is_socket() for p in host_dir(host, B).glob("python-*"))
        assert pending_connections(listener) == 0  # the host never connected through a link
    assert host.secret.read_text() == SECRET + "\n"


async def test_plant_a_connection_file_in_the_run_directory(host: Host) -> None:
    await answers(host, B)
    kernel = host.service.sessions.session(B).kernels["python"]
    key = kernel.manager.session.key
    old = run_dir(host, B)
    fake = {
        "key": "planted",
        "ip": str(host.secret.parent / "k"),
        "transport": "ipc",
        "shell_port": 1,
        "iopub_port": 2,
        "stdin_port": 3,
        "hb_port": 4,
        "control_port": 5,
        "signature_scheme": "hmac-sha256",
    }
    await py(
        host,
        "import json, os\n"
        f"open('/run/corral/kernel.json.new', 'w').write({json.dumps(fake)!r})\n"
        "os.replace('/run/corral/kernel.json.new', '/run/corral/kernel.json')\n"
        "os.unlink('/run/corral/python.json')\n"
        f"os.symlink({str(host.secret)!r}, '/run/corral/python.json')\n"
        "print('null')",
        B,
    )
    await answers(host, B)  # the running kernel's client never rereads the file
    assert kernel.manager.session.key == key
    await host.service.restart_session(B)
    await answers(host, B)
    new = run_dir(host, B)
    assert new != old and not old.exists()
    assert not (new / "kernel.json").exists()  # the host's file is never where the sandbox writes
    info = json.loads((host_dir(host, B) / "kernel.json").read_text())
    assert info["key"] not in ("planted", key.decode())
    assert info["ip"].startswith(str(host_dir(host, B) / "python-"))
    assert host.service.sessions.session(B).kernels["python"].manager.session.key != b"planted"


async def test_make_the_host_reconnect_through_a_planted_socket_link(host: Host) -> None:
    """The kernel's sockets live in a directory the sandbox can write. If the host's
    client reconnects by path after the kernel goes away, it must not follow a link the
    sandbox put there to a host socket of its choosing (DESIGN 7: links are never read
    through; architecture: the run directory may hold links placed to make the server
    connect elsewhere)."""
    await answers(host, B)
    with unix_listener(host.secret.parent / "agent.sock") as listener:
        target = listener.getsockname()
        result = await execute(
            host,
            "import glob, os\n"
            "for name in glob.glob('/run/corral/python-*'):\n"
            f"    os.unlink(name); os.symlink({target!r}, name)\n"
            "os._exit(0)",
            B,
        )
        assert result.status == "died", result.text()
        await asyncio.sleep(0.5)
        connections = pending_connections(listener)
        await answers(host, B)  # a fresh kernel, its sockets under fresh names
        connections += pending_connections(listener)
    assert connections == 0, (
        f"the server connected {connections} times to the host socket {target} "
        "through links planted in the kernel's run directory"
    )


# -- what the sandbox is --------------------------------------------------------------------------


DEV_NAMES = set(
    [
        "core",
        "fd",
        "full",
        "null",
        "ptmx",
        "pts",
        "random",
        "shm",
        "stderr",
        "stdin",
        "stdout",
        "tty",
        "urandom",
        "zero",
    ]
)


async def test_find_sys_and_host_devices(host: Host) -> None:
    seen = await py(
        host,
        "import json, os\n"
        "e = os.path.exists\n"
        "print(json.dumps([e('/sys'), sorted(os.listdir('/dev')),\n"
        "    e('/dev/vda'), e('/dev/kmsg'), e('/dev/mem')]))",
    )
    sys_exists, dev, block, kmsg, mem = seen
    assert (sys_exists, block, kmsg, mem) == (False, False, False, False)
    assert set(dev) <= DEV_NAMES, dev


async def test_read_the_kernel_log_with_dmesg(host: Host) -> None:
    rc, out = await command(host, ["dmesg"])
    assert rc == 1 and "read kernel buffer failed: Operation not permitted" in out, out
    got = await outcomes(
        host,
        {"syslog read all": "_sys(103, 3, _bufp, 64)", "kmsg": "open('/dev/kmsg').read(1)"},
    )
    assert got == {"syslog read all": "EPERM", "kmsg": "ENOENT"}


async def test_use_kernel_keyrings(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "keyctl get session keyring": "_sys(250, 0, -3, 0)",
            "add_key": "_sys(248, _p(b'user'), _p(b'esc'), _p(b'x'), 1, -3)",
            "request_key": "_sys(249, _p(b'user'), _p(b'esc'), 0, 0)",
        },
    )
    assert got == dict.fromkeys(got, "EPERM") and len(got) == 3, got


async def test_load_a_bpf_program(host: Host) -> None:
    got = await outcomes(
        host, {"map create": "_sys(321, 0, 0, 0)", "prog load": "_sys(321, 5, 0, 0)"}
    )
    assert got == {"map create": "EPERM", "prog load": "EPERM"}


async def test_open_a_perf_event(host: Host) -> None:
    got = await outcomes(host, {"perf_event_open": "_sys(298, 0, 0, -1, -1, 0)"})
    assert got == {"perf_event_open": "EPERM"}


async def test_create_a_userfaultfd(host: Host) -> None:
    got = await outcomes(
        host,
        {"userfaultfd": "_sys(323, 0)", "dev node": "os.open('/dev/userfaultfd', os.O_RDWR)"},
    )
    assert got == {"userfaultfd": "EPERM", "dev node": "ENOENT"}


async def test_set_up_io_uring(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "io_uring_setup": "_sys(425, 8, _bufp)",
            "io_uring_enter": "_sys(426, 0, 1, 0, 0, 0, 0)",
            "io_uring_register": "_sys(427, 0, 0, 0, 0)",
        },
    )
    assert got == dict.fromkeys(got, "EPERM") and len(got) == 3, got


async def test_kexec_module_loading_and_reboot(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "kexec_load": "_sys(246, 0, 0, 0, 0)",
            "kexec_file_load": "_sys(320, -1, -1, 0, 0, 0)",
            "init_module": "_sys(175, 0, 0, _p(b''))",
            "finit_module": "_sys(313, -1, _p(b''), 0)",
            "delete_module": "_sys(176, _p(b'ext4'), 0)",
            "reboot": "_sys(169, 0xfee1dead, 672274793, 0x4321FEDC, 0)",
            "swapon": "_sys(167, _p(b'/tmp/swap'), 0)",
            "open_by_handle_at": "_sys(304, -100, 0, 0)",
        },
    )
    assert got == dict.fromkeys(got, "EPERM") and len(got) == 8, got


async def test_write_global_kernel_settings_through_proc_sys(host: Host) -> None:
    """Global sysctls (core_pattern runs a program as host root on the next crash) must not
    open for writing. Only the open is tried: nothing is ever written."""
    paths = [
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/kernel/sysrq",
        "/proc/sys/vm/overcommit_memory",
        "/proc/sys/fs/protected_symlinks",
        "/proc/sysrq-trigger",
    ]
    got = await outcomes(
        host, {path: f"os.close(os.open({path!r}, os.O_WRONLY))" for path in paths}
    )
    assert got["/proc/sysrq-trigger"] in ("ENOENT", "EROFS", "EACCES"), got
    opened = sorted(path for path in paths if got[path] == "ok")
    assert opened == [], (
        f"the sandbox can open host-global kernel settings for writing: {opened} "
        f"(its uid maps to host uid {os.getuid()}, and /proc/sys is not read-only)"
    )


async def test_sandbox_user_is_no_more_than_the_server_user_outside(host: Host) -> None:
    """One uid is mapped: the sandbox's 1000 is the server's own uid outside, nothing else.
    Under a root server that is host uid 0 without any capability; what uid 0 could still do
    by file mode alone (sysctls, /proc/sysrq-trigger) is closed by a read-only, masked /proc
    (see test_write_global_kernel_settings_through_proc_sys).

    A map's outside ids are relative to the reader's namespace: read inside, they are ids of
    the parent namespace, which an unprivileged bwrap makes as an intermediate step (its 0 is
    the server's uid). So the maps are read from the host, where outside means the host."""
    uid, euid, namespace = await py(
        host,
        "import json, os\n"
        "print(json.dumps([os.getuid(), os.geteuid(), os.readlink('/proc/self/ns/user')]))",
    )
    assert (uid, euid) == (1000, 1000)
    kernel = host.service.sessions.session(A).kernels["python"].pid
    assert kernel is not None
    tree = [kernel, *(p.pid for p in psutil.Process(kernel).children(recursive=True))]
    inside = [pid for pid in tree if os.readlink(f"/proc/{pid}/ns/user") == namespace]
    assert inside, f"no process of the kernel's tree {tree} is in its namespace {namespace}"
    for kind, outside in (("uid", os.getuid()), ("gid", os.getgid())):
        lines = Path(f"/proc/{inside[0]}/{kind}_map").read_text().splitlines()
        assert [line.split() for line in lines] == [["1000", str(outside), "1"]], kind


async def test_use_capabilities(host: Host) -> None:
    status = await py(
        host,
        "import json\n"
        "print(json.dumps(dict(l.rstrip('\\n').split(':\\t') for l in open('/proc/self/status')"
        " if l.startswith(('Cap', 'NoNewPrivs', 'Seccomp')))))",
    )
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[name] == "0000000000000000", status
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
    got = await outcomes(
        host,
        {
            "setuid 0": "os.setuid(0)",
            "chown": "os.chown('/workspace', 0, 0)",
            "setgroups": "os.setgroups([0])",
        },
    )
    # uid 0 has no mapping inside (EINVAL); groups are fixed in a user namespace (EPERM).
    assert got == {"setuid 0": "EINVAL", "chown": "EINVAL", "setgroups": "EPERM"}


# -- setuid, setgid and file capabilities ----------------------------------------------------

S_ISUID, S_ISGID = 0o4000, 0o2000
SUID_SETUP = (
    "import shutil, stat\n"
    "os.makedirs('/workspace/proj/suid', exist_ok=True)\n"
    "os.makedirs('/workspace/suid', exist_ok=True)\n"
    "shutil.copy('/usr/bin/id', '/workspace/proj/suid/id')\n"
    "shutil.copy('/usr/bin/id', '/workspace/suid/id')\n"
    "_fd = os.open('/workspace/suid/plain', os.O_CREAT | os.O_WRONLY, 0o755)\n"
    "os.umask(0)\n"
    "AT_FDCWD = -100\n"
    "CAP = b'\\x01\\x00\\x00\\x02\\xff\\xff\\xff\\xff\\x00\\x00\\x00\\x00\\xff\\xff\\xff\\xff"
    "\\x00\\x00\\x00\\x00'\n"
)
SUID_ATTEMPTS = {
    "chmod 4755 in a project": "os.chmod('/workspace/proj/suid/id', 0o4755)",
    "chmod 104755 in the workspace": "os.chmod('/workspace/suid/id', 0o104755)",
    "chmod 2755": "os.chmod('/workspace/suid/id', 0o2755)",
    "fchmod 4755": "os.fchmod(_fd, 0o4755)",
    "fchmodat 6755": "_sys(268, AT_FDCWD, _p(b'/workspace/suid/id'), 0o6755)",
    "fchmodat2 4755": "_sys(452, AT_FDCWD, _p(b'/workspace/suid/id'), 0o4755, 0)",
    "open O_CREAT 4755": "os.open('/workspace/suid/new', os.O_CREAT | os.O_WRONLY, 0o4755)",
    "openat O_TMPFILE 2755": "os.open('/workspace/suid', os.O_TMPFILE | os.O_WRONLY, 0o2755)",
    "creat 4755": "_sys(85, _p(b'/workspace/suid/creat'), 0o4755)",
    "openat2": "_sys(437, AT_FDCWD, _p(b'/workspace/suid/o2'), 0, 0)",
    "mkdir 2755": "os.mkdir('/workspace/suid/dir', 0o2755)",
    "mknod 4755": "os.mknod('/workspace/suid/node', stat.S_IFREG | 0o4755)",
    "setxattr security.capability": "os.setxattr('/workspace/suid/id', 'security.capability', CAP)",
    "setxattr user": "os.setxattr('/workspace/suid/id', 'user.note', b'x')",
    "chmod 0755 still works": "os.chmod('/workspace/suid/id', 0o755)",
    "chmod 1777 (sticky) still works": "os.chmod('/workspace/suid/plain', 0o1777)",
}


def special_bits_on_host(*roots: Path) -> list[str]:
    """Every file or directory under `roots` (as the host sees them) with a setuid or setgid
    bit, or a security.capability attribute."""
    found = []
    for root in roots:
        for path in [root, *root.rglob("*")]:
            info = path.lstat()
            if info.st_mode & (S_ISUID | S_ISGID):
                found.append(f"{path} {oct(info.st_mode)}")
            with contextlib.suppress(OSError):
                if not path.is_symlink() and "security.capability" in os.listxattr(path):
                    found.append(f"{path} security.capability")
    return found


async def test_plant_a_setuid_setgid_or_capability_file(host: Host) -> None:
    got = await outcomes(host, SUID_ATTEMPTS, setup=SUID_SETUP, cleanup="os.close(_fd)")
    refused = {label: "EPERM" for label in SUID_ATTEMPTS}
    refused.update(
        {
            "openat2": "ENOSYS",  # libc and Python fall back to openat, which is filtered
            "setxattr security.capability": "ENOTSUP",
            "setxattr user": "ENOTSUP",
            "chmod 0755 still works": "ok",
            "chmod 1777 (sticky) still works": "ok",
        }
    )
    assert got == refused
    workspace = host.service.sessions.session(A).paths.workspace
    assert special_bits_on_host(workspace, host.repo) == []


@pytest.mark.parametrize(
    ("shell", "refused"),
    [
        # /usr/bin/su belongs to host root: under a user's server it is unmapped inside, cp
        # cannot keep its owner and so drops the bits itself (no refusal to see, no bit left).
        ("cp -p /usr/bin/su /workspace/cp-p; ls -l /workspace/cp-p", os.geteuid() == 0),
        ("install -m 4755 /usr/bin/id /workspace/installed", True),
        (
            "python3 -c \"import tarfile; t = tarfile.open('/workspace/s.tar', 'w');"
            " i = t.gettarinfo('/usr/bin/id', 'id'); i.mode = 0o4755;"
            " t.addfile(i, open('/usr/bin/id', 'rb')); t.close()\";"
            " mkdir -p /workspace/untar && tar -xpf /workspace/s.tar -C /workspace/untar",
            True,
        ),
        ("mkdir -m 2775 /workspace/sgid-dir", True),
    ],
    ids=["cp -p", "install -m", "tar -p", "mkdir -m"],
)
async def test_tools_cannot_leave_a_setuid_or_setgid_file(
    host: Host, shell: str, refused: bool
) -> None:
    code, out = await command(host, ["bash", "-c", shell], sid=B)
    assert ("Operation not permitted" in out) == refused, (code, out)
    workspace = host.service.sessions.session(B).paths.workspace
    assert special_bits_on_host(workspace) == []


async def test_fill_dev_shm_past_the_tmp_size(host: Host) -> None:
    # bwrap's /dev is an unsized tmpfs: /dev/shm must be a tmpfs of its own, sized like /tmp.
    code = (
        "import errno, json, os\n"
        "written, why = 0, 'none'\n"
        "with open('/dev/shm/fill', 'wb') as f:\n"
        "    try:\n"
        "        for _ in range(4 * 32):\n"
        "            f.write(b'x' * (1 << 20)); f.flush(); written += 1 << 20\n"
        "    except OSError as exc:\n"
        "        why = errno.errorcode[exc.errno]\n"
        "s = os.statvfs('/dev/shm')\n"
        "os.unlink('/dev/shm/fill')\n"
        "print(json.dumps([written, why, s.f_blocks * s.f_frsize]))\n"
    )
    written, why, size = await py(host, code, sid=B)
    assert (why, size) == ("ENOSPC", TMP)
    assert written <= TMP


# -- a session the agent damages -------------------------------------------------------------

BRICK = (
    "import os, shutil\n"
    "env = '/opt/corral/env'\n"
    "site = f'{env}/lib/python3.11/site-packages'\n"
    "open(f'{site}/kept_package.py', 'w').write('VALUE = 41\\n')\n"
    "os.unlink(f'{env}/pyvenv.cfg')\n"
    "os.symlink('/etc/passwd', f'{env}/pyvenv.cfg')\n"
    "os.unlink(f'{env}/bin/python')\n"
    "os.symlink('/workspace/evil', f'{env}/bin/python')\n"
    "os.unlink(f'{env}/bin/python3.11')\n"
    "os.mkdir(f'{env}/bin/python3.11')\n"
    "open(f'{env}/bin/pip', 'w').write('#!/bin/sh\\necho pwned\\n')\n"
    "os.unlink(f'{site}/_corral_runtime.pth')\n"
    "print('damaged')\n"
)


async def test_brick_the_session_through_its_package_prefix(host: Host) -> None:
    sid = "esc-brick"
    await host.service.create_session(sid)
    assert (await execute(host, BRICK, sid)).stdout == "damaged\n"
    await host.service.restart_session(sid)
    result = await execute(host, "import kept_package, numpy\nkept_package.VALUE + 1", sid)
    assert result.status == "ok", result.text()
    assert result.results == [{"text/plain": "42"}]
    assert result.message is not None
    for name in ("pyvenv.cfg", "bin/python", "bin/python3.11", "bin/pip", "_corral_runtime.pth"):
        assert name in result.message, result.message
    assert "installed packages are kept" in result.message
    assert (await command(host, ["pip", "--version"], sid))[0] == 0
    after = await execute(host, "1 + 1", sid)
    assert after.message is None  # said once
    await host.service.delete_session(sid)
