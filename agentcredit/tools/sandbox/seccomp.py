"""The system-call filter of the bubblewrap sandbox: Docker's default seccomp profile, in its effect.

Namespaces do not cover the whole kernel. Inside a nested user namespace, code that is an unprivileged uid
outside becomes uid 0 with every capability, and from there it can mount file systems, open packet and netfilter
sockets and set up io_uring: the starting point of most recent container escapes (issue 34). Docker's default
profile (moby ``profiles/seccomp/default.json``) closes that door, and this filter follows its semantics:

- no keyring calls (``keyctl``, ``add_key``, ``request_key``): keyrings are not namespaced;
- no new namespaces: ``unshare`` and ``setns`` are denied, and so is ``clone`` with any ``CLONE_NEW*`` flag
  (Docker's rule: ``flags & 0x7E020000 == 0``). ``clone3`` passes its flags in memory a filter cannot read, so
  it gets ``ENOSYS`` as in Docker, and glibc falls back to ``clone`` (threads and ``fork`` keep working);
- no mounts, old (``mount``, ``umount2``, ``pivot_root``, ``chroot``) or new (``fsopen``, ``open_tree`` ...);
- no ``io_uring_*`` (``ENOSYS``, as a kernel built without it: liburing users treat that as "unsupported"),
  ``bpf``, ``perf_event_open``, ``userfaultfd``, ``ptrace``, ``process_vm_readv/writev``, ``kcmp``,
  ``pidfd_getfd``;
- no kernel modules, ``kexec``, ``reboot``, swap, clock setting, ``acct``, ``quotactl``, ``syslog`` and the
  other administrative calls Docker leaves out;
- sockets: ``AF_PACKET`` and ``AF_NETLINK`` families and ``SOCK_RAW`` / ``SOCK_PACKET`` types are denied.
  Docker allows ``socket`` and relies on dropping ``CAP_NET_RAW``; here the code has no capabilities either,
  but a netlink socket needs none, and a nested user namespace would have given them back, so the rule is
  explicit.

Docker writes its profile as an allow-list; this filter is a deny-list of the calls above (default: allow), so an
ordinary Python program (threads, ``subprocess``, files, ``mmap``) is never refused by a call we forgot to list.
Calls of another architecture (i386 via ``int 0x80``, x32) kill the process: that is libseccomp's default
``SCMP_FLTATR_ACT_BADARCH``, which closes the classic bypass of a deny-list.

The filter is built with libseccomp through its ctypes binding ``pyseccomp`` (API-compatible with libseccomp's
own Python binding, which is not on PyPI), exported as a BPF program, and handed to bubblewrap's ``--seccomp FD``,
which loads it right before it runs the sandbox's interpreter.
"""

from __future__ import annotations

import errno
import functools
import os

from agentcredit.tools.base import ToolUnavailableError

# Denied with EPERM (Docker's defaultErrnoRet) whatever their arguments.
DENIED: tuple[str, ...] = (
    # keyrings: not namespaced, so a key could pass between the host and a call, or between calls (issue 34)
    "keyctl", "add_key", "request_key",
    # namespaces
    "unshare", "setns",
    # mounts, the old and the new API
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr",
    # kernel attack surface that Docker's default profile leaves out
    "bpf", "perf_event_open", "userfaultfd", "lookup_dcookie", "open_by_handle_at", "name_to_handle_at",
    # other processes' memory and descriptors
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # modules, kexec, reboot, swap, clocks, accounting, quotas, the kernel log
    "init_module", "finit_module", "delete_module", "create_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "acct",
    "quotactl", "quotactl_fd", "syslog", "iopl", "ioperm", "vhangup", "nfsservctl", "uselib", "ustat", "sysfs",
    "_sysctl", "get_kernel_syms", "query_module",
    # NUMA memory policy (Docker allows them only with CAP_SYS_NICE)
    "mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
)  # fmt: skip

# Denied with ENOSYS, as Docker does: callers treat the call as absent and fall back.
ABSENT: tuple[str, ...] = ("io_uring_setup", "io_uring_enter", "io_uring_register", "clone3")

# clone flags that make a new namespace: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET.
CLONE_NAMESPACE_FLAGS = 0x7E020000
AF_NETLINK, AF_PACKET = 16, 17
SOCK_RAW, SOCK_PACKET, SOCK_TYPE_MASK = 3, 10, 0xF  # the type's low bits; the rest are SOCK_NONBLOCK/CLOEXEC


def _binding():
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:  # OSError: the binding loads libseccomp.so.2 when imported
        raise ToolUnavailableError(
            f"the sandbox's system-call filter needs libseccomp and its Python binding ({exc}); install them "
            "(pip install pyseccomp; Debian package libseccomp2), or run with isolation='rlimits', which is "
            "not safe for untrusted code (docs/sandbox.md)"
        ) from exc
    return pyseccomp


@functools.lru_cache(maxsize=1)
def filter_program() -> bytes:
    """The compiled BPF program (``struct sock_filter`` array) that bubblewrap's ``--seccomp`` reads.

    Built once per process. Raises :class:`ToolUnavailableError` when libseccomp is missing, and names a
    syscall libseccomp does not know (an old libseccomp on a new kernel) instead of leaving it out silently.
    """
    sc = _binding()
    flt = sc.SyscallFilter(sc.ALLOW)
    eperm, enosys = sc.ERRNO(errno.EPERM), sc.ERRNO(errno.ENOSYS)
    unknown = []
    for names, action in ((DENIED, eperm), (ABSENT, enosys)):
        for name in names:
            try:
                flt.add_rule(action, name)
            except (OSError, ValueError, RuntimeError):
                unknown.append(name)
    if unknown:
        raise ToolUnavailableError(
            f"libseccomp on this machine does not know the system calls {unknown}; the sandbox will not run "
            "without them in its filter: update libseccomp"
        )
    # MASKED_EQ compares (arg & mask) == value: one rule per namespace flag denies a clone carrying *any* of them.
    flags = CLONE_NAMESPACE_FLAGS
    while flags:
        bit = flags & -flags
        flags &= flags - 1
        flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    for family in (AF_NETLINK, AF_PACKET):
        flt.add_rule(eperm, "socket", sc.Arg(0, sc.EQ, family))
        flt.add_rule(eperm, "socketpair", sc.Arg(0, sc.EQ, family))
    for sock_type in (SOCK_RAW, SOCK_PACKET):
        flt.add_rule(eperm, "socket", sc.Arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, sock_type))
    fd = os.memfd_create("agentcredit-seccomp-export", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as fh:
            flt.export_bpf(fh)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    program = b"".join(chunks)
    if not program or len(program) % 8:  # each BPF instruction is 8 bytes
        raise ToolUnavailableError(f"libseccomp exported a malformed filter ({len(program)} bytes)")
    return program


def program_fd() -> int:
    """A fresh descriptor holding the program at offset 0, for one bubblewrap start (the caller closes it)."""
    program = filter_program()
    fd = os.memfd_create("agentcredit-seccomp", os.MFD_CLOEXEC)
    try:
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
