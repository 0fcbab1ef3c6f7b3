"""The one lock of run and study directories: an ``flock`` claim (moved here from study.py, which re-exports it).

A study claims each of its runs and its start; ``agentcredit train`` claims its run directory, so two
invocations (two ``--resume`` of one run, or a study and a user) never write one run.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def claim(path: Path) -> Iterator[bool]:
    """An exclusive claim on a piece of work; yields False when another open claim (any process) holds it.

    ``flock`` on a lock file that is never deleted: the kernel releases it when its holder exits or dies, so
    there is no stale-lock guessing and no window between creating the file and writing its owner. The file
    names the last holder (pid@host) for people; the lock itself is the flock.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
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
