"""The system-call filter of the bubblewrap sandbox: what Docker's default seccomp profile denies, and more.

Namespaces do not cover the whole kernel. Inside a nested user namespace, code that is an unprivileged uid
outside becomes uid 0 with every capability, and from there it can mount file systems, open packet and netfilter
sockets and set up io_uring: the starting point of most recent container escapes. Docker's default
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
- sockets: only the families ordinary code needs, ``AF_UNIX``, ``AF_INET`` and ``AF_INET6`` (``socket`` and
  ``socketpair``), and no ``SOCK_RAW`` / ``SOCK_PACKET`` type. Docker denies ``AF_ALG`` and ``AF_VSOCK`` and
  relies on dropping ``CAP_NET_RAW`` for the rest; here a netlink socket needs no capability, a network
  namespace does not cover vsock (code could bind a port of the VM's host side), and the other
  families (TIPC, RDS, CAN, ...) are kernel surface nobody's Python needs, so it is an allow-list. The family
  is compared as a 64-bit register while the kernel reads an ``int``, so the rule is "above ``AF_INET6``", which
  also catches a family with junk in the high half (Docker's "below 38 or above 40" lets ``(1 << 32) | 40``
  through: ``AF_VSOCK`` to the kernel);
- ``personality`` only with the values Docker allows (the query, ``PER_LINUX``, ``PER_LINUX32``, ``UNAME26``):
  no ``ADDR_NO_RANDOMIZE`` or ``READ_IMPLIES_EXEC``;
- ``memfd_create``, ``memfd_secret``, ``shmget``, ``msgget``, ``semget`` (``ENOSYS``): Docker allows them, but
  their memory is in no process's address-space limit, so one call could hold memory the sandbox does not
  bound; POSIX shared memory stays, as files of the call's capped ``/dev/shm``;

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
    # keyrings: not namespaced, so a key could pass between the host and a call, or between calls
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
ABSENT: tuple[str, ...] = (
    "io_uring_setup", "io_uring_enter", "io_uring_register", "clone3",
    # memory outside every address-space limit: one process capped at 512 MiB held 1.5 GiB through
    # memfd and as much again through SysV shared memory, pages no RLIMIT_AS counts. Without them a call's
    # memory is its processes' address spaces plus its capped tmpfs (POSIX shared memory is a file there).
    # Docker allows them; ENOSYS reads as a kernel built without memfd / SysV IPC, which libraries handle.
    "memfd_create", "memfd_secret", "shmget", "msgget", "semget",
)  # fmt: skip

# clone flags that make a new namespace: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET.
CLONE_NAMESPACE_FLAGS = 0x7E020000
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10  # the only socket families allowed; every other one is EPERM
SOCK_RAW, SOCK_PACKET, SOCK_TYPE_MASK = 3, 10, 0xF  # the type's low bits; the rest are SOCK_NONBLOCK/CLOEXEC


def _personality_denied() -> tuple[tuple[int, int], ...]:
    """``(mask, value)`` pairs: ``personality(x)`` is denied when ``x & mask == value`` for any of them.

    Docker allows x in {0, PER_LINUX32 (8), UNAME26 (0x20000), both, 0xffffffff (the query)}. A libseccomp rule
    holds one comparison per argument, so the complement is written as masked comparisons on the low 32 bits
    (the kernel reads an ``unsigned int``). Call the 30 bits other than 8 and 0x20000 the "other" bits: the
    allowed values have them all 0 (the first four) or all 1 (the query, where 8 and 0x20000 are set too).
    So x is denied when (a) its other bits are mixed: some other bit is 1 and the next other bit (cyclically)
    is 0, 30 rules; or (b) they are all 1 and 8 or 0x20000 is 0, 2 rules keyed on the lowest other bit.
    """
    others = [1 << i for i in range(32) if (1 << i) not in (0x8, 0x20000)]
    mixed = [(bit | nxt, bit) for bit, nxt in zip(others, others[1:] + others[:1], strict=True)]
    full_but = [(others[0] | flag, others[0]) for flag in (0x8, 0x20000)]
    return tuple(mixed + full_but)


PERSONALITY_DENIED = _personality_denied()


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
    for call in ("socket", "socketpair"):
        flt.add_rule(eperm, call, sc.Arg(0, sc.GT, AF_INET6))  # unsigned: a negative family is above it too
        for family in range(AF_INET6):
            if family not in (AF_UNIX, AF_INET):
                flt.add_rule(eperm, call, sc.Arg(0, sc.EQ, family))
    for mask, value in PERSONALITY_DENIED:
        flt.add_rule(eperm, "personality", sc.Arg(0, sc.MASKED_EQ, mask, value))
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
