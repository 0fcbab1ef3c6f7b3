"""The program that runs *inside* the sandbox: set up limits, then run one untrusted code block.

The parent never imports this module; it reads this file's source and runs it with ``python -c SOURCE CONFIG``
(see :mod:`agentcredit.tools.sandbox`), so it uses the standard library only and works whatever the
sandbox can see of the host's files. The order of the steps matters:

1. read the code from stdin (then stdin becomes /dev/null, so ``input()`` gets EOF instead of hanging);
2. while still privileged (root): leave the host's network namespace and fork off a supervisor that reaps the
   whole process tree (fallback mode only: bubblewrap's namespaces and init already do both), then drop to the
   dedicated unprivileged uid, *before* any untrusted byte runs. Only a non-root uid makes ``RLIMIT_NPROC``
   bite: the kernel does not enforce it for root;
3. set the rlimits (they are inherited by every process the code starts, and hard limits cannot be raised by an
   unprivileged process);
4. tell the parent "ready" on the control pipe, then run the code Jupyter-style: the value of a final bare
   expression is displayed, an exception prints the last lines of its traceback.

Messages to the parent are frames on the control pipe: a 4-byte big-endian length, then a UTF-8 JSON object.
The code can write garbage on the same pipe; the parent treats everything on it as untrusted.
"""

import ast
import builtins
import ctypes
import errno
import faulthandler
import json
import linecache
import math
import os
import resource
import signal
import struct
import sys
import threading
import traceback
import types

CELL = "<cell>"  # the file name the code's tracebacks show
BOOTSTRAP = "<sandbox>"  # this file's name inside the sandbox (the parent compiles it under this name)
SETUP_FAILED = 125  # exit status when the sandbox could not be set up (before any untrusted code ran)
MAX_RESPONSE_BYTES = 1 << 20  # a search answer larger than this is refused (the parent caps far below)

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PTRACE_DETACH = 17


def _fail_setup(message: str) -> None:
    os.write(2, f"sandbox setup failed: {message}\n".encode())
    os._exit(SETUP_FAILED)


def _read_code() -> str:
    chunks = []
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return b"".join(chunks).decode("utf-8", "replace")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, n: int) -> bytes:
    parts, remaining = [], n
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            raise EOFError
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def _send(fd: int, message: dict) -> None:
    payload = json.dumps(message).encode()
    _write_all(fd, struct.pack(">I", len(payload)) + payload)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _write_proc(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _leave_network() -> str:
    """Fallback mode only: move into an empty network namespace (only a loopback that is down).

    Root can do it directly; an unprivileged user needs a user namespace too, where the kernel allows one.
    Where neither works, socket creation is refused at the Python level, which stops ordinary code but not
    code that makes raw system calls (ctypes): that is why the documentation calls this mode best effort.
    """
    libc = _libc()
    if os.geteuid() == 0:
        if libc.unshare(CLONE_NEWNET) == 0:
            return "namespace"
    else:
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
            try:  # map our own ids so files we create keep a valid owner
                _write_proc("/proc/self/setgroups", "deny")
                _write_proc("/proc/self/uid_map", f"{uid} {uid} 1")
                _write_proc("/proc/self/gid_map", f"{gid} {gid} 1")
            except OSError as exc:
                _fail_setup(f"cannot map ids in the new user namespace: {exc}")
            return "namespace"
    _block_sockets_in_python()
    return "python-level block only"


def _block_sockets_in_python() -> None:
    import socket

    blocked = {socket.AF_INET, socket.AF_INET6} | (
        {socket.AF_PACKET} if hasattr(socket, "AF_PACKET") else set()
    )

    class NoNetworkSocket(socket.socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None and (socket.AF_INET if family == -1 else family) in blocked:
                raise PermissionError(errno.EACCES, "network access is disabled in this sandbox")
            super().__init__(family, type, proto, fileno)

    socket.socket = NoNetworkSocket


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if 0 in os.getresuid() or 0 in os.getresgid():
        _fail_setup("still root after dropping privileges")
    # No way back up through setuid binaries or file capabilities (bubblewrap sets this too).
    if _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail_setup("cannot set no_new_privs")


def _syscall_keyctl(operation: int, arg: int | None) -> None:
    numbers = {"x86_64": 250, "aarch64": 219}  # SYS_keyctl (asm/unistd.h)
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    number = numbers.get(os.uname().machine)
    if number is None:
        _fail_setup(f"keyctl: unknown system call number on {os.uname().machine}")
    value = ctypes.c_char_p(None) if arg is None else ctypes.c_long(arg)
    if libc.syscall(ctypes.c_long(number), ctypes.c_long(operation), value) < 0:
        err = ctypes.get_errno()
        if err != errno.ENOSYS:  # a kernel without keyrings has nothing to share
            _fail_setup(f"keyctl({operation}) failed: {os.strerror(err)}")


def _fresh_keyrings(clear_user_keyrings: bool) -> None:
    """Fallback mode only (bubblewrap's seccomp filter denies keyring calls): keys do not pass between calls.

    Keyrings are not namespaced. A new anonymous session keyring replaces the inherited one, and, with a leased
    uid, that uid's user and user-session keyrings are emptied (as the uid: root may not clear them), so a key
    that the previous call on this uid left there is gone before this call's code runs. Without a
    leased uid the user keyring is the host user's own, and it is left alone.
    """
    _syscall_keyctl(1, None)  # KEYCTL_JOIN_SESSION_KEYRING, NULL: a new anonymous session keyring
    if clear_user_keyrings:
        _syscall_keyctl(7, -4)  # KEYCTL_CLEAR, KEY_SPEC_USER_KEYRING
        _syscall_keyctl(7, -5)  # KEYCTL_CLEAR, KEY_SPEC_USER_SESSION_KEYRING


def _own_process_count() -> int:
    uid, count = str(os.getuid()), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        count += line.split()[1] == uid
                        break
        except OSError:
            continue
    return count


def _set_limits(cfg: dict) -> None:
    def both(which: int, value: int) -> None:
        resource.setrlimit(which, (value, value))

    both(resource.RLIMIT_CORE, 0)  # a segfault must not leave a core file behind
    cpu = int(cfg["cpu_seconds"])
    resource.setrlimit(
        resource.RLIMIT_CPU, (cpu, cpu + 1)
    )  # SIGXCPU at the soft limit, SIGKILL one second later
    both(resource.RLIMIT_AS, int(cfg["memory_bytes"]))
    both(resource.RLIMIT_FSIZE, int(cfg["file_bytes"]))
    both(resource.RLIMIT_NOFILE, int(cfg["open_files"]))
    nproc = int(cfg["max_processes"])
    if not cfg["dedicated_uid"]:
        # RLIMIT_NPROC counts every process (and thread) of the uid on the machine. Without a uid of our own
        # the cap is placed on top of what the user already runs; see docs/sandbox.md for what this implies.
        nproc += _own_process_count()
    both(resource.RLIMIT_NPROC, nproc)


def _die_with_parent() -> None:
    # Set after the uid change: the kernel clears the parent-death signal when credentials change.
    parent = os.getppid()
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(SETUP_FAILED)


def _split_into_supervisor_and_child() -> None:
    """Fallback mode only: fork; the parent stays behind as a tiny init for everything the code starts.

    bubblewrap's PID namespace has an init that reaps every process and kills the rest when the code's main
    process ends. Without it, killed background processes would be reparented to the host's init and stay
    zombies until it reaps them, and a zombie still counts against the uid's RLIMIT_NPROC for the next run. As a
    child subreaper, this supervisor inherits every orphan of the tree, so it can reap them all. Returns in the
    child only; the supervisor exits with the child's status (128 + N for signal N, as bubblewrap reports it).
    """
    libc = _libc()
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _die_with_parent()
    main_pid = os.fork()
    if main_pid == 0:
        return
    while True:
        pid, status = os.waitpid(-1, 0)
        if os.WIFSTOPPED(status):
            # Only a tracee reports a stop here: the code made this supervisor its tracer (PTRACE_TRACEME, which
            # the fallback has no filter against). Let it go on untraced, with the signal that stopped it.
            libc.ptrace(PTRACE_DETACH, pid, None, ctypes.c_void_p(os.WSTOPSIG(status)))
            continue
        if pid == main_pid:
            break
    me = os.getpid()
    while True:  # kill what the code left behind; orphans of killed processes come to us and go next round
        for child in _children_of(me):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status))


def _children_of(parent: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                for line in fh:
                    if line.startswith("PPid:"):
                        if int(line.split()[1]) == parent:
                            found.append(int(name))
                        break
        except (OSError, ValueError):
            continue
    return found


class _SearchChannel:
    """The child's end of the search pipe pair: one request, one answer, never more than one in flight."""

    def __init__(self, request_fd: int, response_fd: int | None):
        self.request_fd, self.response_fd = request_fd, response_fd
        self.lock = threading.Lock()

    def search(self, query: str, k: int) -> str:
        if self.response_fd is None:
            raise RuntimeError("search() is not available here: no search index was given to this sandbox")
        with self.lock:
            try:
                _send(self.request_fd, {"type": "search", "query": query, "k": k})
                (size,) = struct.unpack(">I", _read_exact(self.response_fd, 4))
                if size > MAX_RESPONSE_BYTES:
                    raise RuntimeError("search() failed: the answer from the parent was too large")
                answer = json.loads(_read_exact(self.response_fd, size))
            except (OSError, EOFError, ValueError) as exc:
                raise RuntimeError(
                    f"search() failed: the channel to the search index is closed ({exc!r})"
                ) from None
        if answer.get("ok"):
            return str(answer.get("result", ""))
        raise RuntimeError(str(answer.get("error", "search() failed")))


def _make_search(channel: _SearchChannel):
    def search(query: str, k: int = 3) -> str:
        """BM25 over the task's passage corpus; returns the top-k passages as 'Doc 1 (Title: ...) ...' text.

        When ``search(...)`` is the last expression of the block, its text is displayed (Jupyter-style).
        """
        if not isinstance(query, str):
            raise TypeError(f"search() query must be a string, got {type(query).__name__}")
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"search() k must be an int, got {type(k).__name__}")
        return channel.search(query, k)

    return search


def _without_bootstrap(te: traceback.TracebackException, seen: set[int]) -> None:
    """Keep only the code's frames in ``te`` and its chained exceptions: from its first ``<cell>`` frame on,
    without this bootstrap's (exec, search plumbing). A syntax error has no cell frame: only its message stays."""
    if id(te) in seen:
        return
    seen.add(id(te))
    frames = [f for f in te.stack if f.filename != BOOTSTRAP]
    first = next((i for i, f in enumerate(frames) if f.filename == CELL), len(frames))
    te.stack = traceback.StackSummary.from_list(frames[first:])
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _without_bootstrap(chained, seen)


def _traceback_tail(exc: BaseException, max_lines: int) -> str:
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    _without_bootstrap(te, set())
    lines = "".join(te.format()).rstrip("\n").split("\n")
    if len(lines) > max_lines:
        lines = [f"[traceback cut to its last {max_lines} lines]"] + lines[-max_lines:]
    return "\n".join(lines) + "\n"


def _display(value: object) -> None:
    # Jupyter shows repr(); a string (such as search()'s passages) is printed as text so the model reads the
    # passages themselves, not a quoted literal full of \n escapes.
    if value is not None:
        print(value if isinstance(value, str) else repr(value))


def _run_cell(code: str, namespace: dict, control_fd: int, traceback_lines: int) -> int:
    linecache.cache[CELL] = (len(code), None, code.splitlines(True), CELL)
    try:
        tree = ast.parse(code, CELL, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, CELL, "exec"), namespace)
        if last is not None:
            _display(eval(compile(last, CELL, "eval"), namespace))
        return 0
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - report every failure of the untrusted code as its traceback
        try:
            sys.stdout.flush()
            sys.stderr.write(_traceback_tail(exc, traceback_lines))
            sys.stderr.flush()
            summary = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            _send(control_fd, {"type": "exception", "name": type(exc).__name__, "summary": summary[:500]})
        except BaseException:  # noqa: BLE001 - the code may have closed the pipe or exhausted memory
            pass
        return 1


def main() -> None:
    cfg = json.loads(sys.argv[1])
    code = _read_code()
    network = "namespace (bubblewrap)"
    if cfg["leave_network"]:
        network = _leave_network()
    if cfg["supervise"]:
        _split_into_supervisor_and_child()
    if cfg["uid"] is not None:
        _drop_privileges(cfg["uid"], cfg["gid"])
    if cfg["supervise"]:
        _die_with_parent()
    if cfg["own_keyrings"]:
        _fresh_keyrings(clear_user_keyrings=cfg["dedicated_uid"])
    try:
        _set_limits(cfg)
        os.chdir(cfg["cwd"])
    except (OSError, ValueError) as exc:
        _fail_setup(f"{type(exc).__name__}: {exc}")
    os.umask(0o077)
    faulthandler.enable()  # a segfault prints where it happened before the process dies
    control_fd = cfg["control_fd"]
    _send(control_fd, {"type": "ready", "network": network, "uid": os.getuid()})

    module = types.ModuleType("__main__")  # a clean namespace: the bootstrap's names stay out of reach
    module.__dict__.update(
        {
            "__builtins__": builtins,
            "math": math,
            "search": _make_search(_SearchChannel(control_fd, cfg["response_fd"])),
        }
    )
    sys.modules["__main__"] = module
    sys.argv = [""]
    status = _run_cell(code, module.__dict__, control_fd, cfg["traceback_lines"])
    sys.stdout.flush()
    sys.exit(status)


if __name__ == "__main__":
    main()
