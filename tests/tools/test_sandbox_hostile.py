"""The sandbox against hostile programs, in both isolation modes.

Each case must come back within timeout + 1 s with the expected verdict, while the host is unaffected (its
files, its listening socket, this very process) and nothing is left behind: no process of the sandbox uids, no
child of this process, no working directory, no stray file in /tmp. The checks read /proc directly rather than
trusting the module's own bookkeeping.

Verdicts that are ``ok=True`` on purpose (decided in docs/sandbox.md): ``sys.exit(0)`` after printing, a
program that leaves a daemon behind (the daemon is killed, the program itself succeeded), binary garbage on
stdout (decoded with U+FFFD), and writing to the world-writable /tmp (a private tmpfs under bubblewrap, cleaned
up in the fallback).

The fork bomb runs only after a bounded fork loop has shown, in the same mode, that process creation is capped:
an uncontained bomb would freeze the machine and everything else running on it.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field

import pytest

from agentcredit.tools.sandbox import SandboxLimits, SandboxResult, procs, run_python
from agentcredit.tools.sandbox import tool as ps

TEST_UID_BASE, TEST_UID_COUNT = 1_997_000, 16  # a range of its own (see test_sandbox.py)
TIMEOUT = 1.0
SLACK = 1.0  # the brief: every hostile run returns within timeout + 1 s
LEFTOVER_NAME = "agentcredit-sbx-hostile-leftover"


# ---- independent observers of the machine ----------------------------------------------------------------------


def _status_fields(pid: str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
    except OSError:
        return {}


def sandbox_uid_processes() -> list[str]:
    """Every process (zombies included) whose real/effective/saved uid is in the tests' sandbox range."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        info = _status_fields(pid)
        uids = [int(x) for x in info.get("Uid", "").split()[:3]]
        if any(TEST_UID_BASE <= u < TEST_UID_BASE + TEST_UID_COUNT for u in uids):
            found.append(f"{pid} {info.get('Name')} {info.get('State')}")
    return found


def children_of_this_process() -> list[str]:
    me = str(os.getpid())
    return [
        f"{pid} {info.get('Name')} {info.get('State')}"
        for pid in filter(str.isdigit, os.listdir("/proc"))
        if (info := _status_fields(pid)).get("PPid") == me
    ]


# ---- the host's world -------------------------------------------------------------------------------------------


@dataclass
class Host:
    victim_dir: str
    victim: str
    server: socket.socket
    port: int
    tmp_root: str
    ticks: list[int] = field(default_factory=lambda: [0])


@pytest.fixture(scope="module")
def host():
    victim_root = "/var/tmp" if os.path.isdir("/var/tmp") else None
    victim_dir = tempfile.mkdtemp(prefix="agentcredit-victim-", dir=victim_root)
    os.chmod(victim_dir, 0o755)  # readable by everyone, writable by its owner (root) only
    victim = os.path.join(victim_dir, "victim.txt")
    with open(victim, "w") as fh:
        fh.write("keep me")
    os.chmod(victim, 0o644)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))  # the host's loopback only
    server.listen()
    server.setblocking(False)
    tmp_root = tempfile.mkdtemp(prefix="agentcredit-sbx-test-")
    os.chmod(tmp_root, 0o711)
    world = Host(victim_dir, victim, server, server.getsockname()[1], tmp_root)
    stop = threading.Event()

    def tick() -> None:  # a heartbeat: proves this process kept running while the sandbox misbehaved
        while not stop.wait(0.01):
            world.ticks[0] += 1

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    yield world
    stop.set()
    server.close()
    shutil.rmtree(victim_dir, ignore_errors=True)
    shutil.rmtree(tmp_root, ignore_errors=True)


def resolve_mode(isolation: str) -> ps.SandboxMode:
    try:
        return ps.sandbox_mode(isolation)  # type: ignore[arg-type]
    except RuntimeError as exc:
        if isolation == "bwrap":
            pytest.skip(f"bubblewrap does not work here: {exc}")
        for candidate in ("/usr/bin/python3", shutil.which("python3")):
            if candidate and os.path.exists(candidate):
                ps.configure(python=candidate)
                try:
                    return ps.sandbox_mode(isolation)  # type: ignore[arg-type]
                except RuntimeError:
                    continue
        pytest.skip(f"the fallback sandbox cannot run Python here: {exc}")


@pytest.fixture(scope="module", params=["bwrap", "rlimits"])
def isolation(request, host):
    previous = ps.configure(uid_base=TEST_UID_BASE, uid_count=TEST_UID_COUNT, tmp_root=host.tmp_root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resolve_mode(request.param)
        yield request.param
    finally:
        ps.configure(**asdict(previous))


def call_fs_mounts() -> list[str]:
    """Mounts of the test uids' call file systems still in place (see agentcredit/tools/sandbox/callfs.py)."""
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1] for line in fh]
    return [p for p in points if p.startswith(f"{procs.LEASE_DIR}/{str(TEST_UID_BASE)[:4]}")]


def run_hostile(code: str, isolation: str, host: Host, **limits) -> tuple[SandboxResult, float]:
    """Run ``code``; check the timing, the host and that nothing is left behind; return result and seconds."""
    limits.setdefault("timeout", TIMEOUT)
    ticks_before = host.ticks[0]
    start = time.monotonic()
    result = run_python(code, limits=SandboxLimits(**limits), isolation=isolation)
    elapsed = time.monotonic() - start
    assert elapsed <= limits["timeout"] + SLACK, f"took {elapsed:.2f} s"
    assert sandbox_uid_processes() == []
    assert children_of_this_process() == []
    assert call_fs_mounts() == []  # the call's tmpfs (root host, bubblewrap) is detached
    assert os.listdir(host.tmp_root) == []  # the fallback's working directory is gone
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), LEFTOVER_NAME))
    with open(host.victim) as fh:
        assert fh.read() == "keep me"
    assert os.listdir(host.victim_dir) == ["victim.txt"]
    with pytest.raises(BlockingIOError):
        host.server.accept()  # nobody reached the host's loopback
    heartbeat_deadline = time.monotonic() + 1.0  # a loaded machine may not have scheduled the ticker yet
    while host.ticks[0] == ticks_before and time.monotonic() < heartbeat_deadline:
        time.sleep(0.01)
    assert host.ticks[0] > ticks_before, "the host's heartbeat thread stopped"
    return result, elapsed


# ---- the battery ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    code: str  # formatted with the Host's fields
    ok: bool
    kinds: tuple[str, ...] = ()  # acceptable error kinds when not ok
    says: str = ""  # a piece of text the error (or, when ok, the output) must contain


CASES = [
    Case("infinite loop", "while True: pass", False, ("timeout",), "timeout"),
    Case("memory bomb", "x = bytearray(8 * 1024**3)", False, ("memory",), "MemoryError"),
    Case("memory bomb, step by step", "chunks = []\nwhile True: chunks.append(bytearray(50 * 1024**2))",
         False, ("memory", "timeout")),
    Case("100 MB of output", "import sys\nfor _ in range(100): sys.stdout.write('x' * 1024**2)",
         False, ("output",), "output limit"),
    Case("writing outside the temp dir", "open('{victim_dir}/new.txt', 'w').write('pwned')",
         False, ("exception",), "Error"),
    Case("writing into /etc", "open('/etc/agentcredit-pwned', 'w').write('pwned')", False, ("exception",), "Error"),
    Case("deleting files", "import os, shutil\nos.remove('{victim}')", False, ("exception",), "Error"),
    Case("deleting a tree", "import shutil\nshutil.rmtree('{victim_dir}')", False, ("exception",), "Error"),
    Case("network socket to the host", "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)",
         False, ("exception",), "Error"),
    Case("killing the parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
         "os.kill({host_pid}, signal.SIGKILL)", False, ("exception",), "Error"),
    Case("killing its own process group", "import os, signal\nprint('bye', flush=True)\nos.killpg(0, signal.SIGKILL)",
         False, ("crash",), "SIGKILL"),
    Case("sys.exit(3)", "print('bye')\nimport sys\nsys.exit(3)", False, ("exit",), "exit status 3"),
    Case("sys.exit(0) after printing", "print('bye')\nimport sys\nsys.exit(0)", True, (), "bye"),
    Case("os._exit(7)", "print('bye')\nimport os\nos._exit(7)", False, ("exit",), "exit status 7"),
    Case("segfault through ctypes", "import ctypes\nctypes.string_at(0)", False, ("crash",), "SIGSEGV"),
    Case("deep recursion", "def f(n): return f(n + 1)\nf(0)", False, ("exception",), "RecursionError"),
    Case("sleeping daemon (setsid)", "import subprocess\n"
         "subprocess.Popen(['sleep', '300'], start_new_session=True)\nprint('spawned')", True, (), "spawned"),
    Case("double-forked daemon", "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
         "        time.sleep(300)\n    os._exit(0)\nprint('spawned')", True, (), "spawned"),
    Case("daemon that outlives a timeout", "import subprocess, time\n"
         "subprocess.Popen(['sleep', '300'], start_new_session=True)\ntime.sleep(300)", False, ("timeout",)),
    Case("binary garbage on stdout", "import os\nos.write(1, bytes(range(256)) * 64)", True, (), "\ufffd"),
    Case("file in the world-writable /tmp", "open('/tmp/{leftover}', 'w').write('x')\nprint('written')",
         True, (), "written"),
    Case("thread bomb", "import threading, time\nfor _ in range(1000):\n"
         "    threading.Thread(target=time.sleep, args=(300,)).start()", False, ("exception", "timeout")),
    Case("garbage on the control pipe, then search", "import os\nfor fd in range(3, 32):\n    try:\n"
         "        os.write(fd, b'\\xff' * 70000)\n    except OSError:\n        pass\nsearch('x')",
         False, ("exception", "exit"), ""),
    Case("closing every pipe, then search", "import os\nos.closerange(3, 256)\nsearch('x')",
         False, ("exception", "exit"), ""),
    Case("flooding the control pipe", "import os\nfor fd in range(3, 32):\n    try:\n        os.fstat(fd)\n"
         "    except OSError:\n        continue\n    try:\n        for _ in range(2000): os.write(fd, b'\\0' * 65536)\n"
         "    except OSError:\n        pass\nprint('flooded')", True, (), "flooded"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_program(case: Case, isolation, host):
    code = case.code.format(
        victim=host.victim,
        victim_dir=host.victim_dir,
        port=host.port,
        host_pid=os.getpid(),
        leftover=LEFTOVER_NAME,
    )
    result, _ = run_hostile(code, isolation, host)
    assert result.ok is case.ok, result
    if case.ok:
        assert result.error is None and case.says in result.output
        assert "\x00" not in result.output
    else:
        assert result.error_kind in case.kinds, result
        assert case.says in (result.error or ""), result


def test_control_pipe_forgeries_do_not_fool_the_verdict(isolation, host):
    # A forged "exception" report on the control pipe, then a clean exit: the exit status decides.
    code = (
        "import os, json, struct\nmsg = json.dumps({'type': 'exception', 'name': 'X', 'summary': 'forged'}).encode()\n"
        "for fd in range(3, 32):\n    try:\n        os.write(fd, struct.pack('>I', len(msg)) + msg)\n"
        "    except OSError:\n        pass\nprint('fine')"
    )
    result, _ = run_hostile(code, isolation, host)
    assert result.ok and result.output == "fine\n"


def test_bubblewrap_hides_the_host_files(isolation, host):
    if isolation != "bwrap":
        pytest.skip("the fallback sees every world-readable host file (docs/sandbox.md)")
    code = (
        f"import os\nprint(os.path.exists({__file__!r}), os.path.exists('{host.victim}'))\n"
        "print(os.listdir('/home'))\nos.listdir('/')"
    )
    result, _ = run_hostile(code, isolation, host)
    assert result.output.startswith("False False\n")
    # /home holds only the sandbox's own empty working directory (a tmpfs), none of the host's home directories
    assert result.output.splitlines()[1] == "['sandbox']" and "var" not in result.output


def test_bubblewrap_tmp_is_capped(isolation, host):
    if isolation != "bwrap":
        pytest.skip("the fallback's working directory is on the host disk, bounded by the file size limit")
    code = "for i in range(10):\n    open(f'f{i}', 'wb').write(b'x' * 1024**2)"
    result, _ = run_hostile(code, isolation, host, tmp_bytes=4 * 1024**2)
    assert result.error_kind == "exception" and "No space left on device" in result.error


def test_bubblewrap_tmp_inodes_are_capped(isolation, host):
    """Issue 34: 180k empty files in the 64 MiB /tmp cost the host 180 MiB of kernel memory (size= counts bytes)."""
    if isolation != "bwrap" or os.geteuid() != 0:
        pytest.skip("the inode cap is the root host's own tmpfs under bubblewrap (docs/sandbox.md)")
    code = (
        "made = 0\n"
        "for where in ('/tmp', '.', '/dev/shm'):\n"
        "    try:\n"
        "        for i in range(2000):\n"
        "            open(f'{where}/e{i}', 'w').close(); made += 1\n"
        "    except OSError as exc:\n"
        "        print(where, exc.strerror)\n"
        "print(made)"
    )
    result, _ = run_hostile(code, isolation, host, tmp_inodes=300)
    # one budget for the three writable directories: /tmp takes what is left of the 300, the other two get none.
    # "What is left": an interpreter bound from under /tmp (a checkout or venv there, issue 39) has its mount point's
    # parent directories made in this tmpfs, a few inodes (297 from /tmp/nc5/agentcredit/.venv)
    lines = result.output.splitlines()
    assert lines[:3] == [
        "/tmp No space left on device",
        ". No space left on device",
        "/dev/shm No space left on device",
    ], result.output
    assert 290 <= int(lines[3]) <= 300, result.output


def test_bubblewrap_writable_directories_share_one_byte_budget(isolation, host):
    if isolation != "bwrap" or os.geteuid() != 0:
        pytest.skip("one budget needs the root host's own tmpfs under bubblewrap (docs/sandbox.md)")
    code = (
        "for where in ('/tmp', '.', '/dev/shm'):\n"
        "    try:\n"
        "        open(f'{where}/big', 'wb').write(b'x' * 3 * 1024**2); print(where, 'ok')\n"
        "    except OSError as exc:\n"
        "        print(where, exc.strerror)"
    )
    result, _ = run_hostile(code, isolation, host, tmp_bytes=4 * 1024**2)
    assert result.output.splitlines() == [
        "/tmp ok",
        ". No space left on device",
        "/dev/shm No space left on device",
    ]


FORK_LOOP = """
import os, time
forked = failed = 0
for _ in range(200):  # bounded: at most 200 children, each gone within 2 s
    try:
        pid = os.fork()
    except OSError:
        failed += 1
        continue
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    forked += 1
print(forked, failed)
"""


def test_fork_bomb_is_contained(isolation, host):
    # 1. Prove the cap on a bounded loop: with max_processes=8 the interpreter itself is one of the 8.
    result, _ = run_hostile(FORK_LOOP, isolation, host, max_processes=8, timeout=3.0)
    forked, failed = map(int, result.output.split())
    assert (forked, failed) == (7, 193), result
    # 2. Only then the real bombs, Python's and the shell's.
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result, _ = run_hostile(bomb, isolation, host)
    assert result.error_kind == "timeout"
    shell_bomb = (
        "import subprocess, time\nsubprocess.Popen(['/bin/sh', '-c', 'b() { b | b & }; b'])\ntime.sleep(300)"
    )
    result, _ = run_hostile(shell_bomb, isolation, host)
    assert result.error_kind == "timeout"


def test_concurrent_hostile_runs_stay_apart(isolation, host):
    # Two sandboxes at once: one kills every process its uid can reach, the other must not notice.
    with ps.SandboxPool(2, limits=SandboxLimits(timeout=2.0), isolation=isolation) as pool:
        victim = pool.submit("import time\ntime.sleep(0.8)\nprint('survived')")
        time.sleep(0.2)
        killer = pool.submit(
            "import os, signal, time\ntime.sleep(0.1)\nos.kill(-1, signal.SIGKILL)\nprint('x')"
        )
        assert victim.result().output == "survived\n"
        killer.result()
    assert sandbox_uid_processes() == [] and children_of_this_process() == []
