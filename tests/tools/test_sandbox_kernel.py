"""The sandbox's kernel surface (issue 34, "Sandbox (high)"): keyrings and the seccomp filter.

Every probe is a raw system call made with ctypes from inside the sandbox, as an attacker would make it. The
fallback (``rlimits``) has no filter, so the same probes there are the control: they show that a probe *can*
succeed on this kernel, so an ``EPERM`` under bubblewrap comes from the filter and not from the probe itself.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest

from agentcredit.tools.base import ToolUnavailableError
from agentcredit.tools.sandbox import SandboxLimits, callfs, keyrings, run_python, seccomp
from agentcredit.tools.sandbox import tool as ps
from agentcredit.tools.sandbox.config import SandboxSettings
from agentcredit.tools.sandbox.session import _bwrap_argv, bwrap_supports

TEST_UID_BASE = 1_998_000  # a range of its own (see test_sandbox.py)
LIMITS = SandboxLimits(timeout=10.0)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _add_key(description: bytes, payload: bytes, keyring: int) -> int:
    key = _libc.syscall(ctypes.c_long(248), b"user", description, payload, ctypes.c_long(len(payload)),
                        ctypes.c_long(keyring))  # fmt: skip
    assert key > 0, os.strerror(ctypes.get_errno())
    return key


def _configure(isolation: str, tmp_root: str, uid_count: int) -> None:
    ps.configure(uid_base=TEST_UID_BASE, uid_count=uid_count, tmp_root=tmp_root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ps.sandbox_mode(isolation)  # type: ignore[arg-type]
        return
    except RuntimeError as exc:
        if isolation == "bwrap":
            pytest.skip(f"bubblewrap does not work here: {exc}")
        if not os.path.exists("/usr/bin/python3"):
            pytest.skip(f"the fallback cannot run Python here: {exc}")
    ps.configure(python="/usr/bin/python3")  # a pyenv under a 0700 /root is unreadable to the sandbox uid
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ps.sandbox_mode(isolation)  # type: ignore[arg-type]


@pytest.fixture(params=["bwrap", "rlimits"])
def one_uid(request):
    """Each mode with a single sandbox uid, so consecutive calls run as the same uid (the worst case for leaks)."""
    if os.geteuid() != 0:
        pytest.skip("a leased uid needs a root host")
    root = tempfile.mkdtemp(prefix="agentcredit-sbx-kernel-")
    os.chmod(root, 0o711)
    previous = ps.configure()
    try:
        _configure(request.param, root, uid_count=1)
        yield request.param
    finally:
        ps.configure(**asdict(previous))
        shutil.rmtree(root, ignore_errors=True)


def _syscalls(names: dict[str, str]) -> str:
    """Sandbox code that makes each raw call and prints a JSON object {name: 'ok' or the errno's name}."""
    body = "\n".join(f"out[{k!r}] = sc({v})" for k, v in names.items())
    return (
        "import ctypes, errno, json\n"
        "libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long\n"
        "buf = ctypes.create_string_buffer(256)\n"
        "def sc(*a):\n"
        "    r = libc.syscall(*[ctypes.c_long(x) if isinstance(x, int) else x for x in a])\n"
        "    return 'ok' if r >= 0 else errno.errorcode[ctypes.get_errno()]\n"
        f"out = {{}}\n{body}\nprint(json.dumps(out))\n"
    )


def _probe(isolation: str, names: dict[str, str]) -> dict[str, str]:
    result = run_python(_syscalls(names), limits=LIMITS, isolation=isolation)
    assert result.ok, (result.error, result.output)
    return json.loads(result.output)


# ---- keyrings (item 1) ------------------------------------------------------------------------------------------


def test_host_session_key_is_out_of_reach(one_uid):
    """The issue: code in the sandbox read a key the host had put in its session keyring (by possession)."""
    outcome: dict[str, object] = {}

    def host_thread() -> None:  # a thread of its own, so the test process's real session keyring is untouched
        keyrings.join_new_session_keyring()
        key = _add_key(b"agentcredit-host-secret", b"s3cret", keyrings.KEY_SPEC_SESSION_KEYRING)
        outcome["found_by_host"] = keyrings.keyctl(
            keyrings.KEYCTL_SEARCH, keyrings.KEY_SPEC_SESSION_KEYRING, b"user", b"agentcredit-host-secret", 0
        )
        outcome["sandbox"] = _probe(one_uid, {
            "search": "250, 10, -3, b'user', b'agentcredit-host-secret', 0",  # KEYCTL_SEARCH the session keyring
            "read": f"250, 11, {key}, buf, 256",  # KEYCTL_READ by serial number
        })  # fmt: skip
        outcome["key"] = key

    keyrings.in_fresh_session_keyring(host_thread)
    assert outcome["found_by_host"] == outcome["key"]  # the key is there for the host
    sandbox = outcome["sandbox"]
    if one_uid == "bwrap":
        assert sandbox == {"search": "EPERM", "read": "EPERM"}  # the seccomp filter
    else:
        assert sandbox["search"] == "ENOKEY" and sandbox["read"] in (
            "EACCES",
            "ENOKEY",
        )  # a keyring of its own


def test_key_left_in_the_user_keyring_is_gone_for_the_next_call(one_uid):
    """The issue: keys left in the sandbox uid's user keyring by one call were visible to the next."""
    names = {
        "add": "248, b'user', b'agentcredit-left-behind', b'data', 4, -4"
    }  # add_key to KEY_SPEC_USER_KEYRING
    first = _probe(one_uid, names)
    second = _probe(one_uid, {"search": "250, 10, -4, b'user', b'agentcredit-left-behind', 0"})
    if one_uid == "bwrap":
        assert first == {"add": "EPERM"} and second == {"search": "EPERM"}
    else:
        assert first == {"add": "ok"}  # the control: the fallback can store a key ...
        assert second == {"search": "ENOKEY"}  # ... and the next call on the same uid finds it cleared


def test_fresh_session_keyring_layer_hides_the_host_keyring():
    """The host-side layer on its own, without any sandbox: a plain child started inside it has another keyring."""
    child = (
        "import ctypes, errno; libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long\n"
        "r = libc.syscall(ctypes.c_long(250), ctypes.c_long(10), ctypes.c_long(-3), b'user', "
        "b'agentcredit-layer-secret', ctypes.c_long(0))\n"
        "print('found' if r > 0 else errno.errorcode[ctypes.get_errno()])"
    )
    seen: dict[str, str] = {}

    def host_thread() -> None:
        keyrings.join_new_session_keyring()
        _add_key(b"agentcredit-layer-secret", b"x", keyrings.KEY_SPEC_SESSION_KEYRING)

        def run() -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)

        seen["outside"] = run().stdout.strip()
        seen["inside"] = keyrings.in_fresh_session_keyring(run).stdout.strip()

    keyrings.in_fresh_session_keyring(host_thread)
    assert seen["outside"] == "found"  # a child inherits the session keyring, key and all
    assert seen["inside"] == "ENOKEY"


def test_layer_returns_the_value_and_raises_the_error_of_its_function():
    assert keyrings.in_fresh_session_keyring(lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        keyrings.in_fresh_session_keyring(lambda: 1 / 0)


# ---- the seccomp filter (item 2) --------------------------------------------------------------------------------

ATTACKS = {
    "unshare_user": "272, 0x10000000",  # unshare(CLONE_NEWUSER): uid 0 with every capability, in the issue
    "unshare_user_mount": "272, 0x10000000 | 0x20000",  # ... with a mount namespace, to mount a tmpfs
    "clone_newuser": "56, 0x10000000 | 17, 0, 0, 0, 0",  # clone(CLONE_NEWUSER | SIGCHLD)
    "mount": "165, b'none', b'/tmp', b'tmpfs', 0, 0",
    "packet": "41, 17, 3, 0",  # socket(AF_PACKET, SOCK_RAW, 0)
    "netlink_netfilter": "41, 16, 3, 12",  # socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER)
    "raw_inet": "41, 2, 3, 1",  # socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)
    "io_uring_setup": "425, 1, buf",
    "keyctl": "250, 0, -3, 0",  # KEYCTL_GET_KEYRING_ID
    "bpf": "321, 0, buf, 72",  # BPF_MAP_CREATE
    "perf_event_open": "298, buf, 0, -1, -1, 0",
    "ptrace": "101, 0, 0, 0, 0",  # PTRACE_TRACEME (in a forked child: see _ptrace_in_child)
}


def test_the_kernel_surface_is_closed_under_bwrap(one_uid):
    if one_uid != "bwrap":
        pytest.skip("the seccomp filter is bubblewrap's (the fallback is documented as unsafe)")
    got = _probe("bwrap", {k: v for k, v in ATTACKS.items() if k != "ptrace"})
    expected = {name: "EPERM" for name in ATTACKS if name != "ptrace"} | {"io_uring_setup": "ENOSYS"}
    assert got == expected


def test_the_probes_can_succeed_without_the_filter(one_uid):
    """The control: in the fallback (no filter, same kernel) the probes that need no privilege get through."""
    if one_uid != "rlimits":
        pytest.skip("the control runs in the unfiltered fallback")
    got = _probe("rlimits", {k: ATTACKS[k] for k in ("netlink_netfilter", "keyctl", "unshare_user")})
    assert got["netlink_netfilter"] == "ok" and got["keyctl"] == "ok"
    if Path("/proc/sys/user/max_user_namespaces").read_text().strip() != "0":
        assert got["unshare_user"] == "ok"


# ---- socket families, personality and memfd_secret (issue 52) ---------------------------------------------------

# AF_VSOCK reached the hypervisor side of the VM (a network namespace does not cover it) and AF_ALG is Docker's
# 2026 addition; the filter now allows only the families ordinary code needs: AF_UNIX, AF_INET, AF_INET6.
FAMILIES = {
    "vsock": "41, 40, 1, 0",  # socket(AF_VSOCK, SOCK_STREAM, 0): bound a port the host then could not bind
    "alg": "41, 38, 5, 0",  # socket(AF_ALG, SOCK_SEQPACKET, 0)
    "vsock_high_bits": "41, (1 << 32) | 40, 1, 0",  # the kernel reads an int: the high half is dropped
    "tipc": "41, 30, 5, 0",  # AF_TIPC, one of the families Docker allows
    "socketpair_tipc": "53, 30, 5, 0, buf",
    "personality_no_aslr": "135, 0x0040000",  # ADDR_NO_RANDOMIZE
    "personality_exec": "135, 0x0400000",  # READ_IMPLIES_EXEC
    "personality_high_bits": "135, (1 << 32) | 0x0040000",
    "memfd_secret": "447, 0",
}
ALLOWED = {
    "unix": "41, 1, 1, 0",
    "inet": "41, 2, 1, 0",
    "inet6": "41, 10, 2, 0",
    "personality_query": "135, 0xffffffff",  # what Docker allows: the query, PER_LINUX, PER_LINUX32, UNAME26
    "personality_linux32": "135, 8",
    "personality_uname26": "135, 0x0020000",
    "personality_linux": "135, 0",
}


def test_other_socket_families_personality_and_memfd_secret_are_denied(one_uid):
    got = _probe(one_uid, FAMILIES | ALLOWED)
    allowed = {name: got.pop(name) for name in ALLOWED}
    assert allowed == dict.fromkeys(ALLOWED, "ok")
    if one_uid == "bwrap":
        assert got == dict.fromkeys(FAMILIES, "EPERM") | {"memfd_secret": "ENOSYS"}
    else:  # the control: without the filter the kernel hands out what it has (here vsock; AF_ALG and TIPC
        # are not built into the development machine's kernel) and reads only an int's low half
        assert (
            got["vsock_high_bits"] == got["vsock"] == ("ok" if os.path.exists("/dev/vsock") else got["vsock"])
        )
        assert got["personality_no_aslr"] == got["personality_high_bits"] == "ok"


def _cube_denies(value: int) -> bool:
    return any(value & mask == bits for mask, bits in seccomp.PERSONALITY_DENIED)


def test_personality_rules_deny_exactly_what_docker_does_not_allow():
    # Docker allows personality(x) for x in {0, PER_LINUX32, UNAME26, UNAME26 | PER_LINUX32, 0xffffffff}: with
    # one comparison per rule that is 32 masked rules (seccomp.py says how); checked on every one-bit and
    # two-bit value, the allowed ones and their neighbours
    allowed = {0, 8, 0x20000, 0x20008, 0xFFFFFFFF}
    values = {1 << i for i in range(32)} | {(1 << i) | (1 << j) for i in range(32) for j in range(i)}
    values |= {v ^ (1 << i) for v in allowed for i in range(32)} | allowed | {0xFFFFFFFE, 0x7FFFFFFF}
    for value in values:
        assert _cube_denies(value) == (value not in allowed), hex(value)
        assert _cube_denies(value | (0xABCD << 32)) == (
            value not in allowed
        )  # the kernel drops the high half


# ---- memory that RLIMIT_AS does not see (issue 52) ---------------------------------------------------------------

# One process capped at 512 MiB held 1.5 GiB through memfd and, separately, through shmget: pages in no address
# space. Under bubblewrap both are absent now (with SysV message queues and semaphores), and POSIX shared memory
# is a file of the call's capped tmpfs. The fallback has no filter: there the same program holds them (control).
_MEMORY_KINDS = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
libc.shmat.restype = ctypes.c_void_p
MiB, N = 1 << 20, {n}
out = {{}}
def fill(fd, n=N):
    done = 0
    try:
        for _ in range(n):
            os.write(fd, b'x' * MiB); done += 1
    except OSError as exc:
        return f'{{done}} MiB, then {{errno.errorcode[exc.errno]}}'
    return f'{{done}} MiB'
try:  # 16 MiB per memfd, as RLIMIT_FSIZE (file_bytes) caps each one: what one call holds is their sum
    out['memfd'] = [fill(os.memfd_create('fill'), 16) for _ in range(N // 16)][-1] and f'{{N}} MiB'
except OSError as exc:
    out['memfd'] = errno.errorcode[exc.errno]
segments = []
for _ in range(N // 32):  # 32 MiB at a time: each attach counts against RLIMIT_AS only while attached
    shmid = libc.syscall(29, 0, 32 * MiB, 0o1600)  # shmget(IPC_PRIVATE, 32 MiB, IPC_CREAT | 0600)
    if shmid < 0:
        out['shmget'] = errno.errorcode[ctypes.get_errno()]
        break
    segments.append(shmid)
    at = libc.shmat(shmid, None, 0); ctypes.memset(at, 1, 32 * MiB); libc.shmdt(ctypes.c_void_p(at))
else:
    out['shmget'] = f'{{32 * len(segments)}} MiB'  # detached: in no address space, held until removed
for name, nr, args in (('msgget', 68, (0, 0o1600)), ('semget', 64, (0, 8, 0o1600))):
    r = libc.syscall(nr, *args)
    out[name] = 'ok' if r >= 0 else errno.errorcode[ctypes.get_errno()]
if {posix}:
    out['posix_shm'] = fill(os.open('/dev/shm/fill', os.O_CREAT | os.O_RDWR, 0o600))
print(json.dumps(out), flush=True)
for shmid in segments:
    libc.syscall(31, shmid, 0, None)  # shmctl(IPC_RMID): the control's segments must not outlive the test
"""


def _shmem_kib() -> int:
    return int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("Shmem:")))


def test_memfd_and_sysv_memory_are_absent_and_posix_shm_is_the_capped_tmpfs(one_uid):
    mib = 2**20  # file_bytes past tmp_bytes, so the tmpfs is what stops /dev/shm
    limits = SandboxLimits(timeout=30.0, memory_bytes=256 * mib, tmp_bytes=16 * mib, file_bytes=64 * mib)
    before = _shmem_kib()
    code = _MEMORY_KINDS.format(n=320, posix=one_uid == "bwrap")  # 320 MiB: past memory_bytes
    result = run_python(code, limits=limits, isolation=one_uid)
    assert result.ok, (result.error, result.output)
    got = json.loads(result.output)
    if one_uid == "bwrap":
        assert got == {"memfd": "ENOSYS", "shmget": "ENOSYS", "msgget": "ENOSYS", "semget": "ENOSYS",
                       "posix_shm": got["posix_shm"]}  # fmt: skip
        written, _, error = got["posix_shm"].partition(" MiB, then ")
        assert int(written) <= 16 and error == "ENOSPC"  # the call's tmpfs, tmp_bytes for all of it
    else:  # the control: 320 MiB each, past the 256 MiB address-space cap, in a process that has neither mapped
        assert got == {"memfd": "320 MiB", "shmget": "320 MiB", "msgget": "ok", "semget": "ok"}
    assert _shmem_kib() - before < 16 * 1024  # the host's shared memory is back (other jobs move it a little)


_PTRACE = """import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    rc = libc.syscall(ctypes.c_long(101), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
    os.write(w, b'ok' if rc == 0 else errno.errorcode[ctypes.get_errno()].encode())
    os._exit(0)
os.close(w)
print(os.read(r, 16).decode())
os.kill(pid, 9)
_ = os.waitpid(pid, 0)
"""


def test_ptrace_is_denied_under_bwrap(one_uid):
    result = run_python(_PTRACE, limits=LIMITS, isolation=one_uid)
    assert result.ok, (result.error, result.output)
    assert result.output == ("EPERM\n" if one_uid == "bwrap" else "ok\n")  # the fallback is the control


_OTHER_ABI = {
    # x32: the x86_64 number with __X32_SYSCALL_BIT set
    "x32": "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall(ctypes.c_long(0x40000000 | 250), ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(0))\n",
    # i386 through int 0x80: mov eax, 20 (getpid); int 0x80; ret, run from an executable page
    "i386": "import ctypes, mmap\n"
    "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
    "m.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))\n"
    "ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))()\n",
}


@pytest.mark.parametrize("abi", sorted(_OTHER_ABI))
def test_other_architectures_system_calls_kill_the_process(one_uid, abi):
    """A deny-list filter is bypassed by the x32 or i386 number of a call unless such calls are refused."""
    if one_uid != "bwrap" or os.uname().machine != "x86_64":
        pytest.skip("the seccomp filter is bubblewrap's; the probes are x86_64 machine code")
    result = run_python(_OTHER_ABI[abi] + "print('not killed')", limits=LIMITS, isolation="bwrap")
    assert result.error_kind == "crash" and "SIGSYS" in result.error and "not killed" not in result.output
    code = _OTHER_ABI[abi] + "print('not killed')"
    control = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert control.stdout == "not killed\n", (
        control.stderr
    )  # on the host, without the filter, the call returns


def test_ordinary_python_still_works_under_the_filter(one_uid):
    code = (
        "import json, os, subprocess, sys, threading, tempfile, mmap, socket, multiprocessing.pool\n"
        "out = {'math': math.sqrt(16)}\n"
        "t = []; th = threading.Thread(target=lambda: t.append(1)); th.start(); th.join(); out['thread'] = t\n"
        "out['subprocess'] = subprocess.run([sys.executable, '-c', 'print(6*7)'], capture_output=True,"
        " text=True).stdout.strip()\n"
        "with open('/tmp/f.txt', 'w') as fh: fh.write('x')\n"
        "out['tmp_file'] = open('/tmp/f.txt').read()\n"
        "with tempfile.TemporaryDirectory() as d: out['tempdir'] = os.path.isdir(d)\n"
        "pid = os.fork()\n"
        "if pid == 0: os._exit(3)\n"
        "out['fork'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        "m = mmap.mmap(-1, 4096); m[:2] = b'ok'; out['mmap'] = m[:2].decode()\n"
        "a, b = socket.socketpair(); a.send(b'hi'); out['socketpair'] = b.recv(2).decode()\n"
        "with multiprocessing.pool.ThreadPool(2) as pool: out['pool'] = pool.map(abs, [-1, -2])\n"
        "print(json.dumps(out))"
    )
    result = run_python(code, limits=LIMITS, isolation=one_uid)
    assert result.ok, (result.error, result.output)
    assert json.loads(result.output) == {
        "math": 4.0, "thread": [1], "subprocess": "42", "tmp_file": "x", "tempdir": True, "fork": 3,
        "mmap": "ok", "socketpair": "hi", "pool": [1, 2],
    }  # fmt: skip


def test_filter_program_is_a_bpf_array_built_once():
    program = seccomp.filter_program()
    assert program and len(program) % 8 == 0  # struct sock_filter is 8 bytes
    assert seccomp.filter_program() is program  # compiled once per process
    fd = seccomp.program_fd()
    try:
        assert os.read(fd, len(program) + 1) == program  # handed to bubblewrap from offset 0
    finally:
        os.close(fd)


def test_bwrap_gets_the_filter_and_disables_user_namespaces_where_it_can():
    settings = SandboxSettings(python="/usr/bin/python3")
    argv = _bwrap_argv(settings, LIMITS, rootless=False, seccomp_fd=7)
    assert argv[argv.index("--seccomp") + 1] == "7"
    assert argv.index("--seccomp") < argv.index("--")
    # --disable-userns needs --unshare-user, so it is used only rootless; as root the filter's rules do the job
    assert "--disable-userns" not in argv
    bwrap = shutil.which("bwrap")
    if bwrap is not None and bwrap_supports("--disable-userns", bwrap):
        assert "--disable-userns" in _bwrap_argv(settings, LIMITS, rootless=True)


def test_missing_libseccomp_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # as if the binding were not installed
    seccomp.filter_program.cache_clear()
    try:
        with pytest.raises(ToolUnavailableError, match="libseccomp"):
            seccomp.filter_program()
    finally:
        seccomp.filter_program.cache_clear()


# ---- the call's own tmpfs (item 3) ------------------------------------------------------------------------------


def test_call_fs_is_capped_and_a_stale_mount_is_replaced(tmp_path):
    """A host that crashed mid-call leaves its mount; the next lease of the uid mounts a fresh one over nothing."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path = tmp_path / "1998000.fs"
    callfs.mount_call_fs(path, 1024 * 1024, 10 + 4)
    try:
        (path / "tmp" / "left-by-a-crash").write_text("x")
        callfs.mount_call_fs(path, 1024 * 1024, 10 + 4)  # the stale mount is detached first
        assert sorted(os.listdir(path)) == ["home", "shm", "tmp"] and os.listdir(path / "tmp") == []
        assert oct(os.stat(path / "tmp").st_mode & 0o7777) == "0o1777"
        info = os.statvfs(path)
        assert info.f_files == 14 and info.f_blocks * info.f_frsize == 1024 * 1024
        with open("/proc/self/mounts") as fh:
            assert [line for line in fh if f" {path} " in line][0].split()[3].startswith("rw,nosuid,nodev")
    finally:
        callfs.unmount_call_fs(path)
    assert not path.exists() and not os.path.ismount(path)


_TRACEME_THEN_SIGNAL = """import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
signal.signal(signal.SIGUSR1, lambda *_: print('handled'))
rc = libc.syscall(ctypes.c_long(101), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
os.kill(os.getpid(), signal.SIGUSR1)  # a tracee stops here and its tracer decides what happens
print('traced' if rc == 0 else 'refused')
"""


def test_code_that_makes_its_parent_a_tracer_still_gets_a_verdict(one_uid):
    """In the fallback the code's parent is the root supervisor: PTRACE_TRACEME made it the tracer, the next
    signal stopped the code, and the supervisor died on the stop report (``ValueError: process stopped by
    delivery of signal``) instead of reporting the run. It now detaches the tracee and passes the signal on."""
    result = run_python(_TRACEME_THEN_SIGNAL, limits=LIMITS, isolation=one_uid)
    assert result.ok, (result.error, result.output)
    assert result.output == ("handled\nrefused\n" if one_uid == "bwrap" else "handled\ntraced\n")
