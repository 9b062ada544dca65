"""The seccomp filter every sandbox runs under, compiled once and handed to bwrap by descriptor.

The filter allows by default and refuses the calls a sandboxed program never needs and an
escape usually does: tracing, mounting, namespaces, kernel keyrings, BPF, module loading,
io_uring (its own syscall surface, past seccomp), and terminal injection. `clone3` answers
ENOSYS so libc falls back to `clone`, whose flags seccomp can inspect.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile

from corral.errors import SandboxUnavailable

CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
LOW_32_BITS = 0xFFFFFFFF

DENIED_SYSCALLS: tuple[str, ...] = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
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
    with tempfile.TemporaryFile() as out:
        filt.export_bpf(out)
        out.seek(0)
        return out.read()


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
