"""Host-side process control for the sandbox: dedicated uids, finding and killing every sandbox process.

Why a dedicated uid per running sandbox (only possible when the host runs as root):
- the kernel does not enforce ``RLIMIT_NPROC`` for root, so a fork bomb started by root is unbounded; for an
  ordinary uid it is enforced, and it counts *all* processes of that uid on the machine. A uid that nothing else
  uses makes the cap exactly "processes of this one sandbox";
- ``kill(-1, SIGKILL)`` sent *as that uid* reaches every process of the uid, including daemons that called
  ``setsid`` and left the process group: nothing the code starts can get out of reach;
- every file it leaves in a world-writable directory (fallback mode) is owned by that uid, so it can be found.

Leases are ``flock`` locks on files in a root-owned directory, so concurrent sandboxes in threads of one process
and in different processes on the machine never share a uid. A lock dies with its process, so a crashed host
frees its uids; whatever the crashed host left running is killed when the uid is leased again.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# A fixed place, not $TMPDIR: every process on the machine must see the same leases.
LEASE_DIR = Path("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()) / "agentcredit-sandbox-uids"


@dataclass
class UidLease:
    uid: int
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = -1


def _lease_dir() -> Path:
    LEASE_DIR.mkdir(mode=0o700, exist_ok=True)
    info = LEASE_DIR.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise RuntimeError(
            f"{LEASE_DIR} must be a directory owned by uid {os.geteuid()} and not writable by others; "
            "remove it and try again"
        )
    return LEASE_DIR


def lease_uid(base: int, count: int, wait: float) -> UidLease:
    """Take a free uid in ``[base, base + count)``; waits up to ``wait`` seconds when all are busy."""
    directory = _lease_dir()
    deadline = time.monotonic() + wait
    while True:
        for uid in range(base, base + count):
            if _is_named_user(uid):
                continue  # a real account: its processes and files are not ours to kill or delete
            fd = os.open(directory / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            lease = UidLease(uid, fd)
            if processes_of_uid(uid):  # left over by a host that crashed while it held this uid
                kill_uid(uid)
            return lease
        if time.monotonic() >= deadline:
            raise RuntimeError(f"all {count} sandbox uids from {base} are in use; raise uid_count or wait")
        time.sleep(0.01)


def _is_named_user(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def processes_of_uid(uid: int, zombies: bool = False) -> list[int]:
    """Processes whose real, effective or saved uid is ``uid``, from /proc; zombies only when ``zombies``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                state, uids = "", ()
                for line in fh:
                    if line.startswith("State:"):
                        state = line.split()[1]
                    elif line.startswith("Uid:"):
                        uids = tuple(int(x) for x in line.split()[1:4])
                        break
        except (OSError, ValueError):
            continue  # the process ended while we looked
        if uid in uids and (zombies or state != "Z"):  # a zombie is dead already: a kill cannot reach it
            found.append(int(name))
    return found


def processes_with_marker(marker: str) -> list[int]:
    """Processes of our own uid whose initial environment contains ``marker`` (the non-root fallback)."""
    found, needle, me = [], marker.encode(), os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def kill_uid(uid: int) -> None:
    """Send SIGKILL to every process of ``uid`` with one ``kill(-1)`` made *as* that uid.

    A kill from root would have to list the pids first, and a fork bomb makes new ones while we list. The kernel
    applies ``kill(-1)`` to every process the caller may signal, i.e. every process of the uid, in one call. The
    helper is the shell's built-in ``kill`` (``kill -9 -1`` is its portable spelling; the procps binary rejects
    ``--``), started with the uid already set: subprocess does that in C between fork and exec, which is safe in
    a threaded parent.
    """
    try:
        subprocess.run(
            ["/bin/sh", "-c", "kill -9 -1"], user=uid, group=uid, extra_groups=[], env={}, cwd="/",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=5, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pass  # the /proc check that follows every kill tells whether it worked


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def reap_uid(uid: int, wait: float) -> list[int]:
    """Kill every process of ``uid`` until none is left; returns the pids still alive after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        alive = processes_of_uid(uid)
        if not alive or time.monotonic() >= deadline:
            return alive
        kill_uid(uid)
        time.sleep(0.002)


def wait_until_released(uid: int, wait: float) -> list[int]:
    """Wait until the kernel has released every process of ``uid``, zombies included; returns those left.

    A killed process stays a zombie until its parent reaps it: bubblewrap's outer process returns as soon as the
    code's first process exits, while its init in the pid namespace is still reaping the rest. Zombies count
    against ``RLIMIT_NPROC``, so a uid handed to the next sandbox before they are gone would start it with fewer
    processes than its limit allows.
    """
    deadline = time.monotonic() + wait
    while True:
        left = processes_of_uid(uid, zombies=True)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.002)


def world_writable_roots() -> list[str]:
    roots = {tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"}
    return sorted(r for r in roots if os.path.isdir(r))


def remove_files_of_uid(uid: int, roots: list[str]) -> list[str]:
    """Delete what ``uid`` created in world-writable directories (fallback mode); returns what could not go.

    Only directories the uid can write to can hold its files: world-writable ones (walked recursively, without
    following symlinks) and its own (removed whole). This is a handful of directories, not a crawl of the disk.
    """
    failed: list[str] = []
    pending = list(roots)
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == uid:
                try:
                    if stat.S_ISDIR(info.st_mode):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
                except OSError:
                    failed.append(entry.path)
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH:
                pending.append(entry.path)
    return failed
