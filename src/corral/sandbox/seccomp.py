"""The seccomp filter every sandbox runs under, compiled once and handed to bwrap by descriptor.

The filter allows by default and refuses the calls a sandboxed program never needs and an
escape usually does: tracing, mounting, namespaces, kernel keyrings, BPF, module loading,
io_uring (its own syscall surface, past seccomp), and terminal injection. `clone3` answers
ENOSYS so libc falls back to `clone`, whose flags seccomp can inspect.

No sandbox may leave a setuid or setgid file or directory, or a file capability, on the host
(under a root server the sandbox's files belong to host root): every call that sets a mode
is refused (EPERM) when the mode has either bit, `openat2` (its mode sits in memory seccomp
cannot read) answers ENOSYS so callers fall back to `openat`, and extended attributes cannot
be set at all (ENOTSUP, as on a filesystem without them: the name is in memory too).
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from typing import Any

from corral.errors import SandboxUnavailable

CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
LOW_32_BITS = 0xFFFFFFFF
SPECIAL_MODE_BITS = (0o4000, 0o2000)  # S_ISUID, S_ISGID
# Each call that sets a mode: the index of its mode argument, and for the open calls the
# index of the flags that make the mode count (O_CREAT, O_TMPFILE).
MODE_ARGUMENT: dict[str, int] = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "creat": 1,
    "mkdir": 1,
    "mkdirat": 2,
    "mknod": 1,
    "mknodat": 2,
}
OPEN_ARGUMENTS: dict[str, tuple[int, int]] = {"open": (1, 2), "openat": (2, 3)}
O_CREAT = os.O_CREAT
O_TMPFILE = getattr(os, "O_TMPFILE", 0o20200000)
SET_XATTR = ("setxattr", "lsetxattr", "fsetxattr")

DENIED_SYSCALLS: tuple[str, ...] = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",  # another process's descriptors (pid 1's, say), like ptrace
    "process_madvise",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "acct",
    "quotactl",
    "lookup_dcookie",
    "name_to_handle_at",
    "open_by_handle_at",
    "syslog",
    "vhangup",
)


@functools.cache
def compiled_filter() -> bytes:
    """The filter as classic BPF, as bwrap's `--seccomp` expects it.

    Raises `SandboxUnavailable` when libseccomp cannot be loaded.
    """
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as exc:
        raise SandboxUnavailable(
            "libseccomp could not be loaded: install your distribution's libseccomp2 package"
        ) from exc
    filt = sc.SyscallFilter(defaction=sc.ALLOW)
    for name in DENIED_SYSCALLS:
        filt.add_rule(sc.ERRNO(errno.EPERM), name)
    filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    filt.add_rule(
        sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    )
    # ioctl's request is an int in the kernel: compare only the low 32 bits so garbage in the
    # upper half cannot slip a TIOCSTI past the filter.
    for request in (TIOCSTI, TIOCLINUX):
        filt.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, LOW_32_BITS, request))
    _refuse_special_modes(sc, filt)
    with tempfile.TemporaryFile() as out:
        filt.export_bpf(out)
        out.seek(0)
        return out.read()


def _refuse_special_modes(sc: Any, filt: Any) -> None:
    """No setuid or setgid bit through any call that sets a mode, and no xattr at all."""
    for bit in SPECIAL_MODE_BITS:
        for name, mode_at in MODE_ARGUMENT.items():
            filt.add_rule(sc.ERRNO(errno.EPERM), name, sc.Arg(mode_at, sc.MASKED_EQ, bit, bit))
        for name, (flags_at, mode_at) in OPEN_ARGUMENTS.items():
            for flag in (O_CREAT, O_TMPFILE):
                filt.add_rule(
                    sc.ERRNO(errno.EPERM),
                    name,
                    sc.Arg(flags_at, sc.MASKED_EQ, flag, flag),
                    sc.Arg(mode_at, sc.MASKED_EQ, bit, bit),
                )
    filt.add_rule(sc.ERRNO(errno.ENOSYS), "openat2")
    for name in SET_XATTR:
        filt.add_rule(sc.ERRNO(errno.ENOTSUP), name)


def filter_fd() -> int:
    """A new readable descriptor holding the compiled filter, positioned at its start.

    The caller passes it to bwrap (`pass_fds`) and closes it after the spawn.
    """
    program = compiled_filter()
    fd = os.memfd_create("corral-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
