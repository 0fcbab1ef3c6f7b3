"""The one lock of run and study directories: an ``flock`` claim.

A study claims each of its runs and its start; ``agentcredit train`` claims its run directory, so two
invocations (two ``--resume`` of one run, or a study and a user) never write one run.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def claim(path: Path) -> Iterator[bool]:
    """An exclusive claim on a piece of work; yields False when another open claim (any process) holds it.

    ``flock`` on a lock file that is never deleted: the kernel releases it when its holder exits or dies, so
    there is no stale-lock guessing and no window between creating the file and writing its owner. The file
    names the last holder (pid@host) for people; the lock itself is the flock.

    The file is opened without following a symbolic link (a ``.lock`` pointing at another file had that file
    truncated), and a name that is not a plain file of its own (a FIFO, a device, a hard link to
    another file) is refused before anything is written: a ValueError naming it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(_open_lock_file(path), "r+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}@{socket.gethostname()}\n")
            fh.flush()
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _open_lock_file(path: Path) -> int:
    # O_NONBLOCK: opening a FIFO never hangs (it is refused below)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(
                f"{path} is a symbolic link; a lock file is never followed (its target would be overwritten): "
                "remove the link"
            ) from None
        raise
    info = os.fstat(fd)
    problem = (
        "is not a regular file" if not stat.S_ISREG(info.st_mode)
        else f"has {info.st_nlink} links (a hard link to another file)" if info.st_nlink != 1
        else None
    )  # fmt: skip
    if problem is not None:
        os.close(fd)
        raise ValueError(f"{path} {problem}; a lock file must be a plain file of its own: remove it")
    return fd
