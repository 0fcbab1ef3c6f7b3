"""One tmpfs per sandboxed call, capped in bytes *and* inodes, that holds everything the code can write.

bubblewrap's ``--tmpfs`` takes a size (``--size``) but no inode count, and a tmpfs's default inode limit is half
the machine's RAM pages: 180,000 empty files in a 64 MiB ``/tmp`` cost the host 180 MiB of kernel memory,
because ``size=`` counts file bytes only. A host that runs as root mounts the tmpfs itself, with
``size=`` and ``nr_inodes=``, and bubblewrap binds three directories of it into the sandbox: ``/tmp``,
``/dev/shm`` and the working directory. One file system for the three also makes ``tmp_bytes`` and
``tmp_inodes`` one budget for the whole call, not one per mount.

The mount point is ``<lease dir>/<uid>.fs``, next to the uid's lease lock in a root-only directory: the sandbox
never sees that path, and a host that crashed mid-call leaves its mount where the next lease of the uid finds
and detaches it. Without root (no leased uid, no ``mount``) bubblewrap's ``--tmpfs --size`` is used: bytes are
capped per mount, inodes are not (docs/sandbox.md says so).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from agentcredit.tools.base import ToolUnavailableError

MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MNT_DETACH = 0x2
# The three directories bound into the sandbox, by their name in the call's tmpfs.
SUBDIRS = ("tmp", "shm", "home")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount_call_fs(path: Path, size_bytes: int, inodes: int) -> Path:
    """Mount a fresh tmpfs at ``path`` (made if missing; a stale mount there is detached first) with its subdirs."""
    path.mkdir(mode=0o700, exist_ok=True)
    unmount_call_fs(path, remove=False)
    options = f"size={size_bytes},nr_inodes={inodes},mode=0755".encode()
    # nosuid and nodev, as bubblewrap's own tmpfs; exec stays allowed (code may write and run a script).
    try:
        _check(
            _libc.mount(b"tmpfs", bytes(path), b"tmpfs", MS_NOSUID | MS_NODEV, options),
            f"mount tmpfs on {path}",
        )
    except OSError as exc:  # root without CAP_SYS_ADMIN (a container): bubblewrap could not mount either
        raise ToolUnavailableError(
            f"the sandbox cannot mount its call's tmpfs ({exc}); it needs root with CAP_SYS_ADMIN, as bubblewrap does"
        ) from exc
    for name in SUBDIRS:
        sub = path / name
        sub.mkdir()
        os.chmod(sub, 0o1777)  # as /tmp: every uid may write, only the owner may delete
    return path


def unmount_call_fs(path: Path, remove: bool = True) -> None:
    """Detach the tmpfs at ``path`` (if mounted); its memory is freed when the sandbox's namespace is gone too."""
    if os.path.ismount(path):
        _check(_libc.umount2(bytes(path), MNT_DETACH), f"unmount {path}")
    if remove:
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
