"""One sandboxed run, from spawning the process tree to the moment nothing of it is left.

:func:`run_sandboxed` is the whole life of a call: lease a uid, make the working directory, start the child
(bubblewrap or plain), serve its stdin, stdout and control pipe from one ``selectors`` loop with a wall-clock
deadline, kill everything it started, remove what it left, and turn what happened into a
:class:`~agentcredit.tools.sandbox.config.SandboxResult`. The public API is in
:mod:`agentcredit.tools.sandbox`.

Everything that comes from the child is untrusted: the output is capped in memory and in total, the control
pipe is parsed by a bounded reader, and a child that breaks the protocol loses its search channel, not the host.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentcredit.tools.sandbox import callfs, keyrings, procs, seccomp
from agentcredit.tools.sandbox.config import (
    ErrorKind,
    MiB,
    SandboxLimits,
    SandboxMode,
    SandboxResult,
    SandboxSettings,
    SearchFn,
)
from agentcredit.tools.sandbox.framing import FrameReader, OutputCapture, ProtocolError, encode_frame

logger = logging.getLogger("agentcredit.tools.sandbox")

_CHILD_SOURCE = Path(__file__).with_name("child.py").read_text(encoding="utf-8")
# Compiled under the name "<sandbox>" (not "<string>") so tracebacks and faulthandler can tell its frames apart.
_LAUNCHER = "import sys; exec(compile(sys.argv.pop(1), '<sandbox>', 'exec'))"
_MAX_QUERY_CHARS = 4096
_MAX_K = 50
_CONTROL_FRAME_BYTES = 64 * 1024


def run_sandboxed(
    code: str, limits: SandboxLimits, search_fn: SearchFn | None, mode: SandboxMode, settings: SandboxSettings
) -> tuple[SandboxResult, str | None]:
    """Run ``code`` once; returns the result and how the child reported its network isolation (None: no report)."""
    start = time.monotonic()
    code_bytes = code.encode("utf-8", "surrogatepass")
    if len(code_bytes) > limits.max_code_bytes:
        return SandboxResult(
            False, "", f"code is {len(code_bytes)} bytes, more than the {limits.max_code_bytes}-byte limit; not run",
            "input", mode=mode.name,
        ), None  # fmt: skip
    lease = procs.lease_uid(settings.uid_base, settings.uid_count, wait=30.0) if mode.dedicated_uid else None
    workdir: str | None = None
    call_fs: Path | None = None
    try:
        uid = lease.uid if lease else None
        if mode.name == "rlimits":
            workdir = tempfile.mkdtemp(prefix="agentcredit-sbx-", dir=settings.tmp_root)
            if uid is not None:
                os.chown(workdir, uid, uid)
        elif lease is not None:  # root: a tmpfs of the call's own, capped in bytes and inodes (callfs.py)
            call_fs = procs.LEASE_DIR / f"{lease.uid}.fs"
            # + 1 + len(SUBDIRS): the root directory and the three bound directories are inodes too
            callfs.mount_call_fs(call_fs, limits.tmp_bytes, limits.tmp_inodes + 1 + len(callfs.SUBDIRS))
        session = _Session(code_bytes, limits, search_fn, mode, uid, workdir, settings, call_fs)
        # The call's processes inherit a new session keyring, not the host's (keyrings are not namespaced).
        result = keyrings.in_fresh_session_keyring(session.run)
        network = None if session.ready is None else str(session.ready.get("network", "unknown"))
    finally:
        leftovers: list[str] = []
        if lease is not None and mode.name == "rlimits":
            leftovers = procs.remove_files_of_uid(lease.uid, procs.world_writable_roots())
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        if call_fs is not None:
            callfs.unmount_call_fs(call_fs)
        if lease is not None:
            lease.release()
    if leftovers:
        logger.warning("sandbox: could not remove files left by the code: %s", leftovers[:5])
    return replace(result, seconds=time.monotonic() - start), network


def _child_env(home: str, marker: str) -> dict[str, str]:
    """The scrubbed environment: nothing of the host's (no tokens, proxies or paths) gets in."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONHASHSEED": "0",  # same set/dict order every run: reproducible rollouts
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",  # numerical libraries would start a thread per core; threads count as processes
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "TERM": "dumb",
        "AGENTCREDIT_SANDBOX_RUN": marker,  # lets the non-root fallback find the run's processes in /proc
    }


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# The code's working directory (and HOME) under bubblewrap: a tmpfs of its own that is never the parent of a bind.
# /tmp cannot be it: an interpreter or venv that lives under /tmp (a clone in /tmp/nc/...) is bound at its own
# path, so bubblewrap creates its parent directories inside the fresh /tmp, and ``os.listdir('.')`` of a "fresh"
# working directory showed the host's path. The first candidate that holds no bind is used.
_WORKDIR_CANDIDATES = ("/home/sandbox", "/var/sandbox", "/sandbox")
_MOUNTED_DIRS = ("/proc", "/dev", "/tmp", "/dev/shm")  # fresh mounts inside the sandbox (see _bwrap_argv)


def bwrap_workdir(binds: list[str]) -> str:
    """The working directory inside bubblewrap: a candidate that is neither a bind nor above or below one."""
    for candidate in _WORKDIR_CANDIDATES:
        if not any(
            b == candidate or b.startswith(candidate + "/") or candidate.startswith(b + "/") for b in binds
        ):
            return candidate
    raise RuntimeError(
        f"the interpreter's directories {binds} overlap every sandbox working directory {_WORKDIR_CANDIDATES}; "
        "use an interpreter installed elsewhere (configure(python=...))"
    )


def _python_dirs(python: str) -> list[str]:
    """Directories the interpreter needs inside bubblewrap: its install, its venv (site-packages), nothing else."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    else:
        candidates = []
    for path in (python, os.path.realpath(python)):
        candidates.append(str(Path(path).parent.parent))
    chosen: list[str] = []
    for path in sorted({os.path.realpath(p) for p in candidates} | {os.path.abspath(p) for p in candidates}):
        if path in ("/", "") or any(
            path == d or path.startswith(d + "/") for d in _SYSTEM_DIRS + tuple(chosen)
        ):
            continue
        chosen.append(path)
    return chosen


@functools.lru_cache(maxsize=4)
def bwrap_supports(option: str, bwrap: str) -> bool:
    """Whether this bubblewrap knows ``option`` (it lists every option in ``--help``)."""
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return option in done.stdout.split()


def _bwrap_argv(
    settings: SandboxSettings,
    limits: SandboxLimits,
    rootless: bool,
    seccomp_fd: int | None = None,
    call_fs: Path | None = None,
) -> list[str]:
    """bubblewrap's command line. ``call_fs``: the call's own tmpfs (:mod:`.callfs`), whose directories become
    /tmp, /dev/shm and the working directory; None (no root): three ``--tmpfs`` capped in bytes only."""
    bwrap = shutil.which("bwrap") or "bwrap"
    argv = [bwrap, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if rootless:
        argv.append("--unshare-user")  # without root, bubblewrap needs a user namespace for the others
        # bubblewrap >= 0.8 can forbid nested user namespaces itself; it needs --unshare-user, so as root (no user
        # namespace: the code runs as a leased host uid) the seccomp filter's unshare/clone rules do this job.
        if bwrap_supports("--disable-userns", bwrap):
            argv.append("--disable-userns")
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    binds = _python_dirs(settings.python)
    workdir = bwrap_workdir(binds)
    if Path(workdir).parent != Path("/"):
        argv += ["--perms", "0755", "--dir", str(Path(workdir).parent)]
    for name, target in zip(callfs.SUBDIRS, ("/tmp", "/dev/shm", workdir), strict=True):
        if call_fs is not None:
            argv += ["--bind", str(call_fs / name), target]
        else:
            argv += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", target]
    # The interpreter's directories come after the fresh mounts above: bubblewrap applies its operations in
    # order, so a tmpfs mounted later would hide a virtualenv or checkout that lives under /tmp (or /dev/shm).
    made = set(_MOUNTED_DIRS) | {workdir, str(Path(workdir).parent)}
    for path in binds:
        # bubblewrap would create the missing parents (/work, /root, ...) with mode 0700, which the sandbox uid
        # cannot cross (a pyenv build under a 0700 /root); create them 0755 first. They are empty: only the
        # bound directory shows inside. Parents that are mounts of their own (/tmp) are left as mounted.
        for parent in reversed(Path(path).parents):
            if str(parent) != "/" and str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", path, path]
    argv += ["--chdir", workdir, "--"]
    return argv


class _Session:
    """One sandboxed process tree, from spawn to the moment nothing of it is left."""

    def __init__(
        self,
        code: bytes,
        limits: SandboxLimits,
        search_fn: SearchFn | None,
        mode: SandboxMode,
        uid: int | None,
        workdir: str | None,
        settings: SandboxSettings,
        call_fs: Path | None = None,
    ):
        self.code, self.limits, self.search_fn, self.mode, self.uid = code, limits, search_fn, mode, uid
        self.workdir, self.settings, self.call_fs = workdir, settings, call_fs
        self.marker = uuid.uuid4().hex
        self.capture = OutputCapture(limits.output_bytes)
        self.reader = FrameReader(max_frame=_CONTROL_FRAME_BYTES)
        self.stop_reason: ErrorKind | None = None
        self.ready: dict[str, Any] | None = None
        self.exception: dict[str, Any] | None = None
        self.search_calls = 0
        self.pending_response = b""
        self.channel_broken: str | None = None

    # ---- spawn -------------------------------------------------------------------------------------------------

    def _sandbox_home(self) -> str:
        """The code's working directory, HOME and TMPDIR, as the code sees it."""
        if self.mode.name == "bwrap":
            return bwrap_workdir(_python_dirs(self.settings.python))
        return str(self.workdir)

    def _command(
        self, control_fd: int, response_fd: int | None, seccomp_fd: int | None
    ) -> tuple[list[str], str]:
        cwd = self._sandbox_home()
        config = {
            "uid": self.uid,
            "gid": self.uid,
            "leave_network": self.mode.name == "rlimits",
            "supervise": self.mode.name == "rlimits",  # bubblewrap has its own init and --die-with-parent
            "own_keyrings": self.mode.name == "rlimits",  # under bubblewrap the seccomp filter denies keyctl
            "cpu_seconds": self.limits.cpu_limit,
            "memory_bytes": self.limits.memory_bytes,
            "file_bytes": self.limits.file_bytes,
            "open_files": self.limits.open_files,
            "max_processes": self.limits.max_processes,
            "dedicated_uid": self.uid is not None,
            "cwd": cwd,
            "control_fd": control_fd,
            "response_fd": response_fd,
            "traceback_lines": self.limits.traceback_lines,
        }
        python = [
            self.settings.python,
            "-s",
            "-P",
            "-B",
            "-u",
            "-c",
            _LAUNCHER,
            _CHILD_SOURCE,
            json.dumps(config),
        ]
        if self.mode.name == "bwrap":
            rootless = os.geteuid() != 0
            argv = _bwrap_argv(self.settings, self.limits, rootless, seccomp_fd, self.call_fs)
            return argv + python, "/"
        return python, cwd

    def run(self) -> SandboxResult:
        control_r, control_w = os.pipe()
        response_r, response_w = os.pipe() if self.search_fn is not None else (None, None)
        child_fds = [control_w] + ([response_r] if response_r is not None else [])
        if self.mode.name == "bwrap":
            try:
                child_fds.append(seccomp.program_fd())  # bubblewrap reads the filter from it, then closes it
            except BaseException:
                for fd in [control_r, response_w, *child_fds]:
                    if fd is not None:
                        os.close(fd)
                raise
        seccomp_fd = child_fds[-1] if self.mode.name == "bwrap" else None
        argv, cwd = self._command(control_w, response_r, seccomp_fd)
        home = self._sandbox_home()
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=_child_env(home, self.marker), cwd=cwd, start_new_session=True, pass_fds=child_fds,
            )  # fmt: skip
        except BaseException:
            for fd in [control_r, response_w, *child_fds]:
                if fd is not None:
                    os.close(fd)
            raise
        for fd in child_fds:
            os.close(fd)
        self.control_r, self.response_w = control_r, response_w
        try:
            self._supervise(proc)
        finally:
            self._terminate(proc)
            self._drain_after_exit(proc)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            for fd in (self.control_r, self.response_w):
                if fd is not None and fd >= 0:
                    os.close(fd)
        return self._result(proc.returncode)

    # ---- the event loop ----------------------------------------------------------------------------------------

    def _supervise(self, proc: subprocess.Popen) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        stdin_fd, stdout_fd = proc.stdin.fileno(), proc.stdout.fileno()
        for fd in (stdin_fd, stdout_fd, self.control_r) + ((self.response_w,) if self.response_w else ()):
            os.set_blocking(fd, False)
        sel = selectors.DefaultSelector()
        pidfd = _pidfd(proc.pid)
        try:
            sel.register(stdout_fd, selectors.EVENT_READ, "out")
            sel.register(self.control_r, selectors.EVENT_READ, "control")
            if pidfd is not None:
                sel.register(pidfd, selectors.EVENT_READ, "exit")
            code_view = memoryview(self.code)
            if code_view:
                sel.register(stdin_fd, selectors.EVENT_WRITE, "in")
            else:
                proc.stdin.close()
            deadline = time.monotonic() + self.limits.timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.stop_reason = "timeout"
                    return
                wait = remaining if pidfd is not None else min(remaining, 0.02)
                for key, _ in sel.select(wait):
                    # A handler earlier in this batch may have closed a pipe (a broken control channel takes
                    # the response pipe with it): events for it are stale.
                    if key.data == "in" and code_view:
                        code_view = self._feed_stdin(sel, proc, code_view)
                    elif key.data == "out":
                        self._read_stdout(sel, stdout_fd)
                    elif key.data == "control" and self.control_r >= 0:
                        deadline += self._read_control(sel)
                    elif key.data == "response" and self.response_w is not None and self.pending_response:
                        self._write_response(sel)
                if self.stop_reason is not None:
                    return
                if proc.poll() is not None:
                    return
        finally:
            sel.close()
            if pidfd is not None:
                os.close(pidfd)

    def _feed_stdin(
        self, sel: selectors.BaseSelector, proc: subprocess.Popen, view: memoryview
    ) -> memoryview:
        assert proc.stdin is not None
        try:
            view = view[os.write(proc.stdin.fileno(), view) :]
        except BlockingIOError:
            return view
        except OSError:  # the child is gone or closed its stdin
            view = view[len(view) :]
        if not view:
            sel.unregister(proc.stdin.fileno())
            try:
                proc.stdin.close()
            except OSError:
                pass
        return view

    def _read_stdout(self, sel: selectors.BaseSelector, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            sel.unregister(fd)  # every writer is gone; the loop still waits for the exit
            return
        self.capture.feed(data)
        if self.capture.total > self.limits.output_kill_bytes:
            self.stop_reason = "output"

    def _read_control(self, sel: selectors.BaseSelector) -> float:
        """Handle what arrived on the control pipe; returns the seconds spent in search_fn (not the code's)."""
        try:
            data = os.read(self.control_r, 1 << 16)
        except BlockingIOError:
            return 0.0
        if not data:  # closed: by the exit, or by the code (the two cannot be told apart without a race)
            sel.unregister(self.control_r)
            return 0.0
        spent = 0.0
        try:
            for message in self.reader.feed(data):
                spent += self._handle_message(sel, message)
        except ProtocolError as exc:
            self._break_channel(sel, str(exc))
            return spent
        if self.reader.error is not None:
            self._break_channel(sel, self.reader.error)
        return spent

    def _handle_message(self, sel: selectors.BaseSelector, message: dict[str, Any]) -> float:
        kind = message.get("type")
        if kind == "ready" and self.ready is None:
            self.ready = message
            return 0.0
        if kind == "exception" and self.exception is None:
            self.exception = message
            return 0.0
        if kind != "search":
            raise ProtocolError(f"unexpected control message type {kind!r}")
        if self.response_w is None:
            raise ProtocolError("search request, but this sandbox has no search index")
        if self.pending_response:
            raise ProtocolError("a second search request before the first answer was read")
        started = time.monotonic()
        answer = self._answer(message)
        self.pending_response = encode_frame(answer)
        sel.register(self.response_w, selectors.EVENT_WRITE, "response")
        return time.monotonic() - started

    def _answer(self, message: dict[str, Any]) -> dict[str, Any]:
        query, k = message.get("query"), message.get("k", 3)
        if not isinstance(query, str) or not query.strip() or len(query) > _MAX_QUERY_CHARS:
            return {
                "ok": False,
                "error": f"search() needs a non-empty query of at most {_MAX_QUERY_CHARS} chars",
            }
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= _MAX_K:
            return {"ok": False, "error": f"search() k must be an int from 1 to {_MAX_K}, got {k!r}"}
        if self.search_calls >= self.limits.max_search_calls:
            return {
                "ok": False,
                "error": f"search() call limit reached ({self.limits.max_search_calls} per run)",
            }
        self.search_calls += 1
        assert self.search_fn is not None
        try:
            text = self.search_fn(query, k)
        except Exception as exc:  # a failing index is reported to the code, not raised in the host
            logger.warning("sandbox: search_fn failed on %r: %s: %s", query, type(exc).__name__, exc)
            return {"ok": False, "error": f"search() failed: {type(exc).__name__}: {exc}"}
        if not isinstance(text, str):
            return {
                "ok": False,
                "error": f"search() failed: the index returned {type(text).__name__}, not text",
            }
        cap = self.limits.search_result_bytes
        if len(text.encode("utf-8", "replace")) > cap:
            text = (
                text.encode("utf-8", "replace")[:cap].decode("utf-8", "ignore")
                + "\n[... search result cut ...]"
            )
        return {"ok": True, "result": text}

    def _write_response(self, sel: selectors.BaseSelector) -> None:
        assert self.response_w is not None
        try:
            written = os.write(self.response_w, self.pending_response)
        except BlockingIOError:
            return
        except OSError as exc:  # the code closed its end
            self._break_channel(sel, f"cannot answer search: {exc}")
            return
        self.pending_response = self.pending_response[written:]
        if not self.pending_response:
            sel.unregister(self.response_w)

    def _break_channel(self, sel: selectors.BaseSelector, why: str) -> None:
        """The code broke the protocol: stop serving it. Its search() calls fail from now on; the run goes on."""
        self.channel_broken = why
        for fd in (self.control_r, self.response_w):
            if fd is not None and fd >= 0:
                try:
                    sel.unregister(fd)
                except (KeyError, ValueError):
                    pass
                os.close(fd)
        self.control_r, self.response_w = -1, None
        self.pending_response = b""

    # ---- the end -----------------------------------------------------------------------------------------------

    def _terminate(self, proc: subprocess.Popen) -> None:
        """Kill every process of the run and wait until none is left (daemons that left the group included)."""
        if self.uid is not None:
            # As the dedicated uid: reaches everything the code started. The tree's own init (bubblewrap's, or
            # the fallback's supervisor) then reaps it all and exits; killing that init first would orphan the
            # tree to the host's init, which may take its time to reap the zombies.
            survivors = procs.reap_uid(self.uid, wait=2.0)
            if survivors:
                logger.error("sandbox: processes of uid %d survived SIGKILL: %s", self.uid, survivors)
        else:
            # Not root, so no uid of its own: kill what carries this run's marker in its environment, except the
            # tree's init (our direct child), which then reaps the rest and exits as above.
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                found = [pid for pid in procs.processes_with_marker(self.marker) if pid != proc.pid]
                if not found:
                    break
                procs.kill_pids(found)
                time.sleep(0.002)
        try:
            # The init exits within milliseconds of the code's processes; longer means they never reached the
            # sandbox uid (a timeout during start-up), so the whole group goes.
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            proc.kill()
            proc.wait()
        if self.uid is not None:
            unreaped = procs.wait_until_released(self.uid, wait=2.0)
            if unreaped:
                logger.error(
                    "sandbox: processes of uid %d were not reaped within 2 s: %s", self.uid, unreaped
                )

    def _drain_after_exit(self, proc: subprocess.Popen) -> None:
        """Read what the (now dead) processes left in the pipes: the end of the output, the exception report."""
        deadline = time.monotonic() + 0.5
        if proc.stdout is not None and self.stop_reason != "output":
            fd = proc.stdout.fileno()
            while self.capture.total <= self.limits.output_kill_bytes and time.monotonic() < deadline:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break  # a writer outside our reach still holds the pipe (non-root fallback only)
                except OSError:
                    break
                if not data:
                    break
                self.capture.feed(data)
        if self.control_r >= 0:
            while time.monotonic() < deadline:
                try:
                    data = os.read(self.control_r, 1 << 16)
                except OSError:
                    break
                if not data:
                    break
                for message in self.reader.feed(data):
                    if message.get("type") == "exception" and self.exception is None:
                        self.exception = message
                    elif message.get("type") == "ready" and self.ready is None:
                        self.ready = message
                if self.reader.error is not None:
                    break

    def _result(self, returncode: int | None) -> SandboxResult:
        ok, error, kind = self._verdict(returncode)
        return SandboxResult(
            ok, self.capture.text(), error, kind, returncode, mode=self.mode.name,
            truncated=self.capture.truncated, search_calls=self.search_calls,
        )  # fmt: skip

    def _verdict(self, rc: int | None) -> tuple[bool, str | None, ErrorKind | None]:
        limits = self.limits
        if self.stop_reason == "timeout":
            return False, f"timeout: still running after {limits.timeout:g} s (wall clock); killed", "timeout"
        if self.stop_reason == "output":
            return False, f"output limit: wrote more than {limits.output_kill_bytes} bytes; killed", "output"
        if rc is None:
            return False, "the sandbox process did not exit", "crash"
        if self.ready is None:
            tail = self.capture.text().strip().splitlines()[-1:] or ["no output"]
            return False, f"sandbox setup failed (exit status {rc}): {tail[0]}", "setup"
        signum = -rc if rc < 0 else None
        if 128 < rc < 128 + 65:
            signum = rc - 128  # bubblewrap and the fallback's supervisor report death by signal N as 128 + N
        if signum is not None:
            return self._signal_verdict(signum)
        if rc == 0:
            return True, None, None
        if rc == 1 and self.exception is not None:
            name, summary = str(self.exception.get("name")), str(self.exception.get("summary"))[:300]
            if name == "MemoryError":
                mib = limits.memory_bytes // MiB
                return False, f"memory limit: {summary} (address space capped at {mib} MiB)", "memory"
            return False, f"exception: {summary}", "exception"
        if self.channel_broken is not None:  # an exception report may have been lost with the pipe
            return False, f"exit status {rc} (the code broke the control pipe: {self.channel_broken})", "exit"
        return False, f"exit status {rc}", "exit"

    def _signal_verdict(self, signum: int) -> tuple[bool, str, ErrorKind]:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        if signum == signal.SIGXCPU:
            return False, f"CPU time limit: used more than {self.limits.cpu_limit} s of CPU ({name})", "cpu"
        if signum == signal.SIGKILL:
            why = "out of memory, the CPU hard limit, or the code killed itself"
            return False, f"killed by {name} ({why})", "crash"
        description = signal.strsignal(signum) or name
        return False, f"crashed: killed by {name} ({description})", "crash"


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernels before 5.3: the loop polls instead
        return None


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
